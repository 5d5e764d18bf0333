#include "tests/support/process_util.h"

#include <netinet/in.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace parasync::testing {

std::string BinDir() {
  const char* d = std::getenv("PARASYNC_BIN_DIR");
  return d ? d : "bin";
}

std::string DataDir() {
  const char* d = std::getenv("PARASYNC_DATA_DIR");
  return d ? d : "/usr/share/datasets/fashion-mnist";
}

bool DataAvailable() {
  return std::filesystem::exists(DataDir() + "/train-images-idx3-ubyte.gz") ||
         std::filesystem::exists(DataDir() + "/train-images-idx3-ubyte");
}

Child Child::Start(const std::vector<std::string>& argv, const std::string& log_path,
                   const std::vector<std::string>& env) {
  SpawnOptions options;
  options.argv = argv;
  options.env_set = env;
  options.out = StreamTarget::File(log_path, /*append=*/true);
  options.err = StreamTarget::File(log_path, /*append=*/true);
  return Start(std::move(options));
}

Child Child::Start(SpawnOptions options) {
  // A test killed by ctest's timeout runs no destructor: children started by the main thread
  // die with it (PR_SET_PDEATHSIG fires when the starting *thread* ends, so children started
  // from helper threads, which end earlier, are left to the destructors).
  const bool main_thread = getpid() == static_cast<pid_t>(syscall(SYS_gettid));
  options.parent_death_signal = main_thread ? SIGKILL : 0;
  Result<Spawned> spawned = Spawn(options);
  if (!spawned.ok()) {
    std::fprintf(stderr, "cannot start %s: %s\n",
                 options.argv.empty() ? "(no argv)" : options.argv[0].c_str(),
                 spawned.status().ToString().c_str());
    return Child(-1);
  }
  return Child(spawned->pid);
}

Child::Child(Child&& other) noexcept
    : pid_(other.pid_), reaped_(other.reaped_), status_(other.status_) {
  other.pid_ = -1;
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

std::optional<int> Child::Wait(std::chrono::milliseconds timeout) {
  if (reaped_ || pid_ <= 0) return status_;
  status_ = WaitForExit(pid_, timeout);
  if (status_) reaped_ = true;
  return status_;
}

Serving StartServing(const std::vector<std::string>& argv, const std::string& log_path,
                     const std::vector<std::string>& env) {
  const std::string ready_path = log_path + ".ready";
  std::vector<std::string> with_ready = argv;
  with_ready.insert(with_ready.end(), {"--ready-file", ready_path});
  Serving out{Child::Start(with_ready, log_path, env), std::nullopt, ""};
  out.ready = WaitReady(out.child, ready_path, std::chrono::seconds(60), &out.why);
  if (!out.ready) out.why += "\n--- " + log_path + "\n" + ReadFile(log_path);
  return out;
}

std::optional<ReadyInfo> WaitReady(Child& child, const std::string& path,
                                   std::chrono::milliseconds timeout, std::string* why) {
  auto ready = WaitForReadyFile(path, child.pid(), timeout);
  if (ready.ok()) return *ready;
  if (why != nullptr) *why = ready.status().message();
  return std::nullopt;
}

void Child::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

std::vector<std::string> Finished::ErrLines() const {
  std::vector<std::string> lines;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

Finished RunToExit(const std::vector<std::string>& argv, const std::string& dir,
                   std::chrono::milliseconds timeout, const std::vector<std::string>& env) {
  static std::atomic<int> runs{0};
  const std::string stem = dir + "/run" + std::to_string(runs++);
  SpawnOptions options;
  options.argv = argv;
  options.env_set = env;
  options.in = StreamTarget::Null();
  options.out = StreamTarget::File(stem + ".out");
  options.err = StreamTarget::File(stem + ".err");
  // It blocks until the child is gone, so the starting thread outlives it whatever thread it is.
  options.parent_death_signal = SIGKILL;
  Finished finished;
  Result<Spawned> spawned = Spawn(options);
  if (!spawned.ok()) {
    finished.exit_code = 127;
    finished.err = spawned.status().ToString();
    return finished;
  }
  const pid_t pid = spawned->pid;
  if (std::optional<int> status = WaitForExit(pid, timeout)) {
    finished.exit_code = ExitCode(*status);
  } else {
    kill(pid, SIGKILL);
    int killed = 0;
    waitpid(pid, &killed, 0);
  }
  finished.out = ReadFile(stem + ".out");
  finished.err = ReadFile(stem + ".err");
  return finished;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string WaitWhileProgressing(const std::function<bool()>& done,
                                 const std::function<std::optional<int64_t>()>& progress,
                                 std::chrono::milliseconds stall,
                                 std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  std::optional<int64_t> last = progress();
  Clock::time_point moved = Clock::now();
  auto at = [](const std::optional<int64_t>& value) {
    return value ? std::to_string(*value) : std::string("(unreadable)");
  };
  while (!done()) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return "the deadline passed at " + at(last);
    const std::optional<int64_t> current = progress();
    if (current && current != last) {
      last = current;
      moved = now;
    } else if (now - moved >= stall) {
      return "no progress for " +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(stall).count()) +
             " s at " + at(last);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return errno != ESRCH;
  // A zombie still answers kill(); look at its state.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  const auto close_paren = content.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= content.size()) return false;
  if (content[close_paren + 2] != 'Z') return true;
  // The main thread of a killed process can be a zombie while its other threads still exit,
  // holding the process's files (and so its locks: a store's LOCK) until the last one is
  // gone. Dead once it is the only thread left.
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("Threads:")) return std::stoi(line.substr(8)) > 1;
  }
  return false;
}

std::optional<int> ZombieWaitStatus(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  // The command name (field 2) may hold spaces: count the fields after its ')'.
  const auto close_paren = content.rfind(')');
  if (close_paren == std::string::npos) return std::nullopt;
  std::istringstream fields(content.substr(close_paren + 1));
  std::string state;
  fields >> state;  // field 3
  if (state != "Z") return std::nullopt;
  std::string field;
  for (int number = 4; number <= 52; ++number) {
    if (!(fields >> field)) return std::nullopt;
  }
  return std::stoi(field);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> ReadLines(const std::string& path) {
  return NonEmptyLines(ReadFile(path));
}

std::vector<std::string> NonEmptyLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return response;
}

std::string JoinHosts(const std::vector<std::string>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : ",") + h;
  return s;
}


}  // namespace parasync::testing

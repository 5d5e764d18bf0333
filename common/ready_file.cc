#include "common/ready_file.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace parasync {

Status WriteReadyFile(const std::string& path, const ReadyInfo& info) {
  const nlohmann::json j = {{"role", info.role},
                            {"task_index", info.task_index},
                            {"pid", info.pid},
                            {"address", info.address},
                            {"metrics_port", info.metrics_port}};
  return WriteFileAtomically(path, j.dump() + "\n");
}

Status RemoveStaleReadyFile(const std::string& path) {
  if (std::remove(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  return Status::Unavailable("cannot remove the old ready file " + path + ": " +
                             std::strerror(errno));
}

Result<ReadyInfo> ReadReadyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("no ready file " + path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    return Status::Corruption("ready file " + path + ": " + why);
  };
  if (!j.is_object()) return bad("not a JSON object");
  ReadyInfo info;
  const auto read = [&](const char* key, auto* out) {
    const auto it = j.find(key);
    if (it == j.end()) return false;
    using T = std::remove_pointer_t<decltype(out)>;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return false;
    } else if (!it->is_number_integer()) {
      return false;
    }
    *out = it->template get<T>();
    return true;
  };
  if (!read("role", &info.role) || !read("task_index", &info.task_index) ||
      !read("pid", &info.pid) || !read("address", &info.address) ||
      !read("metrics_port", &info.metrics_port)) {
    return bad("role, task_index, pid, address and metrics_port are its fields");
  }
  return info;
}

namespace {

// Whether `pid` has ended: a child (still a zombie: waitid's WNOWAIT leaves it to its parent's
// waitpid) or, for another process, one that no longer exists.
bool Ended(pid_t pid) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0) {
    return info.si_pid == pid;
  }
  return errno == ECHILD && kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

Result<ReadyInfo> WaitForReadyFile(const std::string& path, pid_t pid,
                                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto ready = ReadReadyFile(path);
    if (ready.ok() && ready->pid == pid) return ready;
    if (!ready.ok() && ready.status().code() == StatusCode::kCorruption) return ready.status();
    // The file is written before the process can end: read once more after it has.
    if (Ended(pid)) {
      ready = ReadReadyFile(path);
      if (ready.ok() && ready->pid == pid) return ready;
      return Status::Unavailable("process " + std::to_string(pid) + " ended before writing " +
                                 path);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Unavailable("process " + std::to_string(pid) + " wrote no " + path +
                                 " within " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string AddressOfEndpoint(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  return endpoint.starts_with(kTcp) ? endpoint.substr(kTcp.size()) : endpoint;
}

}  // namespace parasync

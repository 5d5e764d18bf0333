#include "common/process.h"

#include <atomic>
#include <csignal>
#include <malloc.h>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <pthread.h>
#include <thread>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace parasync {

namespace {
std::atomic<int> g_shutdown_signal{0};
std::atomic<bool> g_shutdown{false};

extern "C" void OnShutdownSignal(int sig) {
  g_shutdown_signal.store(sig);
  g_shutdown.store(true);
}
}  // namespace

bool InitLogging(const std::string& role, int index, const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  auto logger = spdlog::stderr_logger_mt(role + std::to_string(index));
  // Under a launcher that prefixes every line with the process's name, the name once.
  const char* prefixed = std::getenv(kLogPrefixedVariable);
  const bool named_by_parent = prefixed != nullptr && std::string_view(prefixed) == "1";
  logger->set_pattern(named_by_parent ? "%Y-%m-%d %H:%M:%S.%e %^%l%$ %v"
                                      : "%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return true;
}

int PrintErrorLine(const char* program, const std::string& line, int code) {
  std::fprintf(stderr, "%s: %s\n", program, line.c_str());
  return code;
}

void InstallShutdownSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t shutdown_signals;
  sigemptyset(&shutdown_signals);
  sigaddset(&shutdown_signals, SIGINT);
  sigaddset(&shutdown_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &shutdown_signals, nullptr);
  // Detached: it blocks in sigwait until the process ends.
  std::thread([shutdown_signals] {
    for (;;) {
      int sig = 0;
      if (sigwait(&shutdown_signals, &sig) == 0) OnShutdownSignal(sig);
    }
  }).detach();
}

bool ShutdownRequested() { return g_shutdown.load(std::memory_order_relaxed); }
void RequestShutdown() { g_shutdown.store(true); }
int ShutdownSignal() { return g_shutdown_signal.load(); }

void KeepFreedMessageBuffers() {
  // Setting either threshold also turns off glibc's dynamic adjustment of both.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace parasync

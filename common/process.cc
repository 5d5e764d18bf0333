#include "common/process.h"

#include <atomic>
#include <csignal>
#include <malloc.h>
#include <cstdio>

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
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
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
  sa.sa_flags = 0;  // no SA_RESTART: blocking waits return so loops can see the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
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

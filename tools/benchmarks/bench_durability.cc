// parasync-bench-durability: what durability costs. Starts a real parasync-ps per mode —
// memory only, periodic snapshots, every-update (WAL synced before each acknowledgement) —
// and times N full-model pushes from one client, interleaving the modes over several
// rounds so that machine noise hits all alike. Prints medians and the ratio to memory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/process.h"
#include "common/ready_file.h"
#include "tools/benchmarks/bench_util.h"
#include "tools/benchmarks/stats.h"
#include "worker/ps_client.h"

namespace {

using Clock = std::chrono::steady_clock;

using parasync::bench::Median;
using parasync::bench::Spawn;

struct Measurements {
  std::vector<double> pushes_per_s;
  std::vector<double> p50_ms;
  std::vector<double> p99_ms;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app{"parasync-bench-durability: push throughput and latency of one parasync-ps in "
               "memory, periodic and every-update durability, measured in the same run."};
  int pushes = 300;
  int64_t elements = 235146;  // the default MLP 784-256-128-10
  int rounds = 5;
  std::string dir = "/tmp/parasync-bench-durability";
  app.add_option("--pushes", pushes, "Pushes per measurement")->check(CLI::Range(10, 1000000));
  app.add_option("--elements", elements, "Model size in float32 elements (one variable)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--rounds", rounds, "Rounds; each measures every mode once")->check(CLI::Range(1, 100));
  app.add_option("--dir", dir, "Scratch directory for the data directories (on the disk to measure)");
  CLI11_PARSE(app, argc, argv);

  const std::string bin = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  struct Mode {
    const char* label;
    std::vector<std::string> flags;
  };
  const std::vector<Mode> modes = {
      {"memory", {}},
      {"periodic 30 s", {"--durability", "periodic", "--checkpoint-every", "30"}},
      {"every-update", {"--durability", "every-update"}}};
  std::vector<Measurements> results(modes.size());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  ModelRegistration reg;
  reg.variables = {{"w", {elements}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = 0.001f;
  reg.num_shards = 1;
  std::vector<float> grad(static_cast<size_t>(elements), 0.5f);
  const float* grads[] = {grad.data()};

  for (int round = 0; round < rounds; ++round) {
    for (size_t m = 0; m < modes.size(); ++m) {
      const std::vector<std::string>& flags = modes[m].flags;
      const std::string ready_file = dir + "/ps.ready";
      std::vector<std::string> ps = {bin + "/parasync-ps", "--ps-hosts", "127.0.0.1:0",
                                     "--worker-hosts", "127.0.0.1:1", "--task-index", "0",
                                     "--log-level", "warn", "--ready-file", ready_file};
      ps.insert(ps.end(), flags.begin(), flags.end());
      if (!flags.empty()) {
        const std::string data = dir + "/r" + std::to_string(round) + "-" + std::to_string(m);
        ps.insert(ps.end(), {"--data-dir", data});
      }
      const pid_t pid = Spawn(ps, dir + "/ps.log");
      auto ready = WaitForReadyFile(ready_file, pid, std::chrono::seconds(60));
      zmq::context_t ctx;
      PsClientOptions o;
      o.ps_addresses = {ready.ok() ? ready->address : "127.0.0.1:1"};
      o.rank = 0;
      auto client = PsClient::Connect(ctx, o);
      if (!ready.ok() || !client.ok() || !(*client)->Register(reg, std::chrono::seconds(20)).ok()) {
        std::fprintf(stderr, "cannot start or reach parasync-ps (%s)\n", (dir + "/ps.log").c_str());
        kill(pid, SIGKILL);
        return 1;
      }
      std::vector<double> latencies;
      const auto t0 = Clock::now();
      for (int i = 0; i < pushes; ++i) {
        const auto a = Clock::now();
        if (Status s = (*client)->Push(grads, 1); !s.ok()) {
          std::fprintf(stderr, "push failed: %s\n", s.ToString().c_str());
          kill(pid, SIGKILL);
          return 1;
        }
        latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      std::sort(latencies.begin(), latencies.end());
      Measurements& r = results[m];
      r.pushes_per_s.push_back(pushes / seconds);
      r.p50_ms.push_back(latencies[latencies.size() / 2]);
      r.p99_ms.push_back(latencies[latencies.size() * 99 / 100]);
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
  const double base = Median(results[0].pushes_per_s);
  std::printf("pushes of %lld float32 (%.2f MB), %d per run, medians of %d rounds\n\n",
              static_cast<long long>(elements), static_cast<double>(elements) * 4 / 1e6, pushes,
              rounds);
  std::printf("| durability | pushes/s | p50 ms | p99 ms | throughput vs memory |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (size_t m = 0; m < modes.size(); ++m) {
    const Measurements& r = results[m];
    const double pps = Median(r.pushes_per_s);
    std::printf("| %s | %.0f | %.2f | %.2f | %.2f |\n", modes[m].label, pps, Median(r.p50_ms),
                Median(r.p99_ms), pps / base);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

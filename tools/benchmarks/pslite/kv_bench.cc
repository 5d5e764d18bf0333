// The ps-lite anchor: push+pull rounds of one dense tensor through ps-lite (github.com/dmlc/ps-lite),
// in the manner of its tests/test_kv_app_benchmark.cc, but repeated and timed round by round, so
// that tools/benchmarks/bench_pslite.py can set it beside parasync-load on the same shaped links.
//
//   kv_bench ELEMENTS ROUNDS      (the role, counts and scheduler from ps-lite's DMLC_* variables)
//
// A worker pushes ELEMENTS float32 values with their keys (spread evenly over the key range, so
// every server holds an equal share), waits, pulls them back, waits: one round. After ROUNDS it
// prints one JSON line: each round's milliseconds, their median, and the payload each way.
// A server adds each push into a dense array (one per worker, by position: the keys of a
// worker's requests are the same every round) and answers a pull from it; no optimizer,
// nothing hashed, so the figure is ps-lite's transport and its keys, not a store.
//
// Not built by the project's CMake (ps-lite is not a Debian package):
// tools/benchmarks/pslite/build.sh builds ps-lite and this against Debian's ZeroMQ and
// protobuf.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

// Per sender: the running sums of the values it pushed, by position in its key list.
std::unordered_map<int, std::vector<float>> sums;

void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& data, ps::KVServer<float>* server) {
  std::vector<float>& sum = sums[meta.sender];
  const size_t n = data.keys.size();
  sum.resize(n, 0.0f);
  ps::KVPairs<float> reply;
  if (meta.push) {
    for (size_t i = 0; i < n; ++i) sum[i] += data.vals[i];
  }
  if (meta.pull) {
    reply.keys = data.keys;
    reply.vals.CopyFrom(sum.data(), n);
  }
  server->Response(meta, reply);
}

int RunWorker(long elements, int rounds) {
  ps::KVWorker<float> kv(0, 0);
  ps::SArray<ps::Key> keys(static_cast<size_t>(elements));
  ps::SArray<float> vals(static_cast<size_t>(elements));
  const ps::Key step = ps::kMaxKey / static_cast<ps::Key>(elements);
  for (long i = 0; i < elements; ++i) {
    keys[i] = step * static_cast<ps::Key>(i);
    vals[i] = 0.001f * static_cast<float>(i % 1000);
  }
  std::vector<double> ms;
  ps::SArray<float> back;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kv.Wait(kv.ZPush(keys, vals));
    kv.Wait(kv.ZPull(keys, &back));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (static_cast<long>(back.size()) != elements) {
      std::fprintf(stderr, "kv_bench: a pull returned %zu values, not %ld\n", back.size(), elements);
      return 1;
    }
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  // Each way per round: the keys (8 bytes) and values (4) of the push out, the keys of the pull
  // out; the pull's keys and values in.
  const double out_mb = elements * (8.0 + 4.0 + 8.0) / 1e6;
  const double in_mb = elements * (8.0 + 4.0) / 1e6;
  std::string rounds_text;
  for (double m : ms) rounds_text += (rounds_text.empty() ? "" : ",") + std::to_string(m);
  std::printf("{\"system\": \"ps-lite\", \"elements\": %ld, \"servers\": %d, \"rounds\": %d, "
              "\"median_round_ms\": %.3f, \"payload_mb_out\": %.3f, \"payload_mb_in\": %.3f, "
              "\"round_ms\": [%s]}\n",
              elements, ps::NumServers(), rounds, median, out_mb, in_mb, rounds_text.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 3 || std::atol(argv[1]) < 1 || std::atoi(argv[2]) < 1) {
    std::fprintf(stderr, "usage: kv_bench ELEMENTS ROUNDS (both >= 1; roles from DMLC_ROLE)\n");
    return 2;
  }
  const long elements = std::atol(argv[1]);
  const int rounds = std::atoi(argv[2]);
  ps::Start(0);
  ps::KVServer<float>* server = nullptr;
  if (ps::IsServer()) {
    server = new ps::KVServer<float>(0);
    server->set_request_handle(Handle);
  }
  int rc = 0;
  if (ps::IsWorker()) rc = RunWorker(elements, rounds);
  ps::Finalize(0, true);
  delete server;
  return rc;
}

// parasync-worker: trains on its shard of the data against the parameter servers. See --help.
#include <cblas.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/cluster_spec.h"
#include "common/metrics.h"
#include "common/model_file.h"
#include "common/model_spec.h"
#include "common/preflight.h"
#include "common/process.h"
#include "common/version.h"
#include "worker/compute/backend_factory.h"
#include "common/mode.h"
#include "worker/data/dataset.h"
#include "worker/heartbeater.h"
#include "worker/model/mlp.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

namespace {

int Fail(const std::string& line, int code = 1) {
  return parasync::PrintErrorLine("parasync-worker", line, code);
}

std::string WidthsText(const std::vector<int64_t>& widths) {
  std::string text;
  for (int64_t w : widths) text += (text.empty() ? "" : "-") + std::to_string(w);
  return text;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return "[" + WidthsText(shape) + "]";
}

// Returns the MLP whose variables a model file holds: the widths come from the kernels
// "dense<l>/kernel" {in, out}, which must chain (out of layer l = in of layer l+1), and the
// variables must then be exactly MlpVariables(widths) by name, shape and dtype (in any order).
// InvalidArgument naming the first thing that does not fit.
parasync::Result<parasync::MlpSpec> MlpFromModelFile(const parasync::ModelFile& file) {
  using namespace parasync;
  std::map<std::string, const VariableSpec*> by_name;
  for (const VariableSpec& v : file.variables) by_name[v.name] = &v;
  std::vector<int64_t> widths;
  for (int layer = 0;; ++layer) {
    const std::string name = "dense" + std::to_string(layer) + "/kernel";
    const auto it = by_name.find(name);
    if (it == by_name.end()) break;
    const std::vector<int64_t>& shape = it->second->shape;
    if (shape.size() != 2) {
      return Status::InvalidArgument(name + " has shape " + ShapeText(shape) +
                                     ", not [inputs-outputs]");
    }
    if (layer == 0) {
      widths.push_back(shape[0]);
    } else if (shape[0] != widths.back()) {
      return Status::InvalidArgument(name + " has " + std::to_string(shape[0]) +
                                     " inputs but layer " + std::to_string(layer - 1) + " has " +
                                     std::to_string(widths.back()) + " outputs");
    }
    widths.push_back(shape[1]);
  }
  if (widths.empty()) return Status::InvalidArgument("no dense0/kernel: not an MLP model");
  PARASYNC_ASSIGN_OR_RETURN(MlpSpec spec, ParseMlpWidths(WidthsText(widths)));
  const std::string what = "an MLP " + WidthsText(spec.widths);
  const std::vector<VariableSpec> expected = MlpVariables(spec);
  for (const VariableSpec& e : expected) {
    const auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return Status::InvalidArgument("no " + e.name + ", which " + what + " needs");
    }
    if (it->second->shape != e.shape) {
      return Status::InvalidArgument(e.name + " has shape " + ShapeText(it->second->shape) +
                                     ", " + what + " needs " + ShapeText(e.shape));
    }
    if (it->second->dtype != e.dtype) {
      return Status::InvalidArgument(e.name + " is not float32");
    }
  }
  if (file.variables.size() != expected.size()) {
    for (const VariableSpec& v : file.variables) {
      bool known = false;
      for (const VariableSpec& e : expected) known = known || e.name == v.name;
      if (!known) return Status::InvalidArgument("variable " + v.name + " is not part of " + what);
    }
    return Status::InvalidArgument(std::to_string(file.variables.size()) + " variables, " +
                                   what + " has " + std::to_string(expected.size()));
  }
  return spec;
}

// --eval-only: evaluates the model in `model_path` (docs/model-format.md) on the t10k split
// of `data_dir` with the CPU backend, as the chief's evaluation does, and prints one line for
// people and one JSON line with the exact values. No cluster is involved. `explicit_widths`
// is --model when the user gave it: it must match the file. Returns the exit status: 0, 2
// for a missing, corrupt or mismatched model file or missing data, 1 if evaluation fails.
int RunEvalOnly(const std::string& model_path, const std::string& data_dir,
                const std::optional<std::string>& explicit_widths, int compute_threads) {
  using namespace parasync;
  if (model_path.empty()) return Fail("--eval-only needs --model-file FILE", kExitBadUsage);
  auto file = ReadModelFile(model_path);
  if (!file.ok()) return Fail(file.status().message(), kExitBadUsage);
  auto mlp = MlpFromModelFile(*file);
  if (!mlp.ok()) {
    return Fail(model_path + " does not hold an MLP parasync can evaluate: " +
                    mlp.status().message(),
                kExitBadUsage);
  }
  if (explicit_widths) {
    auto wanted = ParseMlpWidths(*explicit_widths);
    if (!wanted.ok()) return Fail(wanted.status().message(), kExitBadUsage);
    if (wanted->widths != mlp->widths) {
      return Fail("--model " + WidthsText(wanted->widths) + " does not match " + model_path +
                      ", which holds an MLP " + WidthsText(mlp->widths),
                  kExitBadUsage);
    }
  }
  auto test = LoadIdxDataset(data_dir, "t10k");
  if (!test.ok()) return Fail(test.status().message(), kExitBadUsage);
  if (test->dim != mlp->widths.front() || test->n == 0) {
    return Fail("the test data has " + std::to_string(test->n) + " examples of " +
                    std::to_string(test->dim) + " features; the model in " + model_path +
                    " expects " + std::to_string(mlp->widths.front()) + " features",
                kExitBadUsage);
  }
  openblas_set_num_threads(compute_threads);
  auto backend = CreateCpuBackend(*mlp);
  if (!backend.ok()) return Fail(backend.status().message());
  std::vector<const float*> params;
  for (const VariableSpec& v : MlpVariables(*mlp)) {
    for (size_t i = 0; i < file->variables.size(); ++i) {
      if (file->variables[i].name == v.name) params.push_back(file->values[i].data());
    }
  }
  auto result = (*backend)->Evaluate(params, test->x.data(), test->y.data(), test->n);
  if (!result.ok()) return Fail("evaluation failed: " + result.status().ToString());
  const double accuracy = result->accuracy();  // as the chief computes it (trainer.cc)
  const double loss = result->mean_loss();
  std::printf("eval-only: test accuracy %.4f, test loss %.4f on %lld examples (model %s)\n",
              accuracy, loss, static_cast<long long>(result->count), model_path.c_str());
  // The shortest text that reads back as the same double (as eval.jsonl has it); a
  // non-finite loss is not JSON, hence null.
  auto exact = [](double value) -> std::string {
    if (!std::isfinite(value)) return "null";
    char text[32];
    const auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
    return ec == std::errc() ? std::string(text, end) : "null";
  };
  std::printf("{\"test_accuracy\": %s, \"test_loss\": %s, \"examples\": %lld}\n",
              exact(accuracy).c_str(), exact(loss).c_str(), static_cast<long long>(result->count));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app{
      "parasync-worker: trains a model on its shard of the data. Each step pulls the "
      "parameters from every parameter server, computes the gradient of a batch and pushes it "
      "back. Rank 0 is the chief: it also evaluates on the whole test set after every epoch "
      "and appends the result to <log-dir>/eval.jsonl.\n\n"
      "Example (rank 0 of 2, with 2 parameter servers):\n"
      "  parasync-worker --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 "
      "--worker-hosts 127.0.0.1:6000,127.0.0.1:6001 --task-index 0 --epochs 5\n"
      "The cluster may instead come from TF_CONFIG; flags win.\n\n"
      "Evaluate an exported model (parasync-export) without any cluster:\n"
      "  parasync-worker --eval-only --model-file model.psm [--data DIR]"};
  app.option_defaults()->always_capture_default();
  // A flag given twice takes its last value, so a launcher's per-rank argument overrides a
  // shared one (parasync-launch --worker-arg ... --rank-arg R:...).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  ClusterFlags cluster;
  std::string mode = "async";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 5;
  int batch_size = 64;
  int64_t max_steps = 0;
  double max_seconds = 0;
  std::string model = "784-256-128-10";
  std::string optimizer = "adam";
  float lr = 0.001f;
  float momentum = 0.9f;
  uint64_t seed = 42;
  int64_t max_slice_elements = kDefaultMaxSliceElements;
  std::string device = "auto";
  int local_rank = -1;
  int compute_threads = 1;
  std::string log_dir = ".";
  std::string log_level = "info";
  std::string metrics_bind = "127.0.0.1";
  int metrics_port = 0;
  int request_timeout_s = 120;
  int connect_timeout_s = 60;
  double heartbeat_interval_s = 1.0;
  bool staleness_lr = false;
  std::string lr_scaling = "none";
  bool no_shuffle = false;
  int64_t train_examples = 0;
  int step_delay_ms = 0;
  double slowdown = 1.0;
  bool checkpoint_each_epoch = false;
  bool eval_only = false;
  std::string model_file;

  app.add_option("--ps-hosts", cluster.ps_hosts, "Comma-separated host:port of every PS shard");
  app.add_option("--worker-hosts", cluster.worker_hosts,
                 "Comma-separated host:port of every worker (their count is the world size)");
  app.add_option("--task-index", cluster.task_index, "This worker's rank; 0 is the chief")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mode", mode,
                 "async, sync or ssp:K; must equal the parameter servers' --mode");
  app.add_option("--data", data_dir,
                 "Directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (IDX format)");
  app.add_option("--epochs", epochs, "Passes over this worker's shard")->check(CLI::Range(1, 100000));
  app.add_option("--batch-size", batch_size, "Examples per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-seconds", max_seconds,
                 "Stop after this many seconds of training, evaluating first on the chief (a "
                 "time budget; 0: no limit)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--max-steps", max_steps, "Stop after this many steps (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--model", model, "MLP widths, input-hidden...-classes");
  app.add_option("--optimizer", optimizer, "Server-side optimizer: sgd, momentum or adam");
  app.add_option("--lr", lr, "Learning rate");
  app.add_option("--momentum", momentum, "Momentum coefficient (--optimizer momentum)");
  app.add_option("--seed", seed, "Seed of the initial parameters and of the data shuffles");
  app.add_flag("--no-shuffle", no_shuffle, "Walk the data shard in order every epoch");
  app.add_option("--train-examples", train_examples,
                 "Use only the first N training examples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-delay-ms", step_delay_ms,
                 "Fault injection: sleep this long before every push, making this worker a "
                 "straggler")
      ->check(CLI::Range(0, 3600000));
  app.add_option("--slowdown", slowdown,
                 "Fault injection: compute this many times slower (after each gradient, sleep "
                 "FACTOR - 1 times the time it took), making this worker a straggler")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_flag("--checkpoint-each-epoch", checkpoint_each_epoch,
               "Chief: after each epoch's evaluation, ask every parameter server to save a "
               "snapshot (they need --data-dir)");
  app.add_flag("--staleness-lr", staleness_lr,
               "async/ssp: the servers divide each update by its staleness (versions applied "
               "between its read and its apply), after Zhang et al. 2016");
  app.add_option("--lr-scaling", lr_scaling,
                 "linear: multiply --lr by the number of workers (the effective batch grows with "
                 "them); none: use --lr as given");
  std::string wire_dtype = "float32";
  int copy_threads = 2;
  app.add_option("--wire-dtype", wire_dtype,
                 "How parameters and gradients travel: float32, or bfloat16 / float16 (bf16, "
                 "fp16) for half the bytes, each value rounded to nearest once per transfer "
                 "(the servers keep float32; float16 saturates at +-65504, bfloat16 keeps "
                 "float32's range with 8 bits of precision)");
  app.add_option("--copy-threads", copy_threads,
                 "Threads that copy a pulled model of 1 MiB or more into the training buffers, "
                 "this worker's training thread included (1: that thread alone); a helper not "
                 "scheduled in time leaves its share to the others")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-slice-elements", max_slice_elements,
                 "Variables are cut into slices of at most this many elements")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device,
                 "auto, cpu, cuda or cuda:N (auto: a GPU if present, else the CPU; auto and cuda "
                 "take the GPU --local-rank names)");
  app.add_option("--local-rank", local_rank,
                 "This worker's index among the workers on its machine: it uses GPU "
                 "local-rank mod GPU count, one worker per GPU (default: $LOCAL_RANK, else 0; "
                 "parasync-launch sets it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--compute-threads", compute_threads,
                 "BLAS threads of the CPU backend (keep 1 when several processes share a machine)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--log-dir", log_dir, "Where the chief writes eval.jsonl and every worker its metrics snapshot");
  app.add_option("--log-level", log_level, "debug, info, warn or error");
  // The last of repeated metrics flags wins, so a user's --ps-arg/--worker-arg overrides
  // the launcher's.
  app.add_option("--metrics-port", metrics_port, "Port of /metrics; 0 picks a free one and logs it")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-bind", metrics_bind, "Address the metrics server listens on")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--request-timeout", request_timeout_s,
                 "Seconds to wait for a parameter server's reply, resending meanwhile (also "
                 "across a restart of the server) before failing")
      ->check(CLI::Range(1, 86400));
  app.add_option("--connect-timeout", connect_timeout_s,
                 "Seconds to wait for the parameter servers at start")
      ->check(CLI::Range(1, 86400));
  app.add_option("--heartbeat-interval", heartbeat_interval_s,
                 "Seconds between heartbeats to the parameter servers (keep it well below their "
                 "--worker-timeout)")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_flag("--eval-only", eval_only,
               "Evaluate --model-file on the t10k test set (CPU) and exit; no cluster flags are "
               "needed, and none are used");
  app.add_option("--model-file", model_file,
                 "--eval-only: the model file to evaluate, as parasync-export writes it "
                 "(docs/model-format.md); `--eval-only --model FILE` is accepted too");
  std::string curve_key_file;
  std::string curve_server_key_file;
  app.add_option("--curve-key", curve_key_file,
                 "CURVE: this worker's key pair file (parasync-keygen); its public key must be "
                 "in the servers' --curve-allow")
      ->group("Security");
  app.add_option("--curve-server-key", curve_server_key_file,
                 "CURVE: the servers' public key file (one key for all, or one per server in "
                 "--ps-hosts order)")
      ->group("Security");
  bool check = false;
  app.add_flag("--check", check,
               "Preflight: validate the flags, look for the data files, try binding the metrics "
               "port and print `check version ...` and one `check problem ...` line per "
               "problem, then exit (0: fine); parasync-launch --check runs it on every host");
  app.set_version_flag("--version", VersionLine("parasync-worker"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what() + std::string(" (see --help)"), kExitBadUsage);
  }

  if (eval_only) {
    std::optional<std::string> widths;
    if (app.count("--model") > 0) widths = model;
    // `--eval-only --model FILE` works too: a --model that is no list of widths is the file.
    if (model_file.empty() && widths && !ParseMlpWidths(*widths).ok()) {
      model_file = *widths;
      widths.reset();
    }
    return RunEvalOnly(model_file, data_dir, widths, compute_threads);
  }
  if (!model_file.empty()) return Fail("--model-file is only used with --eval-only", kExitBadUsage);
  // Everything the user can get wrong is checked before anything starts.
  auto spec = ResolveClusterSpecFromEnvironment(cluster, "worker");
  if (!spec.ok()) return Fail(spec.status().message(), kExitBadUsage);
  if (heartbeat_interval_s * 3 > request_timeout_s + connect_timeout_s) {
    return Fail("--heartbeat-interval must be under a third of --request-timeout + "
                "--connect-timeout (a silent server is detected from missing heartbeats)",
                kExitBadUsage);
  }
  auto training_mode = TrainingMode::Parse(mode);
  if (!training_mode.ok()) return Fail(training_mode.status().message(), kExitBadUsage);
  if (staleness_lr && training_mode->kind == TrainingMode::Kind::kSync) {
    return Fail("--staleness-lr applies to async and ssp modes (sync gradients are never stale)",
                kExitBadUsage);
  }
  if (lr_scaling != "none" && lr_scaling != "linear") {
    return Fail("--lr-scaling must be linear or none, not '" + lr_scaling + "'", kExitBadUsage);
  }
  auto mlp = ParseMlpWidths(model);
  if (!mlp.ok()) return Fail(mlp.status().message(), kExitBadUsage);
  auto opt_kind = ParseOptimizerKind(optimizer);
  if (!opt_kind.ok()) return Fail(opt_kind.status().message(), kExitBadUsage);
  OptimizerSpec opt;
  opt.kind = *opt_kind;
  opt.learning_rate = lr;
  if (lr_scaling == "linear") opt.learning_rate = lr * static_cast<float>(spec->workers.size());
  opt.momentum = momentum;
  opt.staleness_aware = staleness_lr;
  if (Status s = ValidateOptimizer(opt); !s.ok()) return Fail(s.message(), kExitBadUsage);
  const std::optional<DType> wire = ParseDType(wire_dtype);
  if (!wire) {
    return Fail("--wire-dtype must be float32, bfloat16 or float16, not '" + wire_dtype + "'",
                kExitBadUsage);
  }
  auto dev = ParseDevice(device);
  if (!dev.ok()) return Fail(dev.status().message(), kExitBadUsage);
  if (local_rank < 0) {
    auto from_env = LocalRankFromEnvironment();
    if (!from_env.ok()) return Fail(from_env.status().message(), kExitBadUsage);
    local_rank = *from_env;
  }
  const int rank = spec->task_index;
  auto curve = LoadCurveClientKeys(curve_key_file, curve_server_key_file, spec->ps.size());
  if (!curve.ok()) return Fail(curve.status().message(), kExitBadUsage);
  if (check) {
    std::vector<std::string> problems;
    const std::string who = "worker" + std::to_string(rank);
    std::string missing;
    for (const char* split : {"train", "t10k"}) {
      for (const char* part : {"images-idx3", "labels-idx1"}) {
        const std::string file = std::string(split) + "-" + part + "-ubyte";
        const std::string base = data_dir + "/" + file;
        std::error_code ec;
        if (!std::filesystem::exists(base, ec) && !std::filesystem::exists(base + ".gz", ec)) {
          missing += (missing.empty() ? "" : ", ") + file + "[.gz]";
        }
      }
    }
    if (!missing.empty()) problems.push_back(who + ": --data " + data_dir + " lacks " + missing);
    if (metrics_port != 0) {
      if (std::string p = BindProblem(metrics_bind, metrics_port); !p.empty()) {
        problems.push_back(who + " metrics: " + p);
      }
    }
    return ReportCheck(problems);
  }
  if (!InitLogging("worker", rank, log_level)) {
    return Fail("unknown --log-level " + log_level, kExitBadUsage);
  }
  {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec) return Fail("cannot create --log-dir " + log_dir + ": " + ec.message(), kExitBadUsage);
  }
  InstallShutdownSignalHandlers();
  KeepFreedMessageBuffers();
  auto train = LoadIdxDataset(data_dir, "train");
  if (!train.ok()) return Fail(train.status().message(), kExitBadUsage);
  if (train_examples > 0 && train_examples < train->n) {
    train->n = train_examples;
    train->x.resize(static_cast<size_t>(train_examples * train->dim));
    train->y.resize(static_cast<size_t>(train_examples));
  }
  Dataset test;
  if (rank == 0) {
    auto t = LoadIdxDataset(data_dir, "t10k");
    if (!t.ok()) return Fail(t.status().message(), kExitBadUsage);
    test = std::move(t).value();
  }

  WorkerMetrics metrics(rank);
  // The metrics server starts before any compute backend is loaded (see backend_factory.h).
  auto metrics_server = MetricsServer::Start(metrics_bind, metrics_port, metrics.registry);
  if (!metrics_server.ok()) return Fail(metrics_server.status().message());
  const int bound_metrics_port = (*metrics_server)->port();
  MetricsServer::KeepUntilExit(std::move(metrics_server).value());

  openblas_set_num_threads(compute_threads);
  std::string why;
  auto backend = CreateBackend(*dev, *mlp, local_rank, &why);
  if (!backend.ok()) return Fail(backend.status().message(), kExitBadUsage);
  spdlog::info("rank {}/{}: compute on {} ({}); {} training examples in this shard; metrics on "
               "http://{}:{}/metrics",
               rank, spec->workers.size(), (*backend)->name(), why,
               (train->n + static_cast<int64_t>(spec->workers.size()) - 1 - rank) /
                   static_cast<int64_t>(spec->workers.size()),
               metrics_bind, bound_metrics_port);

  if (*wire != DType::kFloat32) {
    spdlog::info("parameters and gradients travel as {} (half the bytes of float32)",
                 DTypeName(*wire));
  }

  zmq::context_t context(1);
  PsClientOptions client_options;
  client_options.ps_addresses = spec->ps;
  client_options.rank = rank;
  client_options.request_timeout = std::chrono::seconds(request_timeout_s);
  client_options.curve = *curve;
  client_options.wire_dtype = *wire;
  client_options.copy_threads = copy_threads;
  auto heartbeater = Heartbeater::Start(
      context, spec->ps, rank,
      std::chrono::milliseconds(static_cast<int64_t>(heartbeat_interval_s * 1000)), *curve);
  if (!heartbeater.ok()) return Fail(heartbeater.status().message());
  // A blocked pull gives up when asked to stop, or when a server has stopped answering
  // heartbeats for longer than the request plus connect timeouts (it died: waiting would
  // never end).
  const auto silence_limit = std::chrono::seconds(request_timeout_s) +
                             std::chrono::seconds(connect_timeout_s);
  Heartbeater* beats = heartbeater->get();
  client_options.interrupted = [beats, silence_limit] {
    return ShutdownRequested() || beats->LongestSilence() > silence_limit;
  };
  // A parameter server that restarts (and restores its data directory) announces a new
  // incarnation in its heartbeat replies: requests to it are registered again and resent.
  client_options.incarnation_of = [beats](int shard) { return beats->Incarnation(shard); };
  client_options.pulls_may_wait = training_mode->kind != TrainingMode::Kind::kAsync;
  auto client = PsClient::Connect(context, client_options);
  if (!client.ok()) return Fail(client.status().message());

  ModelRegistration reg;
  reg.variables = MlpVariables(*mlp);
  reg.optimizer = opt;
  reg.seed = seed;
  reg.max_slice_elements = max_slice_elements;
  reg.num_shards = static_cast<int32_t>(spec->ps.size());
  reg.mode = training_mode->ToString();
  if (Status s = (*client)->Register(reg, std::chrono::seconds(connect_timeout_s)); !s.ok()) {
    if (ShutdownRequested()) {
      spdlog::info("stopped by signal {} before training", ShutdownSignal());
      return 0;
    }
    return Fail("registration failed: " + s.ToString());
  }
  spdlog::info("registered {} variables as {} slices on {} parameter server(s)",
               reg.variables.size(), (*client)->slice_map().slices().size(), spec->ps.size());

  TrainerOptions options;
  options.rank = rank;
  options.num_workers = static_cast<int>(spec->workers.size());
  options.mode = *training_mode;
  options.shuffle = !no_shuffle;
  options.step_delay = std::chrono::milliseconds(step_delay_ms);
  options.slowdown = slowdown;
  options.checkpoint_each_epoch = checkpoint_each_epoch;
  options.epochs = epochs;
  options.batch_size = batch_size;
  options.max_steps = max_steps;
  options.max_seconds = max_seconds;
  options.seed = seed;
  options.log_dir = log_dir;
  options.model = *mlp;
  options.optimizer = opt;
  auto summary = RunTraining(options, *train, test, **client, **backend, metrics,
                             [] { return ShutdownRequested(); });

  const std::string snapshot = MetricsSnapshotPath(log_dir, "worker" + std::to_string(rank));
  if (Status w = WriteMetricsSnapshot(*metrics.registry, snapshot); !w.ok()) {
    spdlog::warn("metrics snapshot not written: {}", w.message());
  }
  if (ShutdownRequested()) {
    spdlog::info("stopped by signal {}", ShutdownSignal());
    return 0;
  }
  if (!summary.ok()) {
    if ((*heartbeater)->LongestSilence() > silence_limit) {
      return Fail("training failed: a parameter server has not answered for " +
                  std::to_string((*heartbeater)->LongestSilence().count() / 1000) + " s (" +
                  summary.status().message() + ")");
    }
    return Fail("training failed: " + summary.status().ToString());
  }
  if (rank == 0) {
    spdlog::info("training done: {} epochs, {} steps here; final test accuracy {:.4f}, test loss "
                 "{:.4f}; eval log {}/eval.jsonl",
                 summary->epochs_done, summary->steps, summary->final_test_accuracy,
                 summary->final_test_loss, log_dir);
  } else {
    spdlog::info("training done: {} epochs, {} steps, {} gradients dropped as stale",
                 summary->epochs_done, summary->steps, summary->dropped);
  }
  return 0;
}

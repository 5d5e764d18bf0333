// parasync-worker: trains on its shard of the data against the parameter servers. See --help.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/address.h"
#include "common/cli.h"
#include "common/cluster_spec.h"
#include "common/metrics.h"
#include "common/model_file.h"
#include "common/model_spec.h"
#include "common/preflight.h"
#include "common/process.h"
#include "common/ready_file.h"
#include "common/version.h"
#include "worker/compute/backend_factory.h"
#include "common/mode.h"
#include "worker/data/dataset.h"
#include "worker/heartbeater.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/sparse_batch.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

namespace {

constexpr const char* kProgram = "parasync-worker";

int Fail(const std::string& line, int code = parasync::kExitRetryable) {
  return parasync::PrintErrorLine(kProgram, line, code);
}

// Whole milliseconds of a duration flag in decimal seconds.
std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::string WidthsText(const std::vector<int64_t>& widths) {
  std::string text;
  for (int64_t w : widths) text += (text.empty() ? "" : "-") + std::to_string(w);
  return text;
}

// The model description a model file holds: its metadata's "model" (parasync-export writes
// it), or, for files written before descriptions were kept, the MLP its "dense<l>/kernel"
// variables chain into. InvalidArgument naming what does not fit.
parasync::Result<parasync::ModelSpec> ModelSpecFromFile(const parasync::ModelFile& file,
                                                        const std::string& path) {
  using namespace parasync;
  nlohmann::json meta = nlohmann::json::parse(file.metadata_json, nullptr, false);
  if (meta.is_object() && meta.contains("model") && meta["model"].is_object()) {
    return ParseModelSpecJson(meta["model"].dump(), path + " (its model description)");
  }
  std::map<std::string, const VariableSpec*> by_name;
  for (const VariableSpec& v : file.variables) by_name[v.name] = &v;
  std::vector<int64_t> widths;
  for (int layer = 0;; ++layer) {
    const auto it = by_name.find("dense" + std::to_string(layer) + "/kernel");
    if (it == by_name.end() || it->second->shape.size() != 2) break;
    if (layer == 0) widths.push_back(it->second->shape[0]);
    widths.push_back(it->second->shape[1]);
  }
  if (widths.size() < 2) {
    return Status::InvalidArgument(path + " has no model description and no dense0/kernel "
                                   "(it was not written by parasync-export)");
  }
  return ResolveModelSpec(WidthsText(widths));
}

// Whether the file's variables are exactly the model's, by name, shape and dtype (in any
// order); InvalidArgument naming the first that is not. On success params[i] points at the
// file's values of model variable i.
parasync::Status MatchVariables(const parasync::Model& model, const parasync::ModelFile& file,
                                std::vector<const float*>* params) {
  using namespace parasync;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < file.variables.size(); ++i) index[file.variables[i].name] = i;
  for (const VariableSpec& v : model.variables()) {
    const auto it = index.find(v.name);
    if (it == index.end()) return Status::InvalidArgument("no " + v.name + ", which the model needs");
    const VariableSpec& have = file.variables[it->second];
    if (have.shape != v.shape) {
      return Status::InvalidArgument(v.name + " has shape " + ShapeString(have.shape) +
                                     ", the model needs " + ShapeString(v.shape));
    }
    if (have.dtype != v.dtype) return Status::InvalidArgument(v.name + " is not float32");
    params->push_back(file.values[it->second].data());
  }
  for (const VariableSpec& v : file.variables) {
    const auto& want = model.variables();
    if (std::none_of(want.begin(), want.end(), [&](const VariableSpec& w) { return w.name == v.name; })) {
      return Status::InvalidArgument("variable " + v.name + " is not part of the model");
    }
  }
  return Status::Ok();
}

// Whether --model `explicit_model` describes the same variables and computation as `model`
// (the file's) for examples of `shape`; the error if it cannot be resolved or built.
parasync::Result<bool> SameModel(const std::string& explicit_model,
                                    const parasync::Model& model,
                                    const std::vector<int64_t>& shape) {
  using namespace parasync;
  auto wanted = ResolveModelSpec(explicit_model);
  if (!wanted.ok()) return wanted.status();
  auto built = Model::Build(*wanted, shape);
  if (!built.ok()) return built.status();
  // The same variables and the same computation (flatten ops aside: a view either way).
  auto computation = [](const Model& m) {
    std::vector<std::tuple<LayerKind, Activation, int, int, int, int, float, Combiner>> ops;
    for (const LayerOp& op : m.ops()) {
      if (op.spec.kind == LayerKind::kFlatten) continue;
      ops.emplace_back(op.spec.kind, op.spec.activation, op.spec.kernel, op.spec.stride,
                       op.pad_begin, op.pad_end, op.spec.rate, op.spec.combiner);
    }
    return ops;
  };
  return built->variables() == model.variables() && computation(*built) == computation(model) &&
         built->loss() == model.loss();
}

// --eval-only: evaluates the model in `model_path` (docs/model-format.md) on the test split
// of `data_dir` with the CPU backend, as the chief's evaluation does, and prints one line for
// people and one JSON line with the exact values. No cluster is involved. `explicit_model`
// is --model when the user gave it: it must describe the same variables as the file.
// Returns the exit status: 0, 2 for a missing, corrupt or mismatched model file or missing
// data, 1 if evaluation fails.
int RunEvalOnly(const std::string& model_path, const std::string& data_dir,
                const std::optional<std::string>& explicit_model, int compute_threads) {
  using namespace parasync;
  if (model_path.empty()) return Fail("--eval-only needs --model-file FILE", kExitBadUsage);
  auto file = ReadModelFile(model_path);
  if (!file.ok()) return Fail(file.status().message(), kExitBadUsage);
  auto spec = ModelSpecFromFile(*file, model_path);
  if (!spec.ok()) return Fail(spec.status().message(), kExitBadUsage);
  auto test = LoadDataset(data_dir, "test");
  if (!test.ok()) return Fail(test.status().message(), kExitBadUsage);
  if (test->n == 0) return Fail("the test data in " + data_dir + " has no examples", kExitBadUsage);
  auto model = Model::Build(*spec, test->shape);
  if (!model.ok()) {
    return Fail("the model in " + model_path + " does not fit the test data: " +
                    model.status().message(),
                kExitBadUsage);
  }
  std::vector<const float*> params;
  if (Status s = MatchVariables(*model, *file, &params); !s.ok()) {
    return Fail(model_path + " does not hold the model it describes: " + s.message(), kExitBadUsage);
  }
  if (explicit_model) {
    auto same = SameModel(*explicit_model, *model, test->shape);
    if (!same.ok()) return Fail(same.status().message(), kExitBadUsage);
    if (!*same) {
      return Fail("--model " + *explicit_model + " does not match " + model_path +
                      ", which holds model '" + spec->name + "'",
                  kExitBadUsage);
    }
  }
  if (Status s = model->CheckLabelsFit(MaxLabel(*test)); !s.ok()) {
    return Fail("the test data does not fit the model: " + s.message(), kExitBadUsage);
  }
  SetCpuComputeThreads(compute_threads);
  auto backend = CreateCpuBackend(*model);
  if (!backend.ok()) return Fail(backend.status().message());
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

// The command line, as --help lists it.
struct WorkerFlags {
  parasync::ClusterFlags cluster;
  std::vector<std::string> ps_ipc;  // --ps-ipc SHARD=PATH
  std::string mode = "async";
  std::string data_dir = parasync::kDefaultDataDir;
  int epochs = 5;
  int batch_size = 64;
  int64_t max_steps = 0;
  std::string eval_every = "0";  // --eval-every N (steps) or Ns (seconds)
  double max_seconds = 0;
  double log_every_s = 0;
  std::string model = "mlp";
  std::string optimizer = "adam";
  float lr = 0.001f;
  float momentum = 0.9f;
  float adagrad_initial_accumulator = 0.1f;
  std::string lr_schedule = "constant";
  double lr_decay_epochs = 0;
  float lr_final_fraction = 0.0f;
  uint64_t seed = 42;
  bool no_shuffle = false;
  int64_t train_examples = 0;
  double step_delay_s = 0;
  int step_delay_ms = 0;
  double slowdown = 1.0;
  bool weight_prediction = true;
  bool checkpoint_each_epoch = false;
  double wait_for_workers_s = 0;
  bool staleness_lr = false;
  std::string lr_scaling = "none";
  std::string wire_dtype = "float32";
  std::string topk_probe = "on";
  std::string delta_pulls = "on";
  int copy_threads = 2;
  int64_t max_slice_elements = parasync::kDefaultMaxSliceElements;
  std::string device = "auto";
  int local_rank = -1;
  std::string local_group;           // --local-group: this host's ranks
  std::string local_group_endpoint;  // empty: DefaultLocalGroupEndpoint
  int compute_threads = 1;
  std::string log_dir = ".";
  std::string log_level = "info";
  int metrics_port = 0;
  std::string ready_file;  // --ready-file: the metrics port, once served (common/ready_file.h)
  std::string metrics_bind = "127.0.0.1";
  double request_timeout_s = 120;
  double connect_timeout_s = 60;
  double heartbeat_interval_s = 1.0;
  bool eval_only = false;
  std::string model_file;
  std::string curve_key_file;
  std::string curve_server_key_file;
  bool check = false;
};

void AddClusterAndDataFlags(CLI::App& app, WorkerFlags& f) {
  using namespace parasync;
  app.add_option("--ps-hosts", f.cluster.ps_hosts,
                 "Comma-separated host:port of every PS shard (IP addresses or host names, "
                 "ports 1-65535, each address once)");
  app.add_option("--ps-ipc", f.ps_ipc,
                 "Reach shard SHARD over the unix socket PATH that it listens on (its --ipc) "
                 "instead of TCP: for the shard on this host (parasync-launch --ps colocated "
                 "sets it). Repeatable")
      ->type_name("SHARD=PATH");
  app.add_option("--worker-hosts", f.cluster.worker_hosts,
                 "Comma-separated host:port of every worker (their count is the world size)");
  app.add_option("--task-index", f.cluster.task_index, "This worker's rank; 0 is the chief")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mode", f.mode,
                 "async, sync, sync:delayed (the exchange of each step overlaps the next "
                 "gradient's compute, which reads the parameters one step older) or ssp:K; "
                 "must equal the parameter servers' --mode");
  app.add_flag("--weight-prediction,!--no-weight-prediction", f.weight_prediction,
               "sync:delayed: compute each gradient at the parameters extrapolated one step "
               "ahead (2 w[t-1] - w[t-2], where the step being exchanged is expected to take "
               "them) rather than at w[t-1] [default: on]");
  app.add_option("--dataset", f.data_dir,
                 "Directory with the data set: IDX files "
                 "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (images [n, H, W] or "
                 "[n, H, W, C]) or NumPy files {train,test}_{x,y}.npy (docs/data.md); old name "
                 "--data")
      ->type_name("DIR");
  AddHiddenAlias(app, "--data", f.data_dir);
  app.add_option("--epochs", f.epochs, "Passes over this worker's shard")->check(CLI::Range(1, 100000));
  app.add_option("--batch-size", f.batch_size, "Examples per step")->check(CLI::Range(1, 1 << 20));
  AddSecondsOption(app, "--max-seconds", f.max_seconds,
                   "Stop after this many seconds of training, evaluating first on the chief (a "
                   "time budget; 0: no limit)",
                   0.0, 1e9);
  app.add_option("--max-steps", f.max_steps, "Stop after this many steps (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", f.eval_every,
                 "Chief: also evaluate within each epoch, every N of its steps (e.g. 100) or "
                 "every N seconds (e.g. 30s), each a row of eval.jsonl with the epochs done as "
                 "a fraction (\"epoch\": 1.25, \"within_epoch\": true); 0: at each epoch's end "
                 "only")
      ->capture_default_str()
      ->type_name("N|Ns");
  AddSecondsOption(app, "--log-every", f.log_every_s,
                   "Within each epoch, a progress line (examples done, examples/sec, train "
                   "loss) at most this often (0: only the line at each epoch's end)",
                   0.0, 1e9);
  app.add_option("--model", f.model,
                 "The model: a built-in (mlp: 784-256-128-10; cnn: Conv2D 32 3x3 ReLU, Dense 128, "
                 "Dense 10; lenet5), MLP widths input-hidden...-classes, or a JSON model file "
                 "(docs/models.md)");
}

void AddOptimizerFlags(CLI::App& app, WorkerFlags& f) {
  app.add_option("--optimizer", f.optimizer,
                 "Server-side optimizer: sgd, momentum, adam or adagrad (the usual choice for "
                 "sparse embedding tables; rows get their own step counts and accumulators)");
  app.add_option("--lr", f.lr, "Learning rate");
  app.add_option("--momentum", f.momentum, "Momentum coefficient (--optimizer momentum)");
  app.add_option("--adagrad-initial-accumulator", f.adagrad_initial_accumulator,
                 "The accumulator's starting value (--optimizer adagrad; TensorFlow's 0.1)");
  app.add_option("--lr-schedule", f.lr_schedule,
                 "constant, or cosine: the servers decay the learning rate along a half cosine "
                 "(Keras's CosineDecay) over --lr-decay-epochs of examples applied, to --lr "
                 "times --lr-final-fraction")
      ->capture_default_str();
  app.add_option("--lr-decay-epochs", f.lr_decay_epochs,
                 "cosine: the decay's length in epochs of the training set, counted in examples "
                 "the servers applied from all workers (0: --epochs)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--lr-final-fraction", f.lr_final_fraction,
                 "cosine: the learning rate ends at --lr times this, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "Seed of the initial parameters and of the data shuffles");
  app.add_flag("--no-shuffle", f.no_shuffle, "Walk the data shard in order every epoch");
  app.add_option("--train-examples", f.train_examples,
                 "Use only the first N training examples (0: all)")
      ->check(CLI::NonNegativeNumber);
}

void AddFaultAndWireFlags(CLI::App& app, WorkerFlags& f) {
  using namespace parasync;
  AddSecondsOption(app, "--step-delay", f.step_delay_s,
                   "Fault injection: sleep this many seconds before every push, making this "
                   "worker a straggler (old form: --step-delay-ms MILLISECONDS)",
                   0.0, 3600.0);
  app.add_option("--step-delay-ms", f.step_delay_ms)->check(CLI::Range(0, 3600000))->group("");
  app.add_option("--slowdown", f.slowdown,
                 "Fault injection: compute this many times slower (after each gradient, sleep "
                 "FACTOR - 1 times the time it took), making this worker a straggler")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_flag("--checkpoint-each-epoch", f.checkpoint_each_epoch,
               "Chief: after each epoch's evaluation, ask every parameter server to save a "
               "snapshot (they need --state-dir)");
  parasync::AddSecondsOption(
      app, "--wait-for-workers", f.wait_for_workers_s,
      "Chief: after its last epoch, wait up to this long for every other worker to finish "
      "(to leave the servers) before the final evaluation, so that it evaluates the model "
      "they all trained (0: evaluate at once; parasync-launch passes --finish-timeout)",
      0.0, 1e9);
  app.add_flag("--staleness-lr", f.staleness_lr,
               "async/ssp: the servers divide each update by its staleness (versions applied "
               "between its read and its apply), after Zhang et al. 2016");
  app.add_option("--lr-scaling", f.lr_scaling,
                 "linear: multiply --lr by the number of workers (the effective batch grows with "
                 "them); none: use --lr as given");
  app.add_option("--wire-dtype", f.wire_dtype,
                 "How parameters and gradients travel: float32, or bfloat16 / float16 (bf16, "
                 "fp16) for half the bytes, each value rounded to nearest once per transfer "
                 "(the servers keep float32; float16 saturates at +-65504, bfloat16 keeps "
                 "float32's range with 8 bits of precision), or int8: gradients in a quarter "
                 "of the bytes, a power-of-two scale per 128 elements, what each push did not "
                 "send added to the next (error feedback); parameters pulled as changes to this "
                 "worker's copy of them in the same format (--delta-pulls); or int4: the "
                 "same with 4 bits an element, an eighth of the bytes; or "
                 "topk[:R] (default R 1/32): of every 256 gradient elements the R * 256 largest, "
                 "in int8 with their indices (17 bytes per 256 at 1/32, 1/60 of float32), "
                 "with error feedback the same way (docs/compression.md)");
  app.add_option("--topk-probe", f.topk_probe,
                 "With --wire-dtype int8, int4 or topk: on tries, after the first 20 steps, "
                 "top-k against int8 (32 steps each) and then float32 (up to 16 steps, one on "
                 "a slow link), and keeps whichever made the shorter step, saying which in one "
                 "line: compression off where a fast link does not pay back its CPU; off "
                 "keeps the format given")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--delta-pulls", f.delta_pulls,
                 "With --wire-dtype int8, int4 or topk and the servers' optimizer: on pulls the "
                 "parameters as changes to a copy this worker keeps, in the pushes' format (the "
                 "servers keep the same copy; what a pull does not send goes with the next): "
                 "int8 a quarter of float32's bytes, int4 an eighth; off pulls them in bfloat16, half")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--copy-threads", f.copy_threads,
                 "Threads that copy a pulled model of 1 MiB or more into the training buffers, "
                 "this worker's training thread included (1: that thread alone); a helper not "
                 "scheduled in time leaves its share to the others")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-slice-elements", f.max_slice_elements,
                 "Variables are cut into slices of at most this many elements")
      ->check(CLI::PositiveNumber);
}

void AddRuntimeFlags(CLI::App& app, WorkerFlags& f) {
  using namespace parasync;
  app.add_option("--device", f.device,
                 "auto, cpu, cuda or cuda:N (auto: a GPU if present, else the CPU; auto and cuda "
                 "take the GPU --local-rank names)");
  app.add_option("--local-rank", f.local_rank,
                 "This worker's index among the workers on its machine: it uses GPU "
                 "local-rank mod GPU count, one worker per GPU (default: $LOCAL_RANK, else 0; "
                 "parasync-launch sets it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--local-group", f.local_group,
                 "Local aggregation (sync modes): the ranks of the workers on this machine, this "
                 "one among them, e.g. 0,1. They exchange each step with the servers as one: "
                 "the lowest sums their gradients, pushes once and pulls once for all, so the "
                 "machine's link carries 1/k of the bytes (parasync-launch --local-aggregation "
                 "sets it; docs/local-aggregation.md)");
  app.add_option("--local-group-endpoint", f.local_group_endpoint,
                 "Where the group's lowest rank listens for the others (default: a unix socket "
                 "in /tmp named after the first server's port and that rank)");
  app.add_option("--compute-threads", f.compute_threads,
                 "BLAS threads of the CPU backend (keep 1 when several processes share a machine)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--log-dir", f.log_dir, "Where the chief writes eval.jsonl and every worker its metrics snapshot");
  app.add_option("--log-level", f.log_level, "debug, info, warn or error");
  // The last of repeated metrics flags wins, so a user's --ps-arg/--worker-arg overrides
  // the launcher's.
  app.add_option("--metrics-port", f.metrics_port,
                 "Port of /metrics; 0 picks a free one, logs it and writes it to --ready-file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(0, 65535));
  app.add_option("--ready-file", f.ready_file,
                 "Once /metrics is served, write a JSON object here (written whole, through a "
                 "rename): {\"role\", \"task_index\", \"pid\", \"address\" (empty: a worker "
                 "binds none), \"metrics_port\"}. Removed at start if an earlier run left one")
      ->type_name("PATH");
  app.add_option("--metrics-bind", f.metrics_bind,
                 "Address the metrics server listens on: an IP address (checked: four octets "
                 "0-255), * or a host name that resolves")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AddSecondsOption(app, "--request-timeout", f.request_timeout_s,
                   "Seconds to wait for a parameter server's reply, resending meanwhile (also "
                   "across a restart of the server) before failing",
                   0.1, 86400.0);
  AddSecondsOption(app, "--connect-timeout", f.connect_timeout_s,
                   "Seconds to wait for the parameter servers at start", 0.1, 86400.0);
  AddSecondsOption(app, "--heartbeat-interval", f.heartbeat_interval_s,
                   "Seconds between heartbeats to the parameter servers (keep it well below "
                   "their --worker-timeout)",
                   0.01, 3600.0);
}

void AddEvalSecurityAndCheckFlags(CLI::App& app, WorkerFlags& f) {
  app.add_flag("--eval-only", f.eval_only,
               "Evaluate --model-file on the t10k test set (CPU) and exit; no cluster flags are "
               "needed, and none are used");
  app.add_option("--model-file", f.model_file,
                 "--eval-only: the model file to evaluate, as parasync-export writes it "
                 "(docs/model-format.md); `--eval-only --model FILE` is accepted too");
  app.add_option("--curve-key", f.curve_key_file,
                 "CURVE: this worker's key pair file (parasync-keygen); its public key must be "
                 "in the servers' --curve-allow")
      ->group("Security");
  app.add_option("--curve-server-key", f.curve_server_key_file,
                 "CURVE: the servers' public key file (one key for all, or one per server in "
                 "--ps-hosts order)")
      ->group("Security");
  app.add_flag("--check", f.check,
               "Preflight: validate the flags, look for the data files, try binding the metrics "
               "port and print `check version ...` and one `check problem ...` line per "
               "problem, then exit (0: fine); parasync-launch --check runs it on every host");
}

void SetUpWorkerCommandLine(CLI::App& app, WorkerFlags& f) {
  parasync::SetUpCommandLine(
      app,
      {.name = kProgram,
       .purpose = "trains a model on its shard of the data.",
       .details =
           "Each step pulls the parameters from every parameter server, computes the gradient of "
           "a batch and pushes it back. Rank 0 is the chief: it also evaluates on the whole test "
           "set after every epoch and appends the result to <log-dir>/eval.jsonl. The cluster "
           "comes from --ps-hosts, --worker-hosts and --task-index, or from TF_CONFIG; flags "
           "win. With --eval-only it evaluates an exported model (parasync-export) without any "
           "cluster.",
       .exit_status = "Status 2 also for a missing or unreadable --dataset, a --metrics-port in "
                      "use, and a registration the servers refuse for good (another --mode, "
                      "another model than the one they hold); 1 when the servers cannot be "
                      "reached in time. SIGINT and SIGTERM stop training, status 0.",
       .examples = "parasync-worker --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 \\\n"
                   "      --worker-hosts 127.0.0.1:6000,127.0.0.1:6001 --task-index 0 --epochs 5\n"
                   "parasync-worker --eval-only --model-file model.psm [--dataset DIR]"});
  AddClusterAndDataFlags(app, f);
  AddOptimizerFlags(app, f);
  AddFaultAndWireFlags(app, f);
  AddRuntimeFlags(app, f);
  AddEvalSecurityAndCheckFlags(app, f);
}

// The flags, checked and resolved: everything the user can get wrong is found before
// anything starts.
struct WorkerConfig {
  parasync::ClusterSpec cluster;
  // Where this worker reaches each shard: its cluster address, or --ps-ipc's unix socket.
  std::vector<std::string> ps_endpoints;
  int rank = 0;
  std::string metrics_ip;
  parasync::TrainingMode mode;
  parasync::ModelSpec model;
  parasync::OptimizerSpec optimizer;  // decay_examples: a placeholder until the data is known
  parasync::WireFormat wire = parasync::DType::kFloat32;
  int64_t eval_every_steps = 0;  // --eval-every N
  double eval_every_seconds = 0;  // --eval-every Ns
  parasync::DeviceChoice device;
  int local_rank = 0;
  std::optional<parasync::LocalGroupOptions> local_group;
  std::optional<parasync::CurveClientKeys> curve;
};

// The optimizer the flags describe for `num_workers` workers; InvalidArgument naming the
// flag that is wrong.
parasync::Result<parasync::OptimizerSpec> OptimizerFromFlags(const WorkerFlags& f,
                                                             size_t num_workers) {
  using namespace parasync;
  auto opt_kind = ParseOptimizerKind(f.optimizer);
  if (!opt_kind.ok()) return opt_kind.status();
  if (IsWorkerSide(*opt_kind)) {
    return Status::InvalidArgument("--optimizer " + f.optimizer +
                                   ": parasync-worker trains with a server-side optimizer (sgd, "
                                   "momentum, adam or adagrad); " + f.optimizer +
                                   " is for scripts that apply their own (parasync.horovod)");
  }
  OptimizerSpec opt;
  opt.kind = *opt_kind;
  opt.learning_rate = f.lr;
  if (f.lr_scaling == "linear") opt.learning_rate = f.lr * static_cast<float>(num_workers);
  opt.momentum = f.momentum;
  opt.initial_accumulator = f.adagrad_initial_accumulator;
  opt.staleness_aware = f.staleness_lr;
  auto schedule = ParseLrSchedule(f.lr_schedule);
  if (!schedule.ok()) return Status::InvalidArgument("--lr-schedule: " + schedule.status().message());
  opt.schedule = *schedule;
  if (opt.schedule == LrSchedule::kConstant &&
      (f.lr_decay_epochs != 0 || f.lr_final_fraction != 0.0f)) {
    return Status::InvalidArgument(
        "--lr-decay-epochs and --lr-final-fraction need --lr-schedule cosine");
  }
  opt.final_lr_fraction = f.lr_final_fraction;
  // The horizon in examples is known once the data is: a placeholder until then.
  if (opt.schedule == LrSchedule::kCosine) opt.decay_examples = 1;
  if (Status s = ValidateOptimizer(opt); !s.ok()) return s;
  return opt;
}

// --eval-every: "N" steps or "Ns" seconds (N >= 0; 0: off).
parasync::Status ParseEvalEvery(const std::string& text, int64_t* steps, double* seconds) {
  using parasync::Status;
  const bool timed = !text.empty() && text.back() == 's';
  const std::string number = timed ? text.substr(0, text.size() - 1) : text;
  const auto bad = [&] {
    return Status::InvalidArgument("--eval-every takes a number of steps (100) or seconds "
                                   "(30s), not '" + text + "'");
  };
  if (number.empty()) return bad();
  try {
    size_t used = 0;
    if (timed) {
      *seconds = std::stod(number, &used);
      if (used != number.size() || !(*seconds >= 0) || *seconds > 1e9) return bad();
    } else {
      const long long n = std::stoll(number, &used);
      if (used != number.size() || n < 0) return bad();
      *steps = n;
    }
  } catch (const std::exception&) {
    return bad();
  }
  return Status::Ok();
}

// The shards' addresses, with --ps-ipc's SHARD=PATH items in place of theirs; a socket's
// directory is waited for up to `wait`.
parasync::Result<std::vector<std::string>> ShardEndpoints(const std::vector<std::string>& ps,
                                                          const std::vector<std::string>& items,
                                                          std::chrono::milliseconds wait) {
  using namespace parasync;
  std::vector<std::string> endpoints = ps;
  std::vector<bool> given(ps.size(), false);
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    size_t shard = 0;
    const char* end = item.data() + (eq == std::string::npos ? 0 : eq);
    auto [p, ec] = std::from_chars(item.data(), end, shard);
    if (eq == std::string::npos || eq == 0 || ec != std::errc() || p != end) {
      return Status::InvalidArgument("--ps-ipc takes SHARD=PATH, e.g. 0=/tmp/parasync-ps0.sock, "
                                     "not '" + item + "'");
    }
    if (shard >= ps.size() || given[shard]) {
      return Status::InvalidArgument("--ps-ipc " + item + ": " +
                                     (shard >= ps.size() ? "the cluster has " +
                                                               std::to_string(ps.size()) + " shards"
                                                         : "shard " + std::to_string(shard) +
                                                               " is given twice"));
    }
    // The server makes the directory when it binds: a launcher may start it on its host
    // beside this worker at the same moment.
    auto endpoint = IpcEndpoint(item.substr(eq + 1), "--ps-ipc", IpcSide::kClient, wait);
    if (!endpoint.ok()) return endpoint.status();
    endpoints[shard] = *endpoint;
    given[shard] = true;
  }
  return endpoints;
}

// Checks the flags (except the eval-only ones) and resolves what they name; InvalidArgument
// with the line to print otherwise. `f.local_rank` < 0 is taken from the environment.
parasync::Result<WorkerConfig> Validate(const WorkerFlags& f) {
  using namespace parasync;
  WorkerConfig c;
  auto spec = ResolveClusterSpecFromEnvironment(f.cluster, "worker");
  if (!spec.ok()) return spec.status();
  c.cluster = std::move(spec).value();
  c.rank = c.cluster.task_index;
  auto endpoints = ShardEndpoints(c.cluster.ps, f.ps_ipc, Millis(f.connect_timeout_s));
  if (!endpoints.ok()) return endpoints.status();
  c.ps_endpoints = std::move(endpoints).value();
  auto metrics_ip = ResolveBindHost(f.metrics_bind, "--metrics-bind");
  if (!metrics_ip.ok()) return metrics_ip.status();
  c.metrics_ip = *metrics_ip;
  if (f.heartbeat_interval_s * 3 > f.request_timeout_s + f.connect_timeout_s) {
    return Status::InvalidArgument(
        "--heartbeat-interval must be under a third of --request-timeout + "
        "--connect-timeout (a silent server is detected from missing heartbeats)");
  }
  auto mode = TrainingMode::Parse(f.mode);
  if (!mode.ok()) return mode.status();
  c.mode = *mode;
  if (f.staleness_lr && c.mode.kind == TrainingMode::Kind::kSync) {
    return Status::InvalidArgument(
        "--staleness-lr applies to async and ssp modes (sync gradients are never stale, and "
        "sync:delayed's are always one step old)");
  }
  if (f.lr_scaling != "none" && f.lr_scaling != "linear") {
    return Status::InvalidArgument("--lr-scaling must be linear or none, not '" + f.lr_scaling +
                                   "'");
  }
  auto model = ResolveModelSpec(f.model);
  if (!model.ok()) return model.status();
  c.model = std::move(model).value();
  auto opt = OptimizerFromFlags(f, c.cluster.workers.size());
  if (!opt.ok()) return opt.status();
  c.optimizer = *opt;
  const std::optional<WireFormat> wire = ParseWireFormat(f.wire_dtype);
  if (!wire) {
    return Status::InvalidArgument(
        "--wire-dtype must be float32, bfloat16, float16, int8, int4, topk or topk:R with R in "
        "(0, 1], "
        "not '" + f.wire_dtype + "'");
  }
  c.wire = *wire;
  if (Status s = ParseEvalEvery(f.eval_every, &c.eval_every_steps, &c.eval_every_seconds);
      !s.ok()) {
    return s;
  }
  auto device = ParseDevice(f.device);
  if (!device.ok()) return device.status();
  c.device = *device;
  c.local_rank = f.local_rank;
  if (c.local_rank < 0) {
    auto from_env = LocalRankFromEnvironment();
    if (!from_env.ok()) return from_env.status();
    c.local_rank = *from_env;
  }
  auto curve = LoadCurveClientKeys(f.curve_key_file, f.curve_server_key_file, c.cluster.ps.size());
  if (!curve.ok()) return curve.status();
  c.curve = *curve;
  if (!f.local_group.empty()) {
    auto group = LocalGroupFor(f.local_group, f.local_group_endpoint, c.rank,
                               static_cast<int>(c.cluster.workers.size()), c.mode, c.cluster.ps);
    if (!group.ok()) return Status::InvalidArgument("--local-group: " + group.status().message());
    c.local_group = *group;
  }
  return c;
}

// --check: the data files and the metrics port; prints the report, returns the exit status.
int RunCheck(const WorkerFlags& f, const WorkerConfig& c) {
  using namespace parasync;
  std::vector<std::string> problems;
  const std::string who = "worker" + std::to_string(c.rank);
  if (Status s = CheckDataFilesExist(f.data_dir); !s.ok()) {
    problems.push_back(who + ": " + s.message());
  }
  if (f.metrics_port != 0) {
    if (std::string p = BindProblem(f.metrics_bind, f.metrics_port); !p.empty()) {
      problems.push_back(who + " metrics: " + p);
    }
  }
  return ReportCheck(problems);
}

// The training split (cut to --train-examples) and, on the chief, the test split; sets the
// cosine horizon in `opt` from the training split's size.
parasync::Status LoadData(const WorkerFlags& f, int rank, parasync::Dataset* train,
                          parasync::Dataset* test, parasync::OptimizerSpec* opt) {
  using namespace parasync;
  auto loaded = LoadDataset(f.data_dir, "train");
  if (!loaded.ok()) return loaded.status();
  *train = std::move(loaded).value();
  if (f.train_examples > 0 && f.train_examples < train->n) {
    train->n = f.train_examples;
    train->x.resize(static_cast<size_t>(f.train_examples * train->dim));
    train->y.resize(static_cast<size_t>(f.train_examples));
    train->ids.resize(static_cast<size_t>(f.train_examples * train->id_columns));
  }
  if (rank == 0) {
    auto t = LoadDataset(f.data_dir, "test");
    if (!t.ok()) return t.status();
    *test = std::move(t).value();
    if (test->shape != train->shape || test->id_columns != train->id_columns) {
      return Status::InvalidArgument(
          "the test examples have shape " + ShapeString(test->shape) + " and " +
          std::to_string(test->id_columns) + " id columns but the training examples " +
          ShapeString(train->shape) + " and " + std::to_string(train->id_columns));
    }
  }
  if (opt->schedule == LrSchedule::kCosine) {
    const double decay_epochs = f.lr_decay_epochs > 0 ? f.lr_decay_epochs : f.epochs;
    opt->decay_examples =
        std::max<int64_t>(1, std::llround(decay_epochs * static_cast<double>(train->n)));
  }
  return Status::Ok();
}

// A metrics port in use, logging, the log directory, signal handling (SetUpServiceProcess, as
// parasync-ps); an exit status if one fails.
std::optional<int> SetUpProcess(const WorkerFlags& f, int rank) {
  using namespace parasync;
  if (!f.ready_file.empty()) {
    if (Status s = RemoveStaleReadyFile(f.ready_file); !s.ok()) {
      return Fail("--ready-file: " + s.message(), kExitBadUsage);
    }
  }
  if (Status s = SetUpServiceProcess({.role = "worker",
                                       .index = rank,
                                       .log_level = f.log_level,
                                       .log_dir = f.log_dir,
                                       .metrics_bind = f.metrics_bind,
                                       .metrics_port = f.metrics_port});
      !s.ok()) {
    return Fail(s.message(), StartupExitCode(s));
  }
  return std::nullopt;
}

// Starts /metrics (before any compute backend is loaded, see backend_factory.h) and keeps it
// until exit, setting *bound_port; an exit status if it cannot.
std::optional<int> StartMetrics(const WorkerFlags& f, const WorkerConfig& c,
                                parasync::WorkerMetrics& metrics, int* bound_port) {
  using namespace parasync;
  Result<int> bound =
      MetricsServer::ServeUntilExit(c.metrics_ip, f.metrics_bind, f.metrics_port, metrics.registry,
                                    {.loop = &metrics.loop, .stale_after = kWorkerLoopStaleAfter});
  // Checked free at start (SetUpProcess): taken since, or refused for another reason.
  if (!bound.ok()) return Fail(bound.status().message(), StartupExitCode(bound.status()));
  *bound_port = *bound;
  if (!f.ready_file.empty()) {
    const ReadyInfo ready{.role = "worker",
                          .task_index = c.rank,
                          .pid = getpid(),
                          .address = "",
                          .metrics_port = *bound};
    if (Status s = WriteReadyFile(f.ready_file, ready); !s.ok()) {
      return Fail("--ready-file: " + s.message());
    }
  }
  return std::nullopt;
}

// The connection to the parameter servers: heartbeats, and the push/pull client that gives
// up when they stop answering them. Destroyed client first.
struct Connection {
  std::unique_ptr<parasync::Heartbeater> heartbeater;
  std::unique_ptr<parasync::PsClient> client;
  // A blocked pull gives up when a server has not answered heartbeats for this long.
  std::chrono::milliseconds silence_limit{0};
};

// Starts the heartbeats and connects the client; an exit status if either fails.
std::optional<int> Connect(zmq::context_t& context, const WorkerFlags& f, const WorkerConfig& c,
                           parasync::WorkerMetrics& metrics, Connection* conn) {
  using namespace parasync;
  PsClientOptions client_options;
  client_options.ps_addresses = c.ps_endpoints;
  client_options.rank = c.rank;
  client_options.request_timeout = Millis(f.request_timeout_s);
  client_options.curve = c.curve;
  client_options.wire_dtype = c.wire;
  client_options.topk_probe.enabled = f.topk_probe == "on";
  client_options.delta_pulls = f.delta_pulls == "on";
  client_options.copy_threads = f.copy_threads;
  client_options.local_group = c.local_group;
  auto heartbeater = Heartbeater::Start(
      context, c.ps_endpoints, c.rank,
      std::chrono::milliseconds(static_cast<int64_t>(f.heartbeat_interval_s * 1000)), c.curve);
  if (!heartbeater.ok()) return Fail(heartbeater.status().message());
  conn->heartbeater = std::move(heartbeater).value();
  // A blocked pull gives up when asked to stop, or when a server has stopped answering
  // heartbeats for longer than the request plus connect timeouts (it died: waiting would
  // never end).
  conn->silence_limit = Millis(f.request_timeout_s) + Millis(f.connect_timeout_s);
  Heartbeater* beats = conn->heartbeater.get();
  client_options.interrupted = [beats, silence_limit = conn->silence_limit] {
    return ShutdownRequested() || beats->LongestSilence() > silence_limit;
  };
  // A parameter server that restarts (and restores its data directory) announces a new
  // incarnation in its heartbeat replies: requests to it are registered again and resent.
  client_options.incarnation_of = [beats](int shard) { return beats->Incarnation(shard); };
  client_options.pulls_may_wait = c.mode.kind != TrainingMode::Kind::kAsync;
  client_options.loop = &metrics.loop;  // the training thread's turns, for /healthz
  auto client = PsClient::Connect(context, client_options);
  if (!client.ok()) return Fail(client.status().message());
  conn->client = std::move(client).value();
  return std::nullopt;
}

parasync::ModelRegistration RegistrationOf(const parasync::Model& net, const WorkerFlags& f,
                                           const WorkerConfig& c,
                                           const parasync::OptimizerSpec& opt) {
  using namespace parasync;
  ModelRegistration reg;
  // Dense variables as slices; sparse embedding tables as rows by id.
  reg.variables = net.dense_variables();
  for (const SparseTable& t : net.sparse_tables()) reg.tables.push_back(t.spec);
  // The description travels with the registration, so parasync-export can record it.
  ModelSpec described = net.spec();
  described.input = net.input_shape();
  reg.model = ModelSpecToJson(described);
  reg.optimizer = opt;
  reg.seed = f.seed;
  reg.max_slice_elements = f.max_slice_elements;
  reg.num_shards = static_cast<int32_t>(c.cluster.ps.size());
  reg.mode = c.mode.ToString();
  return reg;
}

// Registers the model with every server; an exit status if training is not to start.
std::optional<int> RegisterModel(parasync::PsClient& client, const parasync::ModelRegistration& reg,
                                 const WorkerFlags& f) {
  using namespace parasync;
  if (Status s = client.Register(reg, Millis(f.connect_timeout_s)); !s.ok()) {
    if (ShutdownRequested()) {
      spdlog::info("stopped by signal {} before training", ShutdownSignal());
      return 0;
    }
    // Refused by a server (another --mode, another model, another shard count): no retry
    // changes that. Unreachable servers or a timeout may pass.
    const bool refused = s.code() == StatusCode::kFailedPrecondition ||
                         s.code() == StatusCode::kInvalidArgument;
    return Fail("registration failed: " + s.ToString(), refused ? kExitBadUsage : kExitRetryable);
  }
  spdlog::info("registered {} variables as {} slices on {} parameter server(s)",
               reg.variables.size(), client.slice_map().slices().size(), reg.num_shards);
  return std::nullopt;
}

parasync::TrainerOptions TrainerOptionsOf(const WorkerFlags& f, const WorkerConfig& c,
                                          const parasync::Model& net,
                                          const parasync::OptimizerSpec& opt) {
  parasync::TrainerOptions options;
  options.rank = c.rank;
  options.num_workers = static_cast<int>(c.cluster.workers.size());
  options.mode = c.mode;
  options.shuffle = !f.no_shuffle;
  options.step_delay = Millis(f.step_delay_s);
  options.slowdown = f.slowdown;
  options.weight_prediction = f.weight_prediction;
  options.checkpoint_each_epoch = f.checkpoint_each_epoch;
  options.wait_for_workers_seconds = f.wait_for_workers_s;
  options.epochs = f.epochs;
  options.batch_size = f.batch_size;
  options.max_steps = f.max_steps;
  options.eval_every_steps = c.eval_every_steps;
  options.eval_every_seconds = c.eval_every_seconds;
  options.max_seconds = f.max_seconds;
  options.log_every_seconds = f.log_every_s;
  options.seed = f.seed;
  options.log_dir = f.log_dir;
  options.model = net;
  options.optimizer = opt;
  return options;
}

// After training: the metrics snapshot, then the outcome's log line; the exit status.
int Finish(const parasync::Result<parasync::TrainingSummary>& summary, const WorkerFlags& f,
           int rank, parasync::WorkerMetrics& metrics, const Connection& conn) {
  using namespace parasync;
  const std::string snapshot = MetricsSnapshotPath(f.log_dir, "worker" + std::to_string(rank));
  if (Status w = WriteMetricsSnapshot(*metrics.registry, snapshot); !w.ok()) {
    spdlog::warn("metrics snapshot not written: {}", w.message());
  }
  if (ShutdownRequested()) {
    spdlog::info("stopped by signal {}", ShutdownSignal());
    return 0;
  }
  if (!summary.ok()) {
    if (conn.heartbeater->LongestSilence() > conn.silence_limit) {
      return Fail("training failed: a parameter server has not answered for " +
                  std::to_string(conn.heartbeater->LongestSilence().count() / 1000) + " s (" +
                  summary.status().message() + ")");
    }
    return Fail("training failed: " + summary.status().ToString());
  }
  if (rank == 0) {
    spdlog::info("training done: {} epochs, {} steps here; final test accuracy {:.4f}, test loss "
                 "{:.4f}{}; eval log {}/eval.jsonl",
                 summary->epochs_done, summary->steps, summary->final_test_accuracy,
                 summary->final_test_loss,
                 summary->final_test_auc >= 0
                     ? fmt::format(", test AUC {:.4f}", summary->final_test_auc)
                     : std::string(),
                 f.log_dir);
  } else {
    spdlog::info("training done: {} epochs, {} steps, {} gradients dropped as stale",
                 summary->epochs_done, summary->steps, summary->dropped);
  }
  return 0;
}

// Training with validated flags: data, model, metrics, backend, servers, the loop.
int Run(const WorkerFlags& f, const WorkerConfig& c) {
  using namespace parasync;
  if (auto exit = SetUpProcess(f, c.rank)) return *exit;
  Dataset train;
  Dataset test;
  OptimizerSpec opt = c.optimizer;
  if (Status s = LoadData(f, c.rank, &train, &test, &opt); !s.ok()) {
    return Fail(s.message(), kExitBadUsage);
  }
  // The model meets its data: shapes layer by layer, then the labels against its outputs. A
  // sparse table's compact buffer holds a batch's distinct ids (SparseRowsNeeded).
  auto built = Model::Build(
      c.model, ModelInputShape(train),
      {train.id_columns, SparseRowsNeeded(f.batch_size, std::max<int64_t>(1, train.id_columns))});
  if (!built.ok()) return Fail(built.status().message(), kExitBadUsage);
  const Model& net = *built;
  if (train.id_columns > 0 && net.sparse_tables().empty()) {
    return Fail("the data has " + std::to_string(train.id_columns) + " id columns (" +
                    f.data_dir + "/train_ids.npy) but model '" + net.spec().name +
                    "' has no sparse embedding to read them (see docs/models.md, \"ctr\")",
                kExitBadUsage);
  }
  if (Status s = net.CheckLabelsFit(std::max(MaxLabel(train), MaxLabel(test))); !s.ok()) {
    return Fail("model '" + net.spec().name + "': " + s.message(), kExitBadUsage);
  }
  WorkerMetrics metrics(c.rank, net.spec().name, net.num_parameters());
  int metrics_port = 0;
  if (auto exit = StartMetrics(f, c, metrics, &metrics_port)) return *exit;
  SetCpuComputeThreads(f.compute_threads);
  std::string why;
  auto backend = CreateBackend(c.device, net, c.local_rank, &why);
  if (!backend.ok()) return Fail(backend.status().message(), kExitBadUsage);
  const auto num_workers = static_cast<int64_t>(c.cluster.workers.size());
  if (c.rank == 0) spdlog::info("{}", net.Summary());
  spdlog::info("rank {}/{}: compute on {} ({}; denormals {}); {} training examples in this "
               "shard; metrics on http://{}:{}/metrics",
               c.rank, c.cluster.workers.size(), (*backend)->name(), why,
               CpuComputeThreadsFlushDenormals() ? "flushed to zero" : "kept (PARASYNC_DENORMALS)",
               (train.n + num_workers - 1 - c.rank) / num_workers, c.metrics_ip, metrics_port);
  const char* parameters =
      f.delta_pulls == "on"
          ? "parameters as changes to this worker's copy of them in the same format (delta pulls)"
          : "parameters as bfloat16 (half)";
  if (c.wire.dtype == DType::kInt8 || c.wire.dtype == DType::kInt4) {
    spdlog::info("gradients travel as {} with error feedback ({} of float32's bytes), {}",
                 DTypeName(c.wire.dtype), c.wire.dtype == DType::kInt8 ? "a quarter" : "an eighth",
                 parameters);
  } else if (c.wire.dtype == DType::kTopK) {
    spdlog::info("gradients travel as {} with error feedback ({} of every 256 elements in "
                 "int8), {}",
                 WireFormatName(c.wire), c.wire.keep, parameters);
  } else if (c.wire.dtype != DType::kFloat32) {
    spdlog::info("parameters and gradients travel as {} (half the bytes of float32)",
                 DTypeName(c.wire.dtype));
  }
  zmq::context_t context(1);
  Connection conn;
  if (auto exit = Connect(context, f, c, metrics, &conn)) return *exit;
  if (auto exit = RegisterModel(*conn.client, RegistrationOf(net, f, c, opt), f)) return *exit;
  auto summary = RunTraining(TrainerOptionsOf(f, c, net, opt), train, test, *conn.client,
                             **backend, metrics, [] { return ShutdownRequested(); });
  return Finish(summary, f, c.rank, metrics, conn);
}

// --eval-only: `--eval-only --model FILE.psm` works too (a --model that describes no model
// is the model file).
int RunEvalOnlyFlags(const CLI::App& app, WorkerFlags& f) {
  std::optional<std::string> described;
  if (app.count("--model") > 0) described = f.model;
  if (f.model_file.empty() && described && !parasync::ResolveModelSpec(*described).ok()) {
    f.model_file = *described;
    described.reset();
  }
  return RunEvalOnly(f.model_file, f.data_dir, described, f.compute_threads);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app;
  WorkerFlags flags;
  SetUpWorkerCommandLine(app, flags);
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  if (app.count("--step-delay-ms") > 0) {
    if (app.count("--step-delay") > 0) {
      return Fail("--step-delay and --step-delay-ms (its old form) both given: give one",
                  kExitBadUsage);
    }
    flags.step_delay_s = flags.step_delay_ms / 1000.0;
  }
  if (flags.eval_only) return RunEvalOnlyFlags(app, flags);
  if (!flags.model_file.empty()) {
    return Fail("--model-file is only used with --eval-only", kExitBadUsage);
  }
  auto config = Validate(flags);
  if (!config.ok()) return Fail(config.status().message(), kExitBadUsage);
  if (flags.check) return RunCheck(flags, *config);
  return Run(flags, *config);
}

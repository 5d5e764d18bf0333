// parasync-launch: runs a local parasync cluster. The flags are parsed here (the only
// translation unit that includes CLI11); the work is done by parasync::launch::Launcher.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <set>
#include <string>

#include <cstdlib>

#include "common/cli.h"
#include "common/float_codec.h"
#include "common/model_spec.h"
#include "common/process.h"
#include "common/version.h"
#include "deploy/launch/launcher.h"
#include "deploy/launch/preflight.h"
#include "worker/data/dataset.h"

namespace {

using parasync::StatusCode;
using parasync::launch::kExitFailed;
using parasync::launch::kExitUsage;
using parasync::launch::Launcher;
using parasync::launch::LaunchOptions;
using parasync::Status;

constexpr const char* kProgram = "parasync-launch";

constexpr const char* kDetails =
    "Starts the parameter servers (parasync-ps), then the workers (parasync-worker, or your "
    "own program with --worker-command), on --host: each server binds a free port and says "
    "which in <log-dir>/<name>.ready, and the workers are started with those (multi-host: "
    "--port-base). Forwards their output prefixed with [ps0], [worker1], ... and writes it "
    "to <log-dir>/<name>.log. After its last epoch worker 0 (the chief) waits for the other "
    "workers to finish theirs (up to --finish-timeout) and evaluates the model they trained; "
    "once every worker has exited (or been stopped: SIGTERM, then SIGKILL after "
    "--grace-seconds), the launcher stops the parameter servers and prints where the results "
    "are. With --export FILE, parasync-export writes the model to FILE after the workers "
    "exited, before the parameter servers are stopped. Worker i gets --local-rank i, so on a "
    "machine with several GPUs each worker computes on its own.\n\n"
    "Before it starts anything it checks what would make a process refuse to start: the data "
    "set (--dataset, or the worker's default) present and readable (for --worker-command: "
    "--dataset, when given, a directory), counts consistent, ports free, a --state-dir "
    "holding something else or the stores of another run.\n\n"
    "Values that begin with '-' are safest written with '=': --worker-arg=--device=cpu.";

constexpr const char* kExitStatus =
    "Status 2 also when a process exited 2 (it refused its flags, data or state); 1 when one "
    "failed otherwise or had to be killed; 130 when interrupted. A failed export fails the run.";

constexpr const char* kExamples =
    "parasync-launch --ps 2 --workers 2 --mode ssp:3 --epochs 5 --lr 0.05 \\\n"
    "      --log-dir runs/ssp3 --worker-arg=--device=cpu\n"
    "   Then: runs/ssp3/eval.jsonl (the chief's evaluations), runs/ssp3/worker0.log, ...,\n"
    "   runs/ssp3/cluster.json (pids, the addresses and metrics ports bound, command lines).\n"
    "parasync-launch --ps 2 --workers 2 --epochs 5 --export runs/model.psm\n"
    "   Then: parasync-worker --eval-only --model-file runs/model.psm\n"
    "parasync-launch --ps 2 --workers 4 --mode sync --rank-arg 3:--slowdown=4 \\\n"
    "      --kill ps:1@20+5 --state-dir runs/faults/state --log-dir runs/faults\n"
    "   Then: worker 3 computes 4x slower; ps1 is killed 20 s in and restarted 5 s later\n"
    "   from its state directory.\n"
    "parasync-launch --ps 2 --workers 2 --worker-command \"python3 train.py --epochs 3\" \\\n"
    "      --log-dir runs/torch --rank-arg '1:--note=a b'\n"
    "   Then: each worker runs /bin/sh -c 'exec python3 train.py --epochs 3' (worker 1 with\n"
    "   '--note=a b' appended), the cluster in TF_CONFIG and its settings in PARASYNC_*\n"
    "   variables (docs/worker-environment.md); --dry-run prints them.\n"
    "parasync-launch --ps node1:1 -H node1:2,node2:2 --mode sync --log-dir /shared/run1 \\\n"
    "      --dataset /shared/fashion-mnist --check     (then without --check to run)\n"
    "   Then: 1 PS on node1, workers 0-1 on node1 and 2-3 on node2, started over ssh;\n"
    "   --dry-run prints the commands instead.\n"
    "parasync-launch --mode sync --epochs 20 --log-dir runs/watch --metrics\n"
    "   Beside it: tools/watch-run.sh runs/watch (Prometheus on http://127.0.0.1:9090,\n"
    "   scraping runs/watch/prometheus-targets.json); Ctrl-C ends the --metrics serving.";

// CLI11 validator: a non-negative (or, with `positive`, positive) decimal integer.
CLI::Validator IntegerValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& value) -> std::string {
        int64_t parsed = 0;
        if (!CLI::detail::lexical_cast(value, parsed) || parsed < (positive ? 1 : 0)) {
          return std::string(positive ? "a positive" : "a non-negative") +
                 " integer is required, got '" + value + "'";
        }
        return std::string();
      },
      std::string());
}

// CLI11 validator: a finite number > 0 (or, without `positive`, >= 0).
CLI::Validator NumberValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& value) -> std::string {
        double parsed = 0;
        if (!CLI::detail::lexical_cast(value, parsed) || !std::isfinite(parsed) ||
            parsed < 0 || (positive && parsed == 0)) {
          return std::string(positive ? "a number > 0" : "a number >= 0") +
                 " is required, got '" + value + "'";
        }
        return std::string();
      },
      std::string());
}

void AddOptional(CLI::App& app, const std::string& name, const std::string& type_name,
                 std::optional<std::string>& target, const std::string& help,
                 const CLI::Validator& check) {
  app.add_option_function<std::string>(
         name, [&target](const std::string& value) { target = value; }, help)
      ->check(check)
      ->type_name(type_name);
}

// Everything the command line sets: the options, and the flags read further after CLI11.
struct Flags {
  LaunchOptions options;
  std::string ps;                      // --ps: a count, or host:N,host:N
  std::string worker_hosts;            // -H
  CLI::Option* workers = nullptr;      // --workers, to tell whether it was given
  std::optional<bool> ipc;             // --ipc / --no-ipc; unset: on for --ps colocated
  std::vector<std::string> rank_args;  // --rank-arg RANK:ARG
  std::vector<std::string> kills;      // --kill WHO@S[+R]
  bool dry_run = false;
  bool check = false;
};

// --ps ... --check: how many processes, where, and what to do instead of a run.
void AddClusterFlags(CLI::App& app, Flags& flags) {
  LaunchOptions& options = flags.options;
  flags.ps = std::to_string(options.num_ps);
  app.add_option("--ps", flags.ps,
                 "Number of parameter-server processes, or where they run: host:N,host:N "
                 "(multi-host; without it they go round-robin over the -H hosts), or "
                 "'colocated': one on every -H host, beside its workers, so each host's "
                 "link carries its share of the model both ways")
      ->capture_default_str()
      ->type_name("N|HOSTS");
  // A flag function: CLI11 leaves an optional<bool> flag set (false) when it is not given.
  app.add_flag_function(
      "--ipc,!--no-ipc", [&flags](int64_t count) { flags.ipc = count > 0; },
      "Workers reach the parameter server on their own host over a unix socket "
      "(/tmp/parasync-ps-HOST-PORT.sock) instead of TCP [default: on with --ps colocated, off "
      "otherwise]");
  flags.workers =
      app.add_option("--workers", options.num_workers,
                     "Number of worker processes; worker 0 is the chief [default: 2, or the "
                     "-H slots]")
          ->type_name("N");
  app.add_option("-H,--hosts", flags.worker_hosts,
                 "Multi-host: where the workers run, host:slots,host:slots (as horovodrun -H); "
                 "processes on hosts other than localhost start over --ssh-command")
      ->type_name("HOSTS");
  app.add_option("--ssh-command", options.ssh_command,
                 "Multi-host: how to reach a host, run as CMD HOST COMMAND (plain words)")
      ->capture_default_str()
      ->type_name("CMD");
  app.add_option("--remote-bin-dir", options.remote_bin_dir,
                 "Multi-host: where the binaries are on the other hosts [default: --bin-dir]")
      ->type_name("DIR");
  app.add_option("--port-base", options.port_base,
                 "Multi-host: service ports are PORT, PORT+1, ... per host, metrics ports "
                 "PORT+500, ...")
      ->capture_default_str()
      ->type_name("PORT");
  app.add_flag("--dry-run", flags.dry_run,
               "Print every process's command line (with its host) and exit");
  app.add_flag("--check", flags.check,
               "Preflight: run every process's binary with --check where it would run (every "
               "host reachable, ports free, data present, the same version, protocol and "
               "schema everywhere) and print one line per problem; exit 0 when all is clear. "
               "--worker-command workers are not run: only their host's reachability, their "
               "--dataset directory's presence and (on this host, with --port-base) their "
               "metrics port are checked, not the command, its version or the data's format");
}

// --mode ... --export: the run and where it leaves its files.
void AddRunFlags(CLI::App& app, LaunchOptions& options) {
  app.add_option("--mode", options.mode,
                 "async, sync, sync:delayed or ssp:<staleness>; passed to every process")
      ->capture_default_str()
      ->type_name("MODE");
  app.add_option("--epochs", options.epochs, "Training epochs, passed to workers")
      ->capture_default_str()
      ->type_name("N");
  app.add_option("--log-dir", options.log_dir,
                 "Logs, cluster.json, eval.jsonl, metrics files [default: "
                 "./runs/<YYYYmmdd-HHMMSS>]")
      ->type_name("DIR");
  app.add_option("--dataset", options.data_dir,
                 "The data set's directory, passed to workers when given (default: the "
                 "worker's, " + std::string(parasync::kDefaultDataDir) + "); old name --data")
      ->type_name("DIR");
  parasync::AddHiddenAlias(app, "--data", options.data_dir);
  app.add_option("--state-dir", options.ps_data_dir,
                 "The parameter servers' state: PS i keeps its store in DIR/ps<i> and restores "
                 "it at start (default: memory only); old name --data-dir")
      ->type_name("DIR");
  parasync::AddHiddenAlias(app, "--data-dir", options.ps_data_dir);
  app.add_option("--export", options.export_path,
                 "After the chief finished: write the model to FILE with parasync-export, "
                 "before the parameter servers are stopped")
      ->type_name("FILE");
}

// The Training group (passed to workers) and the Modes group (passed to parameter servers).
void AddTrainingFlags(CLI::App& app, LaunchOptions& options) {
  CLI::App& training = *app.add_option_group("Training", "Passed to workers only when given");
  AddOptional(training, "--batch-size", "N", options.batch_size, "Per-worker batch size",
              IntegerValidator(true));
  AddOptional(training, "--lr", "X", options.lr, "Learning rate", NumberValidator(true));
  AddOptional(training, "--optimizer", "NAME", options.optimizer, "Optimizer name",
              CLI::Validator());
  AddOptional(training, "--lr-schedule", "NAME", options.lr_schedule,
              "constant, or cosine: the learning rate decays to 0 over the run's epochs",
              CLI::Validator(
                  [](std::string& value) -> std::string {
                    if (parasync::ParseLrSchedule(value).ok()) return std::string();
                    return "constant or cosine is required, got '" + value + "'";
                  },
                  std::string()));
  AddOptional(training, "--model", "M", options.model,
              "Model: mlp, cnn, lenet5, MLP widths or a JSON model file (docs/models.md)",
              CLI::Validator());
  AddOptional(training, "--seed", "N", options.seed, "Random seed", IntegerValidator(false));
  AddOptional(training, "--max-steps", "N", options.max_steps,
              "Stop each worker after this many steps", IntegerValidator(false));
  AddOptional(training, "--eval-every", "N|Ns", options.eval_every,
              "The chief also evaluates within each epoch, every N of its steps or N seconds "
              "(30s), a row of eval.jsonl each",
              CLI::Validator(
                  [](std::string& value) -> std::string {
                    const bool timed = !value.empty() && value.back() == 's';
                    const std::string n = timed ? value.substr(0, value.size() - 1) : value;
                    const bool digits = !n.empty() && n.find_first_not_of(
                        timed ? "0123456789." : "0123456789") == std::string::npos;
                    return digits ? std::string()
                                  : "a number of steps (100) or seconds (30s) is required, got '" +
                                        value + "'";
                  },
                  std::string()));
  AddOptional(training, "--wire-dtype", "DTYPE", options.wire_dtype,
              "How tensors travel: float32, bfloat16 or float16 (half the bytes), int8 "
              "(gradients in a quarter, with error feedback), int4 (an eighth, the same way), or "
              "topk[:R] (of every 256 "
              "gradient elements the R * 256 largest, default R 1/32, with error feedback; "
              "docs/compression.md)",
              CLI::Validator(
                  [](std::string& value) -> std::string {
                    if (parasync::ParseWireFormat(value)) return std::string();
                    return "float32, bfloat16, float16, int8, int4 (bf16, fp16), topk or topk:R with R "
                           "in (0, 1] is required, got '" + value + "'";
                  },
                  std::string()));
  AddOptional(training, "--topk-probe", "on|off", options.topk_probe,
              "With --wire-dtype int8, int4 or topk: on (the workers' default) tries, after "
              "the first 20 steps, top-k against int8 and then float32, and keeps the "
              "fastest, saying which (compression off where it does not pay); off keeps "
              "the format given whatever it costs",
              CLI::IsMember({"on", "off"}));
  AddOptional(training, "--delta-pulls", "on|off", options.delta_pulls,
              "With --wire-dtype int8, int4 or topk and the servers' optimizer: on (the workers' "
              "default) pulls parameters as changes to each worker's copy of them in the "
              "pushes' format (int8: a quarter of float32's bytes, int4 an eighth); off pulls them in "
              "bfloat16",
              CLI::IsMember({"on", "off"}));
  AddOptional(training, "--log-every", "SECONDS", options.log_every,
              "Each worker logs a progress line within its epochs at most this often",
              NumberValidator(false));
  training.add_flag("--checkpoint-each-epoch", options.checkpoint_each_epoch,
                    "Passed to workers: checkpoint the model after every epoch");
  training.add_flag("--local-aggregation", options.local_aggregation,
                    "Sync modes: the workers of a host exchange each step through one of them, "
                    "which pushes their summed gradients once and pulls once for all (the "
                    "host's link carries 1/k of the bytes for k workers; each step is still "
                    "the average over every worker)");

  CLI::App& modes = *app.add_option_group("Modes", "Passed to parameter servers only when given");
  AddOptional(modes, "--replicas-to-aggregate", "R", options.replicas_to_aggregate,
              "sync: gradients per step, at most --workers (fewer makes backup workers); "
              "checked, like every count and rank, before anything starts",
              IntegerValidator(true));
  AddOptional(modes, "--worker-timeout", "S", options.worker_timeout,
              "Seconds of silence before a worker is declared dead", NumberValidator(true));
}

// --ps-arg ... --host: the processes' extra arguments, keys, faults, binaries and endpoints.
void AddProcessFlags(CLI::App& app, Flags& flags) {
  LaunchOptions& options = flags.options;
  app.add_option("--ps-arg", options.ps_args, "Extra argument for every PS; repeatable")
      ->allow_extra_args(false)
      ->type_name("ARG");
  app.add_option("--worker-arg", options.worker_args,
                 "Extra argument for every worker; repeatable (with --worker-command: appended "
                 "to the command, shell-quoted)")
      ->allow_extra_args(false)
      ->type_name("ARG");
  app.add_option_function<std::string>(
         "--worker-command",
         [&options](const std::string& value) { options.worker_command = value; },
         "Run your own program as every worker instead of parasync-worker: CMD is one shell "
         "command (a program and its arguments), run as /bin/sh -c 'exec CMD ARGS' with "
         "--worker-arg and --rank-arg values as ARGS, shell-quoted. It gets the cluster and "
         "the settings in its environment, not as flags: TF_CONFIG, LOCAL_RANK, "
         "PARASYNC_MODE, PARASYNC_LOG_DIR, PARASYNC_METRICS_PORT, PARASYNC_EPOCHS, ... "
         "(docs/worker-environment.md), and writes eval.jsonl and metrics-worker<i>.prom "
         "itself for the summary. E.g. --worker-command \"python3 train.py --epochs 3\"")
      ->type_name("CMD");
  app.add_option("--curve-dir", options.curve_dir,
                 "Authenticate and encrypt every connection with CurveZMQ, keys in DIR "
                 "(ps.key, worker<i>.key, export.key, allowed/; the missing ones are made)")
      ->type_name("DIR");
  app.add_option("--rank-arg", flags.rank_args,
                 "Extra argument for one worker, as RANK:ARG (e.g. 3:--slowdown=4); repeatable "
                 "(with --worker-command: appended to the command, shell-quoted)")
      ->allow_extra_args(false)
      ->type_name("RANK:ARG");
  app.add_option("--kill", flags.kills,
                 "Fault injection: kill a process with SIGKILL SECONDS after the start, and "
                 "with +RESTART start it again that many seconds later (same command line): "
                 "ps:INDEX@SECONDS[+RESTART] or worker:INDEX@SECONDS[+RESTART], INDEX > 0 for "
                 "workers. A killed process is no failure of the run; repeatable")
      ->allow_extra_args(false)
      ->type_name("WHO@S[+R]");
  app.add_option("--bin-dir", options.bin_dir,
                 "Where parasync-ps and parasync-worker are [default: the directory of "
                 "this executable]; with --worker-command, DIR/../python (when it exists) "
                 "goes first in the workers' PYTHONPATH")
      ->type_name("DIR");
  parasync::AddSecondsOption(app, "--grace-seconds", options.grace_seconds,
                             "Seconds a process gets after SIGTERM before SIGKILL", 0.0, 86400.0);
  parasync::AddSecondsOption(
      app, "--finish-timeout", options.finish_timeout,
      "How long the chief, after its last epoch, waits for the other workers to finish theirs "
      "before its final evaluation; workers still running " +
          parasync::launch::FormatSeconds(parasync::launch::kWorkerExitSeconds) +
          " s after the chief exited are then stopped, and summary.json says so",
      0.0, 1e9);
  app.add_flag("--stop-workers-with-chief", options.stop_workers_with_chief,
               "Stop the other workers as soon as the chief finishes, without waiting for their "
               "last epoch (the final evaluation then misses the rest of their work)");
  app.add_option("--job", options.job,
                 "Prometheus job label of this run in <log-dir>/prometheus-targets.json "
                 "[default: the log directory's name]")
      ->type_name("NAME");
  app.add_flag("--metrics", options.serve_metrics,
               "After the run, keep every metrics port answering with the process's final "
               "metrics until Ctrl-C, so Prometheus and Grafana keep the final values");
  app.add_option("--host", options.host,
                 "Host name or IPv4 address (four octets 0-255) used in the cluster spec and "
                 "metrics URLs")
      ->capture_default_str()
      ->type_name("HOST");
}

// --ps and -H into counts and placements.
Status ParsePlacement(Flags& flags) {
  LaunchOptions& options = flags.options;
  const bool colocated = flags.ps == "colocated";
  if (colocated) {
    if (flags.worker_hosts.empty()) {
      return Status::InvalidArgument(
          "--ps colocated puts one parameter server on every -H host: it needs -H");
    }
  } else if (flags.ps.find_first_not_of("0123456789") == std::string::npos && !flags.ps.empty()) {
    try {
      options.num_ps = std::stoi(flags.ps);
    } catch (const std::exception&) {
      return Status::InvalidArgument("--ps " + flags.ps + " is out of range");
    }
  } else {
    auto placement = parasync::launch::ParseHostSlots(flags.ps, "--ps");
    if (!placement.ok()) return placement.status();
    options.ps_placement = *placement;
    options.num_ps = 0;
    for (const auto& h : options.ps_placement) options.num_ps += h.count;
  }
  if (!flags.worker_hosts.empty()) {
    auto placement = parasync::launch::ParseHostSlots(flags.worker_hosts, "-H");
    if (!placement.ok()) return placement.status();
    options.worker_placement = *placement;
    int slots = 0;
    for (const auto& h : options.worker_placement) slots += h.count;
    if (flags.workers->count() == 0) options.num_workers = slots;
  }
  if (colocated) {
    options.ps_placement.clear();
    for (const auto& h : options.worker_placement) {
      const bool seen = std::any_of(options.ps_placement.begin(), options.ps_placement.end(),
                                    [&](const auto& p) { return p.host == h.host; });
      if (!seen) options.ps_placement.push_back({h.host, 1});
    }
    options.num_ps = static_cast<int>(options.ps_placement.size());
  }
  options.local_ipc = flags.ipc.value_or(colocated);
  return Status::Ok();
}

// Completes flags.options from the flags CLI11 left as text (--ps, -H, --rank-arg, --kill);
// InvalidArgument with the line to print otherwise.
Status CompleteOptions(Flags& flags) {
  PARASYNC_RETURN_IF_ERROR(ParsePlacement(flags));
  for (const std::string& item : flags.rank_args) {
    const size_t colon = item.find(':');
    int rank = -1;
    const char* end = item.data() + (colon == std::string::npos ? item.size() : colon);
    auto [p, ec] = std::from_chars(item.data(), end, rank);
    if (colon == std::string::npos || colon == 0 || ec != std::errc() || p != end ||
        colon + 1 == item.size()) {
      return Status::InvalidArgument("--rank-arg takes RANK:ARG, e.g. 1:--slowdown=4, not '" +
                                     item + "'");
    }
    flags.options.rank_args.emplace_back(rank, item.substr(colon + 1));
  }
  for (const std::string& item : flags.kills) {
    PARASYNC_ASSIGN_OR_RETURN(parasync::launch::Fault fault, parasync::launch::ParseFault(item));
    flags.options.faults.push_back(fault);
  }
  return Status::Ok();
}

// --dry-run: every process's command line with its host.
int PrintDryRun(const LaunchOptions& options, const Launcher& launcher) {
  for (const auto& spec : launcher.plan().processes) {
    std::cout << spec.name << " on " << spec.host << ": "
              << parasync::launch::DisplayCommand(spec) << "\n";
  }
  if (!parasync::launch::IsMultiHost(options)) {
    std::cout << "# each server binds a free port (:0) and writes it to its --ready-file; the "
                 "workers are started with those ports in place of :0\n";
  }
  return 0;
}

// --check: one line per problem, or that all is clear.
int RunCheck(Launcher& launcher) {
  const std::vector<std::string> problems = launcher.Preflight();
  for (const std::string& problem : problems) {
    parasync::PrintErrorLine(kProgram, "check: " + problem, 1);
  }
  if (problems.empty()) {
    std::set<std::string> hosts;
    for (const auto& spec : launcher.plan().processes) hosts.insert(spec.host);
    std::cout << kProgram << ": check passed: " << launcher.plan().processes.size()
              << " processes on " << hosts.size() << " host(s), all "
              << parasync::BuildVersion() << "\n";
  }
  return problems.empty() ? 0 : 1;
}

// The run itself, after the local preflight: start, supervise, tell, and serve the final
// metrics when asked.
int RunCluster(const LaunchOptions& options, Launcher& launcher) {
  // Whatever would make a process here refuse to start is said now, and nothing starts.
  if (const std::vector<std::string> problems =
          parasync::launch::LocalPreflight(options, launcher.plan());
      !problems.empty()) {
    for (const std::string& problem : problems) {
      parasync::PrintErrorLine(kProgram, problem, kExitUsage);
    }
    return kExitUsage;
  }
  // The children's log lines are prefixed with their names here: they leave theirs out.
  setenv(parasync::kLogPrefixedVariable, "1", 1);
  // A directory that cannot be made for good (common/file_util.h's PathError) is the user's
  // to change, as a bad flag is; anything else may pass on a retry.
  const Status started = launcher.Start();
  if (!started.ok()) {
    return parasync::PrintErrorLine(kProgram, started.message(),
                                    parasync::StartupExitCode(started) == parasync::kExitBadUsage
                                        ? kExitUsage
                                        : kExitFailed);
  }
  const int exit_code = launcher.Supervise();
  std::cout << launcher.Summary() << std::flush;
  if (options.serve_metrics && exit_code != parasync::launch::kExitInterrupted) {
    const Status served = launcher.ServeFinalMetrics();
    if (!served.ok()) parasync::PrintErrorLine(kProgram, "--metrics: " + served.message(), 0);
  }
  return exit_code;
}

// What the flags ask for: the plan, then a dry run, a check or the run.
int Run(const Flags& flags) {
  const LaunchOptions& options = flags.options;
  auto launcher = Launcher::Create(options);
  if (!launcher.ok()) {
    const Status status = launcher.status();
    const bool usage = status.code() == StatusCode::kInvalidArgument ||
                       status.code() == StatusCode::kNotFound;
    return parasync::PrintErrorLine(kProgram, status.message(), usage ? kExitUsage : kExitFailed);
  }
  if (!options.curve_dir.empty() && !flags.dry_run) {
    // Made before anything starts, so every process finds its key.
    const Status keys = parasync::launch::EnsureCurveKeys(options.curve_dir, options.num_workers);
    if (!keys.ok()) return parasync::PrintErrorLine(kProgram, keys.message(), kExitFailed);
  }
  if (flags.dry_run) return PrintDryRun(options, **launcher);
  if (flags.check) return RunCheck(**launcher);
  return RunCluster(options, **launcher);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  flags.options.command_line.assign(argv, argv + argc);  // for summary.json
  CLI::App app;
  parasync::SetUpCommandLine(app, {.name = kProgram,
                                   .purpose = "runs a local or multi-host parasync cluster.",
                                   .details = kDetails,
                                   .exit_status = kExitStatus,
                                   .examples = kExamples});
  AddClusterFlags(app, flags);
  AddRunFlags(app, flags.options);
  AddTrainingFlags(app, flags.options);
  AddProcessFlags(app, flags);
  if (auto done = parasync::ParseCommandLine(app, argc, argv)) return *done;
  if (const Status completed = CompleteOptions(flags); !completed.ok()) {
    return parasync::PrintErrorLine(kProgram, completed.message(), kExitUsage);
  }
  return Run(flags);
}

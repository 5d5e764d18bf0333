// parasync-export: gathers the whole model from every parameter-server shard into one file
// (docs/model-format.md), for parasync-worker --eval-only or any other reader.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/cluster_spec.h"
#include "common/model_file.h"
#include "common/process.h"
#include "worker/ps_client.h"

namespace {

constexpr const char* kProgram = "parasync-export";

int Fail(const std::string& line, int code = parasync::kExitRetryable) {
  return parasync::PrintErrorLine(kProgram, line, code);
}

// Empty when a file can be written at `path` (its directory exists and is writable), else why
// not: checked before the servers are asked, so a typo costs no transfer.
std::string OutProblem(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path + " is a directory";
  if (!std::filesystem::is_directory(dir, ec)) return dir.string() + " is not a directory";
  if (::access(dir.c_str(), W_OK) != 0) {
    return "cannot write in " + dir.string() + ": " + std::strerror(errno);
  }
  return std::string();
}

// The command line, as --help lists it.
struct ExportFlags {
  parasync::ClusterFlags cluster;
  std::string out;
  double timeout_s = 30;
  std::string curve_key_file;
  std::string curve_server_key_file;
};

void SetUpExportCommandLine(CLI::App& app, ExportFlags& f) {
  using namespace parasync;
  SetUpCommandLine(
      app,
      {.name = kProgram,
       .purpose = "writes the model held by the parameter servers to one file "
                  "(docs/model-format.md).",
       .details = "The cluster may also come from TF_CONFIG. The servers keep training "
                  "meanwhile: the file holds each shard's values at the moment it answered "
                  "(metadata lists their versions). Against servers with --curve-key, give "
                  "--curve-key and --curve-server-key too.",
       .exit_status = "Status 2 also for an --out that cannot be written and a model the "
                      "servers hold for another number of shards; 1 when a server does not "
                      "answer within --timeout or holds no model yet.",
       .examples = "parasync-export --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 --out model.psm\n"
                   "parasync-worker --eval-only --model-file model.psm"});
  app.add_option("--ps-hosts", f.cluster.ps_hosts,
                 "Comma-separated host:port of every PS shard (IP addresses or host names, "
                 "ports 1-65535, each address once)");
  app.add_option("--out", f.out, "The model file to write")->required()->type_name("FILE");
  AddSecondsOption(app, "--timeout", f.timeout_s, "Seconds to wait for each server", 0.1, 86400.0);
  app.add_option("--curve-key", f.curve_key_file,
                 "CURVE: this client's key pair file (its public key in the servers' "
                 "--curve-allow)")
      ->group("Security");
  app.add_option("--curve-server-key", f.curve_server_key_file,
                 "CURVE: the servers' public key file")
      ->group("Security");
}

// The flags, checked and resolved.
struct ExportConfig {
  parasync::ClusterSpec cluster;
  std::optional<parasync::CurveClientKeys> curve;
};

// Checks the flags; InvalidArgument with the line to print otherwise.
parasync::Result<ExportConfig> Validate(ExportFlags f) {
  using namespace parasync;
  if (std::string p = OutProblem(f.out); !p.empty()) {
    return Status::InvalidArgument("--out " + f.out + ": " + p);
  }
  // The exporter is no task of the cluster: any worker list will do.
  if (!f.cluster.worker_hosts) f.cluster.worker_hosts = "export:1";
  f.cluster.task_index = 0;
  ExportConfig c;
  auto spec = ResolveClusterSpecFromEnvironment(f.cluster, "worker");
  if (!spec.ok()) return spec.status();
  c.cluster = std::move(spec).value();
  auto curve = LoadCurveClientKeys(f.curve_key_file, f.curve_server_key_file, c.cluster.ps.size());
  if (!curve.ok()) return curve.status();
  c.curve = *curve;
  return c;
}

// The file's metadata: the mode, each shard's version, the examples, the servers, and the
// workers' model description (so parasync-worker --eval-only needs nothing else).
std::string ExportMetadata(const parasync::ModelRegistration& reg,
                           const std::vector<parasync::ShardStats>& stats,
                           const std::vector<std::string>& ps) {
  nlohmann::json versions = nlohmann::json::array();
  for (const parasync::ShardStats& s : stats) versions.push_back(s.version);
  nlohmann::json metadata = {{"mode", reg.mode},
                             {"shard_versions", versions},
                             {"examples", stats[0].examples},
                             {"exported_from", ps}};
  if (!reg.model.empty()) {
    nlohmann::json described = nlohmann::json::parse(reg.model, nullptr, false);
    if (described.is_object()) metadata["model"] = std::move(described);
  }
  return metadata.dump();
}

// Pulls the model the servers hold and writes it to --out; the exit status.
int Run(const ExportFlags& f, const ExportConfig& c) {
  using namespace parasync;
  zmq::context_t context(1);
  PsClientOptions options;
  options.ps_addresses = c.cluster.ps;
  options.curve = c.curve;
  options.rank = -1;
  options.request_timeout = std::chrono::milliseconds(std::llround(f.timeout_s * 1000));
  auto client = PsClient::Connect(context, options);
  if (!client.ok()) return Fail(client.status().message());
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail("cannot reach the servers: " + stats.status().ToString());
  if (!(*stats)[0].registration) return Fail("the servers hold no model yet (nothing registered)");
  const ModelRegistration reg = *(*stats)[0].registration;
  if (!reg.tables.empty()) {
    // A table's rows live on the servers by id, an unbounded one without any list of them:
    // a model file of dense variables would be a model without its embeddings.
    return Fail("the model has " + std::to_string(reg.tables.size()) + " embedding table(s) ('" +
                    reg.tables[0].name + "', ...) kept as rows on the servers; exporting them "
                    "to a model file is not supported (their rows are in each server's "
                    "--state-dir)",
                kExitBadUsage);
  }
  if (Status s = (*client)->Adopt(reg); !s.ok()) return Fail(s.message(), kExitBadUsage);

  ModelFile model;
  model.variables = reg.variables;
  std::vector<float*> ptrs;
  for (const VariableSpec& v : reg.variables) {
    model.values.emplace_back(static_cast<size_t>(v.num_elements()));
    ptrs.push_back(model.values.back().data());
  }
  if (Status s = (*client)->Pull(ptrs); !s.ok()) return Fail("pull failed: " + s.ToString());
  model.metadata_json = ExportMetadata(reg, *stats, c.cluster.ps);
  if (Status s = WriteModelFile(f.out, model); !s.ok()) {
    return Fail("--out " + f.out + ": " + s.message(), s.code() == StatusCode::kUnavailable
                                                            ? kExitRetryable
                                                            : kExitBadUsage);
  }
  int64_t elements = 0;
  for (const VariableSpec& v : reg.variables) elements += v.num_elements();
  std::printf("parasync-export: wrote %s: %zu variables, %lld parameters, from %zu shard(s)\n",
              f.out.c_str(), reg.variables.size(), static_cast<long long>(elements),
              c.cluster.ps.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app;
  ExportFlags flags;
  SetUpExportCommandLine(app, flags);
  if (auto done = parasync::ParseCommandLine(app, argc, argv)) return *done;
  auto config = Validate(flags);
  if (!config.ok()) return Fail(config.status().message(), parasync::kExitBadUsage);
  return Run(flags, *config);
}

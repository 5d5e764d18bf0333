// parasync-export: gathers the whole model from every parameter-server shard into one file
// (docs/model-format.md), for parasync-worker --eval-only or any other reader.
#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cluster_spec.h"
#include "common/model_file.h"
#include "common/process.h"
#include "worker/ps_client.h"

namespace {

int Fail(const std::string& line, int code = 1) {
  return parasync::PrintErrorLine("parasync-export", line, code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app{
      "parasync-export: writes the model held by the parameter servers to one file.\n\n"
      "Example:\n"
      "  parasync-export --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 --out model.psm\n"
      "  parasync-worker --eval-only --model-file model.psm\n"
      "The cluster may also come from TF_CONFIG. The servers keep training meanwhile: the file "
      "holds each shard's values at the moment it answered (metadata lists their versions)."};
  app.option_defaults()->always_capture_default();
  ClusterFlags cluster;
  std::string out;
  int timeout_s = 30;
  app.add_option("--ps-hosts", cluster.ps_hosts,
                 "Comma-separated host:port of every PS shard (IP addresses or host names, "
                 "ports 1-65535, each address once)");
  app.add_option("--out", out, "The model file to write")->required();
  app.add_option("--timeout", timeout_s, "Seconds to wait for each server")
      ->check(CLI::Range(1, 86400));
  std::string curve_key_file;
  std::string curve_server_key_file;
  app.add_option("--curve-key", curve_key_file,
                 "CURVE: this client's key pair file (its public key in the servers' "
                 "--curve-allow)");
  app.add_option("--curve-server-key", curve_server_key_file,
                 "CURVE: the servers' public key file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what() + std::string(" (see --help)"), kExitBadUsage);
  }
  // The exporter is no task of the cluster: any worker list will do.
  if (!cluster.worker_hosts) cluster.worker_hosts = "export:1";
  cluster.task_index = 0;
  auto spec = ResolveClusterSpecFromEnvironment(cluster, "worker");
  if (!spec.ok()) return Fail(spec.status().message(), kExitBadUsage);

  auto curve = LoadCurveClientKeys(curve_key_file, curve_server_key_file, spec->ps.size());
  if (!curve.ok()) return Fail(curve.status().message(), kExitBadUsage);
  zmq::context_t context(1);
  PsClientOptions options;
  options.ps_addresses = spec->ps;
  options.curve = *curve;
  options.rank = -1;
  options.request_timeout = std::chrono::seconds(timeout_s);
  auto client = PsClient::Connect(context, options);
  if (!client.ok()) return Fail(client.status().message());
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail("cannot reach the servers: " + stats.status().ToString());
  if (!(*stats)[0].registration) return Fail("the servers hold no model yet (nothing registered)");
  const ModelRegistration reg = *(*stats)[0].registration;
  if (Status s = (*client)->Adopt(reg); !s.ok()) return Fail(s.message());

  ModelFile model;
  model.variables = reg.variables;
  std::vector<float*> ptrs;
  for (const VariableSpec& v : reg.variables) {
    model.values.emplace_back(static_cast<size_t>(v.num_elements()));
    ptrs.push_back(model.values.back().data());
  }
  if (Status s = (*client)->Pull(ptrs); !s.ok()) return Fail("pull failed: " + s.ToString());
  nlohmann::json versions = nlohmann::json::array();
  for (const ShardStats& s : *stats) versions.push_back(s.version);
  nlohmann::json metadata = {{"mode", reg.mode},
                             {"shard_versions", versions},
                             {"examples", (*stats)[0].examples},
                             {"exported_from", spec->ps}};
  // The workers' model description, so parasync-worker --eval-only needs nothing else.
  if (!reg.model.empty()) {
    nlohmann::json described = nlohmann::json::parse(reg.model, nullptr, false);
    if (described.is_object()) metadata["model"] = std::move(described);
  }
  model.metadata_json = metadata.dump();
  if (Status s = WriteModelFile(out, model); !s.ok()) return Fail(s.message());
  int64_t elements = 0;
  for (const VariableSpec& v : reg.variables) elements += v.num_elements();
  std::printf("parasync-export: wrote %s: %zu variables, %lld parameters, from %zu shard(s)\n",
              out.c_str(), reg.variables.size(), static_cast<long long>(elements), spec->ps.size());
  return 0;
}

#include "common/cluster_spec.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "common/address.h"

namespace parasync {

std::vector<std::string> SplitHostList(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    start = end + 1;
  }
  return out;
}

Result<ClusterSpec> ParseTfConfig(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("TF_CONFIG is not a JSON object");
  }
  ClusterSpec spec;
  size_t num_chief = 0;
  auto read_list = [&](const nlohmann::json& cluster, const char* key,
                       std::vector<std::string>* out) -> Status {
    if (!cluster.contains(key)) return Status::Ok();
    const auto& list = cluster.at(key);
    if (!list.is_array()) return Status::InvalidArgument(std::string("TF_CONFIG cluster.") + key + " is not a list");
    for (const auto& item : list) {
      if (!item.is_string()) {
        return Status::InvalidArgument(std::string("TF_CONFIG cluster.") + key + " has a non-string entry");
      }
      out->push_back(item.get<std::string>());
    }
    return Status::Ok();
  };
  if (j.contains("cluster")) {
    const auto& cluster = j.at("cluster");
    if (!cluster.is_object()) return Status::InvalidArgument("TF_CONFIG cluster is not an object");
    PARASYNC_RETURN_IF_ERROR(read_list(cluster, "ps", &spec.ps));
    PARASYNC_RETURN_IF_ERROR(read_list(cluster, "worker", &spec.workers));
    // TensorFlow's "chief" is worker 0 here: accept it by prepending it to the workers.
    std::vector<std::string> chief;
    PARASYNC_RETURN_IF_ERROR(read_list(cluster, "chief", &chief));
    spec.workers.insert(spec.workers.begin(), chief.begin(), chief.end());
    num_chief = chief.size();
  }
  if (j.contains("task")) {
    const auto& task = j.at("task");
    if (!task.is_object()) return Status::InvalidArgument("TF_CONFIG task is not an object");
    if (task.contains("type")) {
      if (!task.at("type").is_string()) return Status::InvalidArgument("TF_CONFIG task.type is not a string");
      spec.task_type = task.at("type").get<std::string>();
    }
    if (task.contains("index")) {
      const auto& index = task.at("index");
      if (!index.is_number_integer() || index.get<int64_t>() < 0 ||
          index.get<int64_t>() > 1'000'000) {
        return Status::InvalidArgument("TF_CONFIG task.index is not an integer in [0, 1000000]");
      }
      spec.task_index = static_cast<int>(index.get<int64_t>());
    }
    // TensorFlow numbers "worker" tasks after the chief separately; here they follow it.
    if (spec.task_type == "worker") spec.task_index += static_cast<int>(num_chief);
    if (spec.task_type == "chief") spec.task_type = "worker";
  }
  return spec;
}


Result<ClusterSpec> ResolveClusterSpec(const ClusterFlags& flags,
                                       const std::optional<std::string>& tf_config,
                                       const std::string& task_type) {
  ClusterSpec spec;
  if (tf_config && !tf_config->empty()) {
    auto parsed = ParseTfConfig(*tf_config);
    if (!parsed.ok()) return parsed.status();
    spec = std::move(parsed).value();
    if (!spec.task_type.empty() && spec.task_type != task_type && !flags.task_index) {
      return Status::InvalidArgument("TF_CONFIG task.type is '" + spec.task_type +
                                     "' but this binary is a " + task_type);
    }
  }
  spec.task_type = task_type;
  if (flags.ps_hosts) spec.ps = SplitHostList(*flags.ps_hosts);
  if (flags.worker_hosts) spec.workers = SplitHostList(*flags.worker_hosts);
  if (flags.task_index) spec.task_index = *flags.task_index;

  if (spec.ps.empty()) {
    return Status::InvalidArgument("no parameter servers: give --ps-hosts or TF_CONFIG cluster.ps");
  }
  if (spec.workers.empty()) {
    return Status::InvalidArgument("no workers: give --worker-hosts or TF_CONFIG cluster.worker");
  }
  // Every address as an address (common/address.h), and none twice: two shards on one
  // address would be one server holding two shards' slices.
  const std::string ps_source = flags.ps_hosts ? "--ps-hosts" : "TF_CONFIG cluster.ps";
  const std::string worker_source =
      flags.worker_hosts ? "--worker-hosts" : "TF_CONFIG cluster.worker";
  // A server binds only its own address, so it may be given port 0 (any free port, reported
  // in its ready file); every other process connects to the servers and needs their ports.
  PARASYNC_RETURN_IF_ERROR(CheckDistinctAddresses(
      spec.ps, ps_source, task_type == "ps" ? PortRule::kZeroAllowed : PortRule::kNonZero));
  PARASYNC_RETURN_IF_ERROR(CheckDistinctAddresses(spec.workers, worker_source));
  const size_t n = task_type == "ps" ? spec.ps.size() : spec.workers.size();
  if (spec.task_index < 0 || static_cast<size_t>(spec.task_index) >= n) {
    return Status::InvalidArgument("task index " + std::to_string(spec.task_index) +
                                   " is out of range: the cluster has " + std::to_string(n) +
                                   " " + task_type + " task(s)");
  }
  return spec;
}

Result<ClusterSpec> ResolveClusterSpecFromEnvironment(const ClusterFlags& flags,
                                                      const std::string& task_type) {
  const char* env = std::getenv("TF_CONFIG");
  return ResolveClusterSpec(flags, env ? std::optional<std::string>(env) : std::nullopt, task_type);
}

}  // namespace parasync

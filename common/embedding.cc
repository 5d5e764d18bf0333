#include "common/embedding.h"

#include <set>

namespace parasync {

Status ValidateTables(const std::vector<TableSpec>& tables,
                      const std::vector<VariableSpec>& variables) {
  std::set<std::string> names;
  for (const VariableSpec& v : variables) names.insert(v.name);
  for (const TableSpec& t : tables) {
    if (t.name.empty()) return Status::InvalidArgument("a table has an empty name");
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("table '" + t.name + "' has the name of another table or "
                                     "variable");
    }
    if (t.dim < 1 || t.dim > kMaxTableDim) {
      return Status::InvalidArgument("table '" + t.name + "' has dim " + std::to_string(t.dim) +
                                     " (expected 1.." + std::to_string(kMaxTableDim) + ")");
    }
    if (t.rows < 0) {
      return Status::InvalidArgument("table '" + t.name + "' has a negative row count");
    }
    if (t.init.kind == InitKind::kProvided) {
      return Status::InvalidArgument("table '" + t.name + "' has a provided initializer: rows "
                                     "are created on first touch from zeros, constant or "
                                     "uniform");
    }
  }
  return Status::Ok();
}

int ShardOfRow(uint32_t table, uint64_t id, int num_shards) {
  const uint64_t h = SplitMix64(id ^ SplitMix64(0x7461626c65000000ULL + table));
  // Lemire's multiply-shift on the top 32 bits: uniform in [0, num_shards), no division.
  return static_cast<int>(((h >> 32) * static_cast<uint64_t>(num_shards)) >> 32);
}

void InitializeRow(const Initializer& init, uint64_t seed, uint32_t table, uint64_t id,
                   float* out, int64_t dim) {
  // A stream per (seed, table, id), then one draw per column.
  FillInitialized(init, SplitMix64(SplitMix64(seed ^ SplitMix64(0x726f7773ULL + table)) ^ id), 0,
                  out, dim);
}

std::string DescribeTablesMismatch(const std::vector<TableSpec>& have,
                                   const std::vector<TableSpec>& got) {
  if (have.size() != got.size()) {
    return std::to_string(got.size()) + " tables != registered " + std::to_string(have.size());
  }
  for (size_t i = 0; i < have.size(); ++i) {
    const TableSpec& a = have[i];
    const TableSpec& b = got[i];
    if (a.name != b.name) {
      return "table " + std::to_string(i) + " is '" + b.name + "', registered '" + a.name + "'";
    }
    if (a.rows != b.rows || a.dim != b.dim) {
      return "table '" + a.name + "' is " + std::to_string(b.rows) + " x " +
             std::to_string(b.dim) + ", registered " + std::to_string(a.rows) + " x " +
             std::to_string(a.dim) + " (rows 0: unbounded)";
    }
    if (!(a.init == b.init)) return "initializer mismatch for table '" + a.name + "'";
  }
  return "";
}

}  // namespace parasync

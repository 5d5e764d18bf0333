#include "common/model_file.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace parasync {

namespace {

constexpr char kMagic[8] = {'P', 'S', 'Y', 'N', 'C', 'M', 'D', 'L'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kAlignment = 64;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(in[at + static_cast<size_t>(i)])} << (8 * i);
  return v;
}

uint32_t Crc32(const std::string& bytes, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), chunk);
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

Status WriteModelFile(const std::string& path, const ModelFile& model) {
  if (model.values.size() != model.variables.size()) {
    return Status::InvalidArgument("model file: " + std::to_string(model.values.size()) +
                                   " value arrays for " + std::to_string(model.variables.size()) +
                                   " variables");
  }
  nlohmann::json header;
  header["format"] = "parasync-model";
  header["version"] = kFormatVersion;
  nlohmann::json metadata = nlohmann::json::parse(model.metadata_json, nullptr, false);
  header["metadata"] = metadata.is_discarded() ? nlohmann::json::object() : metadata;
  nlohmann::json vars = nlohmann::json::array();
  uint64_t offset = 0;
  for (size_t i = 0; i < model.variables.size(); ++i) {
    const VariableSpec& v = model.variables[i];
    if (static_cast<int64_t>(model.values[i].size()) != v.num_elements()) {
      return Status::InvalidArgument("model file: variable '" + v.name + "' has " +
                                     std::to_string(model.values[i].size()) + " values, expected " +
                                     std::to_string(v.num_elements()));
    }
    const uint64_t bytes = model.values[i].size() * sizeof(float);
    vars.push_back({{"name", v.name}, {"shape", v.shape}, {"dtype", "float32"},
                    {"offset", offset}, {"bytes", bytes}});
    offset += bytes;
  }
  header["variables"] = vars;
  const std::string header_text = header.dump();

  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, kFormatVersion);
  PutU32(out, static_cast<uint32_t>(header_text.size()));
  out += header_text;
  out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  for (const auto& values : model.values) {
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  PutU32(out, Crc32(out, out.size()));

  return WriteFileAtomically(path, out);
}

Result<ModelFile> ReadModelFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return Status::NotFound("no model file at " + path);
  std::string in(static_cast<size_t>(f.tellg()), '\0');
  f.seekg(0);
  if (!f.read(in.data(), static_cast<std::streamsize>(in.size()))) {
    return Status::Unavailable("cannot read " + path);
  }
  auto corrupt = [&](const std::string& why) {
    return Status::Corruption(path + " is not a valid parasync model file: " + why);
  };
  if (in.size() < sizeof(kMagic) + 12 || std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("wrong magic (not written by parasync-export?)");
  }
  if (GetU32(in, in.size() - 4) != Crc32(in, in.size() - 4)) return corrupt("checksum mismatch");
  const uint32_t version = GetU32(in, 8);
  if (version != kFormatVersion) {
    return corrupt("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFormatVersion));
  }
  const size_t header_len = GetU32(in, 12);
  if (16 + header_len > in.size() - 4) return corrupt("truncated header");
  const nlohmann::json header =
      nlohmann::json::parse(in.begin() + 16, in.begin() + 16 + static_cast<std::ptrdiff_t>(header_len),
                            nullptr, false);
  if (header.is_discarded() || !header.is_object() || !header.contains("variables") ||
      !header["variables"].is_array()) {
    return corrupt("header is not the expected JSON");
  }
  const size_t data_start = (16 + header_len + kAlignment - 1) / kAlignment * kAlignment;
  const size_t data_end = in.size() - 4;
  ModelFile model;
  if (header.contains("metadata")) model.metadata_json = header["metadata"].dump();
  try {
    for (const auto& v : header["variables"]) {
      VariableSpec spec;
      spec.name = v.at("name").get<std::string>();
      spec.shape = v.at("shape").get<std::vector<int64_t>>();
      if (v.at("dtype").get<std::string>() != "float32") return corrupt("unsupported dtype");
      const uint64_t offset = v.at("offset").get<uint64_t>();
      const uint64_t bytes = v.at("bytes").get<uint64_t>();
      if (bytes % sizeof(float) != 0 || data_start + offset + bytes > data_end ||
          static_cast<int64_t>(bytes / sizeof(float)) != spec.num_elements()) {
        return corrupt("variable '" + spec.name + "' does not fit the file");
      }
      std::vector<float> values(bytes / sizeof(float));
      std::memcpy(values.data(), in.data() + data_start + offset, bytes);
      model.variables.push_back(std::move(spec));
      model.values.push_back(std::move(values));
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("header: ") + e.what());
  }
  return model;
}

}  // namespace parasync

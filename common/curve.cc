#include "common/curve.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace parasync {

namespace {

constexpr const char* kPublicPrefix = "public-key = ";
constexpr const char* kSecretPrefix = "secret-key = ";

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  const size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::optional<std::string> Decode(const std::string& z85) {
  if (z85.size() != 40) return std::nullopt;
  std::array<uint8_t, 32> bytes{};
  if (zmq_z85_decode(bytes.data(), z85.c_str()) == nullptr) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Result<std::vector<std::string>> ReadKeyLines(const std::string& path, const char* prefix) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("cannot read key file " + path);
  std::vector<std::string> keys;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line = Trim(line);
    // '#' is also a Z85 digit: a comment is a '#' line that is not a key.
    if (line.empty() || (line[0] == '#' && !IsZ85Key(line))) continue;
    std::string key;
    if (line.rfind(prefix, 0) == 0) {
      key = Trim(line.substr(std::string(prefix).size()));
    } else if (line.rfind(kPublicPrefix, 0) == 0 || line.rfind(kSecretPrefix, 0) == 0) {
      continue;  // the other kind of key
    } else if (prefix == kPublicPrefix) {
      key = line;  // a bare key
    } else {
      continue;
    }
    if (!IsZ85Key(key)) {
      return Status::InvalidArgument(path + " line " + std::to_string(number) +
                                     ": not a 40-character Z85 CURVE key");
    }
    keys.push_back(key);
  }
  return keys;
}

}  // namespace

Result<CurveKeyPair> GenerateCurveKeyPair() {
  std::array<char, 41> pub{};
  std::array<char, 41> sec{};
  if (zmq_curve_keypair(pub.data(), sec.data()) != 0) {
    return Status::Unavailable(std::string("cannot make a CURVE key pair: ") +
                               zmq_strerror(zmq_errno()) + " (libzmq without CURVE?)");
  }
  return CurveKeyPair{pub.data(), sec.data()};
}

bool IsZ85Key(const std::string& key) { return Decode(key).has_value(); }

Status WriteKeyFiles(const std::string& base, const CurveKeyPair& pair) {
  const std::string key_path = base + ".key";
  const std::string pub_path = base + ".pub";
  for (const std::string& p : {key_path, pub_path}) {
    if (std::filesystem::exists(p)) return Status::InvalidArgument(p + " exists; not overwritten");
  }
  {
    // Created 0600 before anything secret is written to it.
    const mode_t old = umask(077);
    std::ofstream key(key_path);
    umask(old);
    key << "# parasync CURVE key pair: keep it secret (its .pub is what others get)\n"
        << kPublicPrefix << pair.public_key << "\n"
        << kSecretPrefix << pair.secret_key << "\n";
    if (!key) return Status::Unavailable("cannot write " + key_path);
  }
  std::ofstream pub(pub_path);
  pub << "# parasync CURVE public key\n" << kPublicPrefix << pair.public_key << "\n";
  if (!pub) return Status::Unavailable("cannot write " + pub_path);
  return Status::Ok();
}

Result<CurveKeyPair> ReadKeyPairFile(const std::string& path) {
  auto pubs = ReadKeyLines(path, kPublicPrefix);
  if (!pubs.ok()) return pubs.status();
  auto secs = ReadKeyLines(path, kSecretPrefix);
  if (!secs.ok()) return secs.status();
  if (pubs->size() != 1 || secs->size() != 1) {
    return Status::InvalidArgument(path + " is not a key pair file (one public-key and one "
                                   "secret-key line; parasync-keygen makes them)");
  }
  return CurveKeyPair{pubs->front(), secs->front()};
}

Result<std::vector<std::string>> ReadPublicKeys(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> keys;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      const auto ext = entry.path().extension();
      if (ext == ".pub" || ext == ".key") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      auto some = ReadKeyLines(f.string(), kPublicPrefix);
      if (!some.ok()) return some.status();
      keys.insert(keys.end(), some->begin(), some->end());
    }
  } else {
    auto some = ReadKeyLines(path, kPublicPrefix);
    if (!some.ok()) return some.status();
    keys = std::move(some).value();
  }
  if (keys.empty()) return Status::InvalidArgument("no public key in " + path);
  return keys;
}

Result<std::optional<CurveClientKeys>> LoadCurveClientKeys(const std::string& key_file,
                                                           const std::string& server_key_file,
                                                           size_t num_shards) {
  if (key_file.empty() && server_key_file.empty()) return std::optional<CurveClientKeys>();
  if (key_file.empty() || server_key_file.empty()) {
    return Status::InvalidArgument("--curve-key and --curve-server-key go together");
  }
  CurveClientKeys keys;
  PARASYNC_ASSIGN_OR_RETURN(keys.own, ReadKeyPairFile(key_file));
  PARASYNC_ASSIGN_OR_RETURN(keys.server_public_keys, ReadPublicKeys(server_key_file));
  if (keys.server_public_keys.size() != 1 && keys.server_public_keys.size() != num_shards) {
    return Status::InvalidArgument(server_key_file + " has " +
                                   std::to_string(keys.server_public_keys.size()) +
                                   " keys; give one for all servers or one per server (" +
                                   std::to_string(num_shards) + ")");
  }
  return std::optional<CurveClientKeys>(std::move(keys));
}

Result<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::Start(
    zmq::context_t& context, const std::vector<std::string>& allowed, Callback on_decision) {
  std::set<std::string> binary;
  for (const std::string& key : allowed) {
    auto decoded = Decode(key);
    if (!decoded) return Status::InvalidArgument("not a Z85 CURVE public key: " + key);
    binary.insert(*decoded);
  }
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    return std::unique_ptr<ZapAuthenticator>(
        new ZapAuthenticator(std::move(socket), std::move(binary), std::move(on_decision)));
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("cannot start the ZAP handler: ") + e.what());
  }
}

ZapAuthenticator::ZapAuthenticator(zmq::socket_t socket, std::set<std::string> allowed,
                                   Callback on_decision)
    : socket_(std::move(socket)), allowed_(std::move(allowed)),
      on_decision_(std::move(on_decision)) {
  thread_ = std::thread([this] { Loop(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapAuthenticator::Loop() {
  while (!stop_.load()) {
    try {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> request;
      while (true) {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::none)) break;
        const bool more = frame.more();
        request.push_back(std::move(frame));
        if (!more) break;
      }
      // version, request id, domain, address, routing id, mechanism, credentials...
      std::string status = "400";
      std::string reason = "not_curve";
      if (request.size() >= 7 && request[5].to_string() == "CURVE" && request[6].size() == 32) {
        const bool known = allowed_.count(request[6].to_string()) > 0;
        status = known ? "200" : "400";
        reason = known ? "ok" : "unknown_key";
      }
      const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
      const std::string texts[] = {"1.0", request_id, status,
                                   status == "200" ? "OK" : "not allowed", "", ""};
      for (size_t i = 0; i < 6; ++i) {
        zmq::message_t frame(texts[i].data(), texts[i].size());
        socket_.send(frame, i + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
      if (on_decision_) on_decision_(status == "200", reason);
    } catch (const zmq::error_t&) {
      if (stop_.load()) break;  // context terminating
    }
  }
  socket_.close();
}

}  // namespace parasync

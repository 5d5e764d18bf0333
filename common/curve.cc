#include "common/curve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
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

const char* CurveRefusalName(CurveRefusal refusal) {
  switch (refusal) {
    case CurveRefusal::kPlainTextClient:
      return "plain_text_client";
    case CurveRefusal::kBadKeyOrSecret:
      return "bad_key_or_secret";
    case CurveRefusal::kNotAllowed:
      return "not_allowed";
    case CurveRefusal::kOther:
      break;
  }
  return "other";
}

std::optional<CurveRefusal> ClassifyServerHandshakeEvent(uint16_t event, uint32_t value) {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        return CurveRefusal::kPlainTextClient;
      }
      // A HELLO sealed for another server key, or a vouch sealed with a secret key that is
      // not the client's: the box does not open.
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) return CurveRefusal::kBadKeyOrSecret;
      return CurveRefusal::kOther;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      // 400 is our ZAP handler's denial, counted where it is decided; other codes (300, 500)
      // come from no decision of ours.
      if (value == 400) return std::nullopt;
      return CurveRefusal::kOther;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return CurveRefusal::kOther;
    default:
      return std::nullopt;
  }
}

std::string DescribeServerHandshakeEvent(uint16_t event, uint32_t value) {
  char code[16];
  std::snprintf(code, sizeof(code), "0x%08x", value);
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      return std::string("ZMTP protocol error ") + code;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return std::string("connection lost in the handshake: ") +
             std::strerror(static_cast<int>(value));
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return "ZAP status " + std::to_string(value);
    default:
      return "monitor event " + std::to_string(event) + ", value " + code;
  }
}

std::optional<uint64_t> RefusalLogSuppressedBefore(uint64_t n) {
  constexpr uint64_t kFirst = 20;
  constexpr uint64_t kEvery = 1000;
  if (n <= kFirst) return uint64_t{0};
  if (n % kEvery != 0) return std::nullopt;
  const uint64_t previous = std::max(kFirst, n - kEvery);
  return n - previous - 1;
}

Result<std::unique_ptr<CurveRefusalWatcher>> CurveRefusalWatcher::Start(
    std::unique_ptr<zmq::socket_t> monitor, Callback on_refusal) {
  if (monitor == nullptr) return Status::InvalidArgument("no handshake monitor to watch");
  return std::unique_ptr<CurveRefusalWatcher>(
      new CurveRefusalWatcher(std::move(monitor), std::move(on_refusal)));
}

CurveRefusalWatcher::CurveRefusalWatcher(std::unique_ptr<zmq::socket_t> monitor,
                                         Callback on_refusal)
    : monitor_(std::move(monitor)), on_refusal_(std::move(on_refusal)) {
  thread_ = std::thread([this] { Loop(); });
}

CurveRefusalWatcher::~CurveRefusalWatcher() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

namespace {

// "ip:port" of the peer of a connected TCP socket; "" when it is gone or not TCP.
std::string PeerOf(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  char ip[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return std::string(ip) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return "[" + std::string(ip) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "";
}

}  // namespace

void CurveRefusalWatcher::Loop() {
  // Connections accepted and not yet through their handshake: fd -> peer. libzmq 4.3's
  // handshake events carry no fd, so a result is pinned on a connection only when it is
  // the one in flight; `unmatched` counts results pinned on none (their connections are
  // still listed until their disconnect event).
  std::map<int, std::string> in_flight;
  size_t unmatched = 0;
  while (!stop_.load()) {
    zmq::message_t event;
    zmq::message_t address;
    try {
      zmq::pollitem_t item{monitor_->handle(), 0, ZMQ_POLLIN, 0};
      // The timeout only bounds how long stopping takes.
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      if (!monitor_->recv(event, zmq::recv_flags::dontwait)) continue;
      if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::none);
    } catch (const zmq::error_t&) {
      if (stop_.load()) break;
      continue;
    }
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t value = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    std::memcpy(&value, static_cast<const char*>(event.data()) + 2, sizeof(value));
    if (id == ZMQ_EVENT_MONITOR_STOPPED) break;
    const int fd = static_cast<int>(value);
    if (id == ZMQ_EVENT_ACCEPTED) {
      // Read at once: the fd is still this connection's unless it failed already.
      in_flight[fd] = PeerOf(fd);
      continue;
    }
    if (id == ZMQ_EVENT_DISCONNECTED) {
      // A connection still listed had its result among the unmatched ones.
      if (in_flight.erase(fd) > 0 && unmatched > 0) --unmatched;
      continue;
    }
    std::string peer;
    if (in_flight.size() == 1 && unmatched == 0) {
      peer = in_flight.begin()->second;
      in_flight.clear();
    } else if (++unmatched >= in_flight.size()) {
      // Every listed connection has its result: none is in flight any more.
      in_flight.clear();
      unmatched = 0;
    }
    if (const auto refusal = ClassifyServerHandshakeEvent(id, value); refusal && on_refusal_) {
      on_refusal_(*refusal, peer, DescribeServerHandshakeEvent(id, value));
    }
  }
  monitor_->close();
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
      std::optional<CurveRefusal> refusal = CurveRefusal::kOther;
      if (request.size() >= 7 && request[5].to_string() == "CURVE" && request[6].size() == 32) {
        const bool known = allowed_.count(request[6].to_string()) > 0;
        status = known ? "200" : "400";
        refusal = known ? std::nullopt : std::optional<CurveRefusal>(CurveRefusal::kNotAllowed);
      }
      const std::string peer = request.size() > 3 ? request[3].to_string() : "";
      const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
      const std::string texts[] = {"1.0", request_id, status,
                                   status == "200" ? "OK" : "not allowed", "", ""};
      for (size_t i = 0; i < 6; ++i) {
        zmq::message_t frame(texts[i].data(), texts[i].size());
        socket_.send(frame, i + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
      if (on_decision_) on_decision_(refusal, peer);
    } catch (const zmq::error_t&) {
      if (stop_.load()) break;  // context terminating
    }
  }
  socket_.close();
}

}  // namespace parasync

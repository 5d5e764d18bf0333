// CurveZMQ keys and the ZAP handler: who may talk to a parameter server, encrypted.
//
// Keys are Z85 text (40 characters for 32 bytes), as ZeroMQ takes them. Files:
//   <name>.key  a key pair, mode 0600:  "public-key = <z85>" and "secret-key = <z85>" lines
//   <name>.pub  a public key:           "public-key = <z85>"
// (lines starting with '#' are comments). parasync-keygen writes them.
//
// A PS with a secret key makes its socket a CURVE server: every connection is encrypted
// and must complete the CURVE handshake, and the ZAP handler then admits only the public
// keys of the allow-list (a directory of .pub files, or one file of keys).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"

namespace parasync {

struct CurveKeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

// A fresh key pair from libsodium (through zmq_curve_keypair). Unavailable when this
// libzmq has no CURVE support.
Result<CurveKeyPair> GenerateCurveKeyPair();

// True for a 40-character Z85 string that decodes to 32 bytes.
bool IsZ85Key(const std::string& key);

// Writes <base>.key (0600) and <base>.pub; refuses to overwrite either.
Status WriteKeyFiles(const std::string& base, const CurveKeyPair& pair);

// Reads a .key file (both keys). InvalidArgument naming the file for anything malformed.
Result<CurveKeyPair> ReadKeyPairFile(const std::string& path);

// Reads public keys: from a directory, every *.pub (and *.key: its public key) in it; from a
// file, every "public-key = <z85>" line or bare Z85 line. At least one key.
Result<std::vector<std::string>> ReadPublicKeys(const std::string& path);

// A client's CURVE settings: its key pair and the servers' public keys (one for every
// shard, or one per shard in shard order).
struct CurveClientKeys {
  CurveKeyPair own;
  std::vector<std::string> server_public_keys;

  // The server key of shard `shard`.
  const std::string& ServerKey(size_t shard) const {
    return server_public_keys.size() == 1 ? server_public_keys[0] : server_public_keys[shard];
  }
};

// --curve-key FILE --curve-server-key FILE for `num_shards` shards: both or neither (then
// nullopt); InvalidArgument otherwise.
Result<std::optional<CurveClientKeys>> LoadCurveClientKeys(const std::string& key_file,
                                                           const std::string& server_key_file,
                                                           size_t num_shards);

// Why a CURVE server refused a peer. Each refused connection has exactly one reason, found
// either by the ZAP handler (kNotAllowed) or in the handshake before it (the rest).
enum class CurveRefusal {
  kPlainTextClient,  // the peer spoke another mechanism (no --curve-key): ZMTP mechanism mismatch
  kBadKeyOrSecret,   // a CURVE box did not open: the client's secret key does not match its
                     // public key, or it used another server public key
  kNotAllowed,       // the ZAP handler denied the client's public key (not on --curve-allow)
  kOther,            // any other handshake failure (malformed traffic, a cut connection)
                     // — stays the last: kNumCurveRefusals counts up to it
};
inline constexpr int kNumCurveRefusals = static_cast<int>(CurveRefusal::kOther) + 1;

// "plain_text_client", "bad_key_or_secret", "not_allowed", "other": the metric label values.
const char* CurveRefusalName(CurveRefusal refusal);

// What one libzmq monitor event of a CURVE server socket (ZMQ_EVENT_*, and its value: the
// ZMQ_PROTOCOL_ERROR_* code or ZAP status code) says: a refusal and its reason, or nullopt
// for events that are no refusal or whose refusal the ZAP handler reports itself (a
// ZMQ_EVENT_HANDSHAKE_FAILED_AUTH with status 400 is the ZapAuthenticator's own denial).
std::optional<CurveRefusal> ClassifyServerHandshakeEvent(uint16_t event, uint32_t value);

// Rate limit for the log line of the `n`th refusal (counted from 1): the first 20 are
// logged, then every 1000th. Returns nullopt when the line is suppressed, else how many
// lines were suppressed since the previous logged one.
std::optional<uint64_t> RefusalLogSuppressedBefore(uint64_t n);

// What a monitor event says, for a log line: "ZMTP protocol error 0x11000002", "connection
// lost in the handshake: Connection reset by peer", "ZAP status 500".
std::string DescribeServerHandshakeEvent(uint16_t event, uint32_t value);

// Reads a CURVE server socket's handshake monitor (Socket::TakeHandshakeMonitor) on a
// thread of its own and calls on_refusal(reason, peer, detail) from that thread for every
// refusal ClassifyServerHandshakeEvent reports (detail: DescribeServerHandshakeEvent). `peer` is "ip:port" when libzmq's events tell which
// connection failed (libzmq 4.3's stable monitor events do not name the peer: it is known
// from the accepted connection's socket when only one handshake was in flight), else "".
// Destroy it before the context.
class CurveRefusalWatcher {
 public:
  using Callback = std::function<void(CurveRefusal reason, const std::string& peer,
                                      const std::string& detail)>;
  // InvalidArgument for a null monitor.
  static Result<std::unique_ptr<CurveRefusalWatcher>> Start(
      std::unique_ptr<zmq::socket_t> monitor, Callback on_refusal);
  ~CurveRefusalWatcher();
  CurveRefusalWatcher(const CurveRefusalWatcher&) = delete;
  CurveRefusalWatcher& operator=(const CurveRefusalWatcher&) = delete;

 private:
  CurveRefusalWatcher(std::unique_ptr<zmq::socket_t> monitor, Callback on_refusal);
  void Loop();

  std::unique_ptr<zmq::socket_t> monitor_;  // used by thread_ only
  Callback on_refusal_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Answers ZAP requests (RFC 27) for every CURVE server socket of one context: 200 for a
// CURVE client whose public key is allowed, 400 for anyone else. Start it before binding
// any such socket (libzmq admits everyone while no handler is bound) and destroy it before
// the context.
class ZapAuthenticator {
 public:
  // on_decision(refusal, peer) is called from the handler's thread for every request:
  // refusal is nullopt for an admitted client, kNotAllowed for a key not allowed (kOther
  // for a request that is not CURVE); peer is the client's IP address as ZAP gives it.
  using Callback =
      std::function<void(std::optional<CurveRefusal> refusal, const std::string& peer)>;
  static Result<std::unique_ptr<ZapAuthenticator>> Start(zmq::context_t& context,
                                                         const std::vector<std::string>& allowed,
                                                         Callback on_decision);
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

 private:
  ZapAuthenticator(zmq::socket_t socket, std::set<std::string> allowed, Callback on_decision);
  void Loop();

  zmq::socket_t socket_;
  std::set<std::string> allowed_;  // 32-byte binary public keys
  Callback on_decision_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace parasync

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

// Answers ZAP requests (RFC 27) for every CURVE server socket of one context: 200 for a
// CURVE client whose public key is allowed, 400 for anyone else. Start it before binding
// any such socket (libzmq admits everyone while no handler is bound) and destroy it before
// the context.
class ZapAuthenticator {
 public:
  // on_decision(accepted, reason) is called from the handler's thread for every request;
  // reason is "ok", "unknown_key" or "not_curve".
  using Callback = std::function<void(bool accepted, const std::string& reason)>;
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

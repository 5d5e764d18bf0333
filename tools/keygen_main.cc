// parasync-keygen: makes CurveZMQ key pairs for parasync's authenticated, encrypted mode.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/curve.h"
#include "common/process.h"

namespace {

constexpr const char* kProgram = "parasync-keygen";

int Fail(const std::string& line, int code) {
  return parasync::PrintErrorLine(kProgram, line, code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app;
  SetUpCommandLine(
      app, {.name = kProgram,
            .purpose = "writes a CurveZMQ key pair per NAME: DIR/NAME.key (the pair, mode 0600, "
                       "stays with its process) and DIR/NAME.pub (the public key, given to the "
                       "peers).",
            .details = "Existing files are never overwritten.",
            .exit_status = "A key file that exists already, or a --dir that cannot be made, is "
                           "status 2.",
            .examples = "parasync-keygen --dir keys ps worker0 worker1 export\n"
                        "mkdir keys/allowed && cp keys/worker*.pub keys/export.pub keys/allowed/\n"
                        "parasync-ps --curve-key keys/ps.key --curve-allow keys/allowed ...\n"
                        "parasync-worker --curve-key keys/worker0.key --curve-server-key "
                        "keys/ps.pub ..."});
  std::string dir = ".";
  std::vector<std::string> names;
  app.add_option("--dir", dir, "Where the files go (created if missing)")->type_name("DIR");
  app.add_option("names", names, "Key names, e.g. ps worker0 worker1")
      ->required()
      ->type_name("NAME");
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail("cannot create --dir " + dir + ": " + ec.message(), kExitBadUsage);
  for (const std::string& name : names) {
    if (name.empty() || name.find('/') != std::string::npos) {
      return Fail("a key name is a plain file name, not '" + name + "'", kExitBadUsage);
    }
  }
  for (const std::string& name : names) {
    auto pair = GenerateCurveKeyPair();
    // A libzmq without CURVE support: nothing a retry changes.
    if (!pair.ok()) return Fail(pair.status().message(), kExitBadUsage);
    const std::string base = dir + "/" + name;
    // An existing key file is refused, never overwritten; an unwritable --dir stays so.
    if (Status s = WriteKeyFiles(base, *pair); !s.ok()) return Fail(s.message(), kExitBadUsage);
    std::printf("%s.key %s.pub  public key %s\n", base.c_str(), base.c_str(),
                pair->public_key.c_str());
  }
  return 0;
}

// parasync-keygen: makes CurveZMQ key pairs for parasync's authenticated, encrypted mode.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/curve.h"
#include "common/process.h"

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app{
      "parasync-keygen: writes a CurveZMQ key pair per NAME: DIR/NAME.key (the pair, mode "
      "0600, stays with its process) and DIR/NAME.pub (the public key, given to the peers)."};
  app.footer(
      "Example (one PS key, two workers, the exporter):\n"
      "  parasync-keygen --dir keys ps worker0 worker1 export\n"
      "  mkdir keys/allowed && cp keys/worker*.pub keys/export.pub keys/allowed/\n"
      "  parasync-ps --curve-key keys/ps.key --curve-allow keys/allowed ...\n"
      "  parasync-worker --curve-key keys/worker0.key --curve-server-key keys/ps.pub ...\n"
      "Existing files are never overwritten.");
  std::string dir = ".";
  std::vector<std::string> names;
  app.add_option("--dir", dir, "Where the files go (created if missing)")->capture_default_str();
  app.add_option("names", names, "Key names, e.g. ps worker0 worker1")->required();
  CLI11_PARSE(app, argc, argv);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return PrintErrorLine("parasync-keygen", "cannot create " + dir + ": " + ec.message(), 1);
  for (const std::string& name : names) {
    if (name.empty() || name.find('/') != std::string::npos) {
      return PrintErrorLine("parasync-keygen", "a key name is a plain file name, not '" + name + "'",
                            kExitBadUsage);
    }
    auto pair = GenerateCurveKeyPair();
    if (!pair.ok()) return PrintErrorLine("parasync-keygen", pair.status().message(), 1);
    const std::string base = dir + "/" + name;
    if (Status s = WriteKeyFiles(base, *pair); !s.ok()) {
      return PrintErrorLine("parasync-keygen", s.message(), 1);
    }
    std::printf("%s.key %s.pub  public key %s\n", base.c_str(), base.c_str(),
                pair->public_key.c_str());
  }
  return 0;
}

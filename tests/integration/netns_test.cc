// Multi-host for real: three network namespaces, each its own host with its own address,
// joined by veth pairs to a bridge in a fourth. parasync-launch (in the test's namespace)
// starts one PS in the first and a worker in each of the others through an "ssh" that is
// `ip netns exec`, so every byte between the processes crosses the veth links. Mid-run the
// test takes worker 1's link down for longer than the PS's --worker-timeout, then brings it
// back: the PS must declare the worker dead, the barrier must go on without it, the worker
// must rejoin, and the run must finish well above chance.
//
// Needs root (CAP_NET_ADMIN) and iproute2; skipped, saying so, where namespaces cannot be
// created. Everything it creates is named parasync-<pid>-* and removed at the end.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_util.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

// Runs a command line with /bin/sh; returns its exit status (-1 if it could not run).
int Sh(const std::string& command) {
  const int status = std::system((command + " >/dev/null 2>&1").c_str());
  return status == -1 ? -1 : WEXITSTATUS(status);
}

// Three hosts (ps, w0, w1) and a hub namespace with a bridge; deleted when destroyed.
class Namespaces {
 public:
  Namespaces() : prefix_("parasync-" + std::to_string(getpid()) + "-") {
    // 10.231.X.0/24, X from the pid, so two test runs at once do not share addresses.
    subnet_ = "10.231." + std::to_string(getpid() % 250 + 1) + ".";
  }
  ~Namespaces() {
    for (const std::string& ns : created_) Sh("ip netns del " + ns);
  }

  // Creates everything; empty on success, else what failed.
  std::string Create() {
    for (const char* name : {"hub", "ps", "w0", "w1"}) {
      const std::string ns = prefix_ + name;
      if (Sh("ip netns add " + ns) != 0) return "ip netns add " + ns + " failed";
      created_.push_back(ns);
      if (Sh("ip -n " + ns + " link set lo up") != 0) return "lo up in " + ns + " failed";
    }
    const std::string hub = prefix_ + "hub";
    if (Sh("ip -n " + hub + " link add br0 type bridge") != 0 ||
        Sh("ip -n " + hub + " link set br0 up") != 0) {
      return "cannot create a bridge in " + hub;
    }
    const char* hosts[] = {"ps", "w0", "w1"};
    for (int i = 0; i < 3; ++i) {
      const std::string ns = prefix_ + hosts[i];
      const std::string port = "p" + std::string(hosts[i]);  // the bridge side, in the hub
      if (Sh("ip link add name eth0 netns " + ns + " type veth peer name " + port + " netns " +
             hub) != 0) {
        return "cannot create the veth pair of " + ns;
      }
      if (Sh("ip -n " + hub + " link set " + port + " master br0 up") != 0 ||
          Sh("ip -n " + ns + " addr add " + Address(i) + "/24 dev eth0") != 0 ||
          Sh("ip -n " + ns + " link set eth0 up") != 0) {
        return "cannot configure the link of " + ns;
      }
    }
    return "";
  }

  // 0: the PS host, 1: worker 0's, 2: worker 1's.
  std::string Address(int host) const { return subnet_ + std::to_string(host + 1); }
  std::string Namespace(const std::string& host) const { return prefix_ + host; }
  // Takes worker 1's bridge port down or up.
  bool SetWorker1Link(bool up) const {
    return Sh("ip -n " + prefix_ + "hub link set pw1 " + (up ? "up" : "down")) == 0;
  }
  // Whether host `from` reaches host `to`: a TCP connection to a closed port is refused
  // by a host that is there, and times out when the link is not (no ping needed).
  bool Reaches(int from, int to) const {
    const char* hosts[] = {"ps", "w0", "w1"};
    const std::string probe = "ip netns exec " + prefix_ + hosts[from] +
                              " timeout 3 bash -c 'exec 3<>/dev/tcp/" + Address(to) +
                              "/9' 2>&1 | grep -q 'refused'";
    return std::system(probe.c_str()) == 0;
  }

 private:
  std::string prefix_;
  std::string subnet_;
  std::vector<std::string> created_;
};

TEST(NetnsTest, ThreeHostsTrainAndAWorkerWhoseLinkWentDownRejoins) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root (CAP_NET_ADMIN)";
  Namespaces net;
  if (const std::string why = net.Create(); !why.empty()) {
    GTEST_SKIP() << "cannot create network namespaces here: " << why;
  }
  // The hosts reach each other over the bridge and nothing else.
  ASSERT_TRUE(net.Reaches(1, 0)) << "worker 0's host cannot reach the PS host";
  ASSERT_TRUE(net.Reaches(2, 0)) << "worker 1's host cannot reach the PS host";

  TempDir dir;
  // The "ssh": run the command in the namespace of the host with that address.
  const std::string ssh = dir.path() + "/netns-ssh";
  std::ofstream(ssh) << "#!/bin/sh\ncase \"$1\" in\n"
                     << "  " << net.Address(0) << ") ns=" << net.Namespace("ps") << " ;;\n"
                     << "  " << net.Address(1) << ") ns=" << net.Namespace("w0") << " ;;\n"
                     << "  " << net.Address(2) << ") ns=" << net.Namespace("w1") << " ;;\n"
                     << "  *) echo \"netns-ssh: unknown host $1\" >&2; exit 255 ;;\n"
                     << "esac\nexec ip netns exec \"$ns\" sh -c \"$2\"\n";
  std::filesystem::permissions(ssh, std::filesystem::perms::owner_all);

  const std::string run = dir.path() + "/run";
  std::vector<std::string> common = {
      testing::BinDir() + "/parasync-launch", "--ps", net.Address(0) + ":1", "-H",
      net.Address(1) + ":1," + net.Address(2) + ":1", "--ssh-command", ssh, "--log-dir", run,
      "--data", testing::DataDir(), "--mode", "sync", "--epochs", "5", "--worker-timeout", "2",
      "--grace-seconds", "10"};
  // The preflight first: both namespaces reachable, ports free, one build.
  {
    std::vector<std::string> argv = common;
    argv.push_back("--check");
    Child check = Child::Start(argv, dir.path() + "/check.out");
    auto status = check.Wait(60s);
    ASSERT_TRUE(status.has_value());
    ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/check.out");
  }

  const std::string out = dir.path() + "/launch.out";
  Child launch = Child::Start(common, out);
  // Once the chief has finished an epoch, worker 1 is mid-training: cut its link for 5 s,
  // more than twice the PS's worker timeout.
  const std::string eval = run + "/eval.jsonl";
  ASSERT_TRUE(testing::WaitFor([&] { return testing::ReadLines(eval).size() >= 2; }, 120s))
      << "no epoch finished in 120 s:\n" << testing::ReadFile(out);
  const auto link_down = std::chrono::steady_clock::now();
  ASSERT_TRUE(net.SetWorker1Link(false));
  const std::string ps_log = run + "/ps0.log";
  EXPECT_FALSE(net.Reaches(2, 0)) << "worker 1's host still reaches the PS with its link down";
  const bool declared_dead = testing::WaitFor(
      [&] { return testing::ReadFile(ps_log).find("worker 1 declared dead") != std::string::npos; },
      10s);
  std::this_thread::sleep_until(link_down + 5s);
  ASSERT_TRUE(net.SetWorker1Link(true));
  EXPECT_TRUE(declared_dead) << "the PS never declared the unreachable worker dead:\n"
                             << testing::ReadFile(ps_log);

  auto status = launch.Wait(240s);
  ASSERT_TRUE(status.has_value()) << "the run did not finish in 240 s:\n" << testing::ReadFile(out);
  const std::string printed = testing::ReadFile(out);
  EXPECT_EQ(ExitCode(*status), 0) << printed;
  EXPECT_NE(testing::ReadFile(ps_log).find("worker 1 rejoined"), std::string::npos)
      << "worker 1 never rejoined:\n" << testing::ReadFile(ps_log);
  const auto rows = testing::ReadLines(eval);
  ASSERT_FALSE(rows.empty());
  const auto last = nlohmann::json::parse(rows.back());
  EXPECT_EQ(last["epoch"], 5) << rows.back();
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.7) << rows.back();
  // Every process ran on its own host's address.
  const auto cluster = nlohmann::json::parse(testing::ReadFile(run + "/cluster.json"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cluster["processes"][i]["host"], net.Address(i));
  std::cout << "netns run: test accuracy " << last["test_accuracy"].get<double>() << " after "
            << last["wall_s"].get<double>() << " s across 3 namespaces\n";
}

}  // namespace
}  // namespace parasync

// LocalGroup: local aggregation — the workers of one host exchange each step with the servers
// through one of them, the leader (the group's lowest rank). The others, members, hand it
// their gradients over a local socket and get the step's parameters back; the leader sums the
// group's gradients with its own (in rank order), pushes that sum once with the members'
// ranks named in the push (the servers count each named rank as a contributor of the sync
// step and divide by the contributors, so the step is the average over every worker, as
// flat), pulls once and hands the parameters on. One push and one pull per host and step
// instead of one per worker: the host's link carries 1/k of the bytes for k workers.
//
// Local socket messages (a host's own processes, same byte order): a member sends
// [MemberMessage, one float32 frame per variable]; the leader answers [LeaderMessage, error
// text, read versions (int64 per shard), read incarnations (uint64 per shard), then one
// float32 frame per variable when the step succeeded]. Anything else is refused by name.
//
// Leaving: Close (PsClient::Leave, or the destructor) tells the other side; a member the
// leader drops (a gradient that does not fit, a second one in a step) is told the same way. A member that
// leaves is no longer waited for; a leader that leaves (its training ended, or it exits)
// makes every member's next step fail with Unavailable, and PsClient then goes on exchanging
// that member's steps with the servers itself, as without a group — so does it when the
// leader's process is gone or never answered. (A member's gradient the leader pushed before
// it died is then pushed again by the member: the servers drop the second as a duplicate of
// its rank, and it waits for the step like the others.)
//
// Liveness, both ways bounded: every message names its sender's pid. The leader waits for a
// member's gradient while its process lives (once it has heard from it) and at most `timeout`
// for one it has not heard from; a member it gives up on is dropped for good (its later
// messages are answered with an error) and the step goes on without it — its rank is not in
// the push, the servers see it go silent and stop waiting for it. A member waits for the
// leader while the leader's process lives, and at most `timeout` before the first answer.
// Either side gives up when `interrupted` says so.
//
// Not thread-safe: the training thread uses it (through PsClient).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/mode.h"
#include "common/status.h"

namespace parasync {

struct LocalGroupOptions {
  // Where the leader listens and the members connect: "ipc:///path" (or a tcp:// address).
  std::string endpoint;
  std::vector<int> ranks;  // the group's ranks, increasing, at least two; ranks[0] leads
  int rank = -1;           // this worker's, one of `ranks`
  std::chrono::milliseconds timeout{300000};
};

// "0,1,3" as a group's ranks: at least two, distinct, each >= 0; returned increasing.
// InvalidArgument naming what is wrong.
Result<std::vector<int>> ParseLocalGroupRanks(const std::string& text);

// The group of `rank` from its ranks' text (ParseLocalGroupRanks) and an endpoint (empty:
// DefaultLocalGroupEndpoint), checked against the cluster: `rank` among them, each below
// `num_workers`, a sync mode. InvalidArgument naming what is wrong.
Result<LocalGroupOptions> LocalGroupFor(const std::string& ranks, const std::string& endpoint,
                                        int rank, int num_workers, const TrainingMode& mode,
                                        const std::vector<std::string>& ps_addresses);
// A unix socket in /tmp named after the user, the first server's port and the group's lowest
// rank: the same for every worker of the group, apart for two runs on one machine.
std::string DefaultLocalGroupEndpoint(const std::vector<std::string>& ps_addresses, int lowest);

class LocalGroup {
 public:
  // What the leader's exchange with the servers told, as the members get it.
  struct Outcome {
    Status status;
    int64_t last_version = 0;
    bool dropped = false;
    int64_t staleness = -1;
    std::vector<int64_t> read_versions;
    std::vector<uint64_t> read_incarnations;
  };

  // Binds (leader) or connects (member). InvalidArgument for options that do not make a
  // group (fewer than two ranks, `rank` not among them), Unavailable when the endpoint
  // cannot be bound.
  static Result<std::unique_ptr<LocalGroup>> Open(zmq::context_t& context,
                                                  const LocalGroupOptions& options);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  bool leads() const { return options_.rank == options_.ranks.front(); }
  const LocalGroupOptions& options() const { return options_; }

  // Leader: waits for the step's gradient of each member still in the group and sets
  // sum[v] = own[v] + theirs in rank order (sizes[v] floats each); adds their examples to
  // *examples. Returns the ranks whose gradients are in the sum, the leader's excluded.
  // Aborted when `interrupted` says stop; a member's malformed message is answered with an
  // error and that member dropped.
  Result<std::vector<int>> Gather(std::span<const float* const> own,
                                  std::span<const int64_t> sizes,
                                  std::vector<std::vector<float>>& sum, int64_t* examples,
                                  const std::function<bool()>& interrupted);
  // Leader: answers the members `ranks` (Gather's) with `outcome` and, when it is ok, the
  // parameters `params` (sizes[v] floats each).
  void Answer(std::span<const int> ranks, const Outcome& outcome,
              std::span<float* const> params, std::span<const int64_t> sizes);

  // Leaves the group (see above); idempotent, best effort (never blocks).
  void Close();

  // Member: sends this step's gradients (sizes[v] floats each) and `examples`, waits for the
  // leader's answer and copies its parameters into `params`. The leader's error comes back
  // as the outcome's status; this side's (the leader gone, a timeout, a malformed answer,
  // interrupted) as the Result's.
  Result<Outcome> Exchange(std::span<const float* const> grads, std::span<const int64_t> sizes,
                           int64_t examples, std::span<float* const> params,
                           const std::function<bool()>& interrupted);

 private:
  LocalGroup(const LocalGroupOptions& options, zmq::socket_t socket)
      : options_(options), socket_(std::move(socket)) {}
  using Clock = std::chrono::steady_clock;
  struct Taken {
    int rank;
    int64_t examples;
  };
  // Leader: when `parts` is the gradient of a member in `waiting` that fits `sizes` (it
  // leaves `waiting` then), its rank and examples; anything else is refused (Refuse) or
  // dropped (nullopt).
  std::optional<Taken> TakeMemberMessage(std::vector<zmq::message_t>& parts,
                                         std::span<const int64_t> sizes, std::set<int>& waiting);
  // Leader: drops from `waiting` (and the group) the members whose process is gone, or that
  // were never heard from and have been waited for since `start` longer than the timeout.
  void GiveUpOnSilent(std::set<int>& waiting, Clock::time_point start);
  size_t IndexOf(int rank) const;  // the rank's index in options_.ranks
  // Drops the member and tells it why (SendClosed): it goes on alone.
  void Refuse(int rank, const std::string& why);
  // Leader: tells `rank` the group is closed to it (`why`; empty: the leader left).
  void SendClosed(int rank, const std::string& why);

  LocalGroupOptions options_;
  zmq::socket_t socket_;
  std::string bound_path_;  // the leader's ipc socket file, removed on close
  std::set<int> dropped_;   // leader: members given up on
  std::vector<int> member_pid_;  // leader: by index in ranks, 0 until heard from
  int leader_pid_ = 0;           // member: 0 until the first answer
  bool closed_ = false;
  // Member: the steps it has exchanged, named in its messages and errors (the leader does not
  // check them: a restarted member counts from 1 again).
  uint64_t steps_ = 0;
};

}  // namespace parasync

// Coordinator: what a parameter-server shard knows about the workers — who is live, each
// rank's clock, and the state of the current sync step — and the rules of the three modes:
//
//   async   every gradient is applied on arrival; nobody waits.
//   sync    a step t collects gradients computed from version t, at most one per rank; once
//           R have arrived — or every live rank has given one — they are averaged and
//           applied once, and pulls waiting for version t+1 are answered. Gradients for an
//           older step are dropped. (A rank that gave its gradient and then left or died
//           still counts; the step waits only for live ranks that have not given one.)
//   sync:delayed  sync, but a step t also takes gradients computed from version t - 1, at
//           most one per rank as before: the workers compute step t+1's gradient while
//           step t is on the wire (one step of staleness, every step still one average).
//   ssp:K   gradients are applied on arrival, but a rank at clock c (c gradients accepted)
//           may pull only when every live rank has reached clock c - K.
//
// Liveness: every rank of the cluster starts live (so a sync run starts with everyone); a
// rank silent for worker_timeout is declared dead and leaves the barrier and staleness sets;
// any later message makes it live again at the slowest live clock (it rejoins "now"). A
// rank that sent Leave is out until it registers, pulls or pushes again (a heartbeat still
// in flight after its Leave does not bring it back).
//
// Pure state, no sockets and no tensors: ps/server.h drives it. Time is passed in. Not
// thread-safe: the server loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/mode.h"

namespace parasync {

class Coordinator {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  struct Options {
    TrainingMode mode;
    int num_workers = 1;
    int replicas_to_aggregate = 0;  // sync: R; 0 means num_workers
    std::chrono::milliseconds worker_timeout{10000};
  };

  struct Worker {
    enum class State : uint8_t { kLive, kDead, kLeft };
    State state = State::kLive;
    TimePoint last_seen{};
    int64_t clock = 0;           // gradients accepted (ssp clock)
    int64_t read_min_clock = 0;  // slowest live clock when its last pull was answered
    int64_t gradients = 0;       // applied or aggregated
    int64_t dropped = 0;         // dropped as stale
    bool contributed = false;    // sync: has a gradient in the current step
  };

  // Precondition: options.num_workers >= 1. All ranks start live, last seen `now`.
  Coordinator(const Options& options, TimePoint now);

  // Result of offering a sync gradient.
  enum class Offer : uint8_t {
    kAccept,     // add it to the step
    kStale,      // computed from an older version: drop it
    kDuplicate,  // this rank already contributed to the step: refuse it
    kFuture,     // computed from a version the shard has not reached: refuse it
  };

  // True when `rank` is a valid worker rank.
  bool ValidRank(int rank) const { return rank >= 0 && rank < num_workers(); }

  // Any message from `rank` (precondition: ValidRank). Refreshes its last-seen time; a dead
  // rank — or a departed one, unless `heartbeat` — becomes live again with its clock raised
  // to the slowest live clock (its last read stays what it was, so a gradient computed
  // before it was declared dead shows its true staleness). Returns true when it rejoined.
  bool Touch(int rank, TimePoint now, bool heartbeat = false);

  // Restarts every live rank's silence clock at `now` (when the model is registered: time
  // before that is start-up, not silence).
  void RestartSilenceClocks(TimePoint now);

  // `rank` is done: it leaves the live set (its gradient in the current step still counts).
  void Leave(int rank);

  // Declares dead every live rank silent for longer than worker_timeout; returns them.
  std::vector<int> ExpireSilent(TimePoint now);
  // Declares `rank` dead now, if live (its process is known gone: a restart of it asks to
  // join); returns whether it was live.
  bool DeclareDead(int rank);

  // --- sync ---
  // A gradient from `rank` computed from `read_version` while the shard is at `version`.
  // kAccept marks the rank as a contributor of the current step.
  Offer OfferSync(int rank, int64_t read_version, int64_t version);
  // OfferSync in two halves, for callers that must check the gradient between them: what
  // OfferSync would answer, without changing anything; and marking an accepted contributor.
  Offer ClassifySync(int rank, int64_t read_version, int64_t version) const;
  void Contribute(int rank);
  // Gradients in the current step.
  int contributors() const { return contributors_; }
  // How many gradients complete the current step: min(R, contributors + live ranks still
  // missing), at least 1.
  int needed() const;
  // The current step has enough gradients to be applied.
  bool StepReady() const { return contributors_ > 0 && contributors_ >= needed(); }
  // Call after applying the current step: starts the next one.
  void CompleteStep();
  // Live ranks that have not contributed to the current step (what a barrier waits for).
  std::vector<int> MissingFromStep() const;
  // `rank` is the one live rank the current step still misses (MissingFromStep() == {rank}),
  // without building the list.
  bool OnlyMissing(int rank) const;

  // --- ssp / accounting ---
  // ssp: may `rank` read now? Always true in other modes.
  bool PullAllowed(int rank) const;
  // Live ranks whose clock is below clock(rank) - K (what an ssp pull waits for).
  std::vector<int> SspBlockers(int rank) const;
  // A pull by `rank` was answered: remembers the slowest live clock it saw.
  void RecordRead(int rank);
  // What RecordGradient would return for a gradient from `rank` now.
  int64_t ClockStaleness(int rank) const;
  // A gradient from `rank` was applied or aggregated: its clock advances. Returns its clock
  // staleness: its clock before the gradient minus the slowest live clock at its last read
  // (at most K under ssp:K).
  int64_t RecordGradient(int rank);
  void RecordDropped(int rank);

  int num_workers() const { return static_cast<int>(workers_.size()); }
  int live_count() const;
  // Slowest clock among live ranks; the largest clock of any rank when none is live.
  int64_t MinLiveClock() const;
  const std::vector<Worker>& workers() const { return workers_; }
  const TrainingMode& mode() const { return options_.mode; }
  int64_t declared_dead() const { return declared_dead_; }

 private:
  Options options_;
  std::vector<Worker> workers_;
  int contributors_ = 0;
  int64_t declared_dead_ = 0;
};

}  // namespace parasync

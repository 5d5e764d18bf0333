#include "ps/coordinator.h"

#include <algorithm>
#include <limits>

namespace parasync {

Coordinator::Coordinator(const Options& options, TimePoint now)
    : options_(options), workers_(static_cast<size_t>(std::max(1, options.num_workers))) {
  for (Worker& w : workers_) w.last_seen = now;
}

bool Coordinator::Touch(int rank, TimePoint now, bool heartbeat) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  w.last_seen = now;
  if (w.state == Worker::State::kLive) return false;
  if (heartbeat && w.state == Worker::State::kLeft) return false;
  // Rejoin at the current point: behind nobody, blocking nobody.
  const int64_t slowest = MinLiveClock();
  w.state = Worker::State::kLive;
  w.clock = std::max(w.clock, slowest);
  return true;
}

void Coordinator::RestartSilenceClocks(TimePoint now) {
  for (Worker& w : workers_) {
    if (w.state == Worker::State::kLive) w.last_seen = now;
  }
}

void Coordinator::Leave(int rank) {
  workers_[static_cast<size_t>(rank)].state = Worker::State::kLeft;
}

std::vector<int> Coordinator::ExpireSilent(TimePoint now) {
  std::vector<int> expired;
  for (int r = 0; r < num_workers(); ++r) {
    Worker& w = workers_[static_cast<size_t>(r)];
    if (w.state == Worker::State::kLive && now - w.last_seen > options_.worker_timeout) {
      w.state = Worker::State::kDead;
      ++declared_dead_;
      expired.push_back(r);
    }
  }
  return expired;
}

bool Coordinator::DeclareDead(int rank) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  if (w.state != Worker::State::kLive) return false;
  w.state = Worker::State::kDead;
  ++declared_dead_;
  return true;
}

Coordinator::Offer Coordinator::ClassifySync(int rank, int64_t read_version,
                                             int64_t version) const {
  // sync:delayed: a step also takes gradients read one version before it (the workers
  // computed them while the step before was being exchanged).
  if (read_version < version - options_.mode.delay) return Offer::kStale;
  if (read_version > version) return Offer::kFuture;
  if (workers_[static_cast<size_t>(rank)].contributed) return Offer::kDuplicate;
  return Offer::kAccept;
}

void Coordinator::Contribute(int rank) {
  workers_[static_cast<size_t>(rank)].contributed = true;
  ++contributors_;
}

Coordinator::Offer Coordinator::OfferSync(int rank, int64_t read_version, int64_t version) {
  const Offer offer = ClassifySync(rank, read_version, version);
  if (offer == Offer::kAccept) Contribute(rank);
  return offer;
}

int Coordinator::needed() const {
  const int r = options_.replicas_to_aggregate > 0 ? options_.replicas_to_aggregate
                                                   : num_workers();
  int missing = 0;
  for (const Worker& w : workers_) {
    missing += w.state == Worker::State::kLive && !w.contributed ? 1 : 0;
  }
  return std::max(1, std::min(r, contributors_ + missing));
}

void Coordinator::CompleteStep() {
  for (Worker& w : workers_) w.contributed = false;
  contributors_ = 0;
}

std::vector<int> Coordinator::MissingFromStep() const {
  std::vector<int> missing;
  for (int r = 0; r < num_workers(); ++r) {
    const Worker& w = workers_[static_cast<size_t>(r)];
    if (w.state == Worker::State::kLive && !w.contributed) missing.push_back(r);
  }
  return missing;
}

bool Coordinator::OnlyMissing(int rank) const {
  for (int r = 0; r < num_workers(); ++r) {
    const Worker& w = workers_[static_cast<size_t>(r)];
    const bool missing = w.state == Worker::State::kLive && !w.contributed;
    if (missing != (r == rank)) return false;
  }
  return true;
}

bool Coordinator::PullAllowed(int rank) const {
  if (options_.mode.kind != TrainingMode::Kind::kSsp) return true;
  return MinLiveClock() >= workers_[static_cast<size_t>(rank)].clock - options_.mode.staleness;
}

std::vector<int> Coordinator::SspBlockers(int rank) const {
  std::vector<int> blockers;
  const int64_t floor = workers_[static_cast<size_t>(rank)].clock - options_.mode.staleness;
  for (int r = 0; r < num_workers(); ++r) {
    const Worker& w = workers_[static_cast<size_t>(r)];
    if (w.state == Worker::State::kLive && w.clock < floor) blockers.push_back(r);
  }
  return blockers;
}

void Coordinator::RecordRead(int rank) {
  workers_[static_cast<size_t>(rank)].read_min_clock = MinLiveClock();
}

int64_t Coordinator::ClockStaleness(int rank) const {
  const Worker& w = workers_[static_cast<size_t>(rank)];
  return std::max<int64_t>(0, w.clock - w.read_min_clock);
}

int64_t Coordinator::RecordGradient(int rank) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  const int64_t staleness = ClockStaleness(rank);
  ++w.clock;
  ++w.gradients;
  return staleness;
}

void Coordinator::RecordDropped(int rank) { ++workers_[static_cast<size_t>(rank)].dropped; }

int Coordinator::live_count() const {
  int n = 0;
  for (const Worker& w : workers_) n += w.state == Worker::State::kLive ? 1 : 0;
  return n;
}

int64_t Coordinator::MinLiveClock() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  int64_t fastest = 0;
  for (const Worker& w : workers_) {
    fastest = std::max(fastest, w.clock);
    if (w.state == Worker::State::kLive) slowest = std::min(slowest, w.clock);
  }
  return slowest == std::numeric_limits<int64_t>::max() ? fastest : slowest;
}

}  // namespace parasync

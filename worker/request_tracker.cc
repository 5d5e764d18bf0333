#include "worker/request_tracker.h"

#include <algorithm>

namespace parasync {

RequestTracker::RequestTracker(std::vector<int> shards, const Limits& limits)
    : shards_(std::move(shards)),
      limits_(limits),
      ids_(shards_.size(), 0),
      sent_at_(shards_.size()),
      sent_to_(shards_.size(), 0),
      backoff_(shards_.size(), limits.resend_after),
      complained_(shards_.size(), false),
      answered_(shards_.size(), false),
      answered_at_(shards_.size()),
      pending_(shards_.size()) {}

void RequestTracker::Sent(size_t i, uint64_t incarnation, Clock::time_point now) {
  sent_at_[i] = now;
  sent_to_[i] = incarnation;
}

void RequestTracker::Start(Clock::time_point now) {
  start_ = now;
  deadline_ = now + limits_.timeout;
}

RequestTracker::Resend RequestTracker::ResendDue(size_t i, uint64_t announced,
                                                 Clock::time_point now) {
  if (answered_[i]) return Resend::kNotDue;
  // A restarted server lost what was sent to its predecessor; a lost reply is asked for
  // again after the backoff.
  const bool restarted = announced != 0 && sent_to_[i] != 0 && announced != sent_to_[i];
  if (!restarted && now - sent_at_[i] < backoff_[i]) return Resend::kNotDue;
  backoff_[i] = restarted ? limits_.resend_after : std::min(backoff_[i] * 2, limits_.resend_max);
  return restarted ? Resend::kRestarted : Resend::kUnanswered;
}

bool RequestTracker::FirstComplaint(size_t i) {
  if (complained_[i]) return false;
  complained_[i] = true;
  return true;
}

std::optional<RequestTracker::Overdue> RequestTracker::CheckOverdue(Clock::time_point now) const {
  const size_t short_end = std::min(limits_.short_count, size());
  bool short_overdue = false;
  if (now >= start_ + limits_.short_timeout) {
    for (size_t i = 0; i < short_end; ++i) short_overdue |= !answered_[i];
  }
  if (now < deadline_ && !short_overdue) return std::nullopt;
  Overdue overdue{{}, short_overdue ? limits_.short_timeout : limits_.timeout};
  for (size_t i = 0; i < (short_overdue ? short_end : size()); ++i) {
    if (!answered_[i]) overdue.silent.push_back(i);
  }
  return overdue;
}

std::vector<int> RequestTracker::WaitingShards() const {
  std::vector<int> waiting;
  for (size_t i = 0; i < size(); ++i) {
    if (answered_[i] || std::find(waiting.begin(), waiting.end(), shards_[i]) != waiting.end()) {
      continue;
    }
    waiting.push_back(shards_[i]);
  }
  return waiting;
}

std::optional<size_t> RequestTracker::Match(int shard, uint64_t request_id) const {
  for (size_t i = 0; i < size(); ++i) {
    if (shards_[i] == shard && !answered_[i] && ids_[i] == request_id) return i;
  }
  return std::nullopt;
}

void RequestTracker::Answer(size_t i, Clock::time_point now) {
  if (answered_[i]) return;
  answered_[i] = true;
  answered_at_[i] = now;
  --pending_;
}

}  // namespace parasync

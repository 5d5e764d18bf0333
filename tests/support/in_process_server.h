// One parameter-server shard (ps/server.h) serving in a thread of the test binary, over real
// ZeroMQ on a free loopback port: the ps tests' server. Test-only code.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <zmq.hpp>

#include "ps/ps_metrics.h"
#include "ps/server.h"

namespace parasync::testing {

// A Server bound to a free loopback port, running Run() on its own thread until stopped or
// destroyed. Stopping raises Run's should_stop flag (checked at least every 100 ms) and waits a
// bounded time for Run to return; a Run that does not return is a test failure, and
// Server::Stop() then ends it so that the thread can be joined. The destructor stops it and
// expects Run's status to be ok. Used from the test's thread only.
class InProcessServer {
 public:
  static constexpr std::chrono::milliseconds kExitBound{5000};

  // `options` as given, but for the endpoint, which is tcp://127.0.0.1:* (a free port). A
  // server that cannot be created is a test failure and started() is false.
  InProcessServer(zmq::context_t& context, ServerOptions options)
      : metrics_(options.shard_index, options.num_workers) {
    options.endpoint = "tcp://127.0.0.1:*";
    auto server = Server::Create(context, options, &metrics_);
    if (!server.ok()) {
      ADD_FAILURE() << server.status().ToString();
      return;
    }
    server_ = std::move(server).value();
    endpoint_ = server_->endpoint();
    done_ = result_.get_future();
    thread_ = std::thread([this] {
      result_.set_value(server_->Run([this] { return should_stop_.load(); }));
    });
  }

  // Shard `shard_index` of `num_shards`, default options otherwise.
  InProcessServer(zmq::context_t& context, int shard_index, int num_shards)
      : InProcessServer(context, ShardOptions(shard_index, num_shards)) {}

  ~InProcessServer() {
    if (thread_.joinable()) {
      const Status s = StopAndWait();
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }

  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  bool started() const { return server_ != nullptr; }
  // The bound endpoint ("tcp://127.0.0.1:<port>"); "" if not started.
  const std::string& endpoint() const { return endpoint_; }
  PsMetrics& metrics() { return metrics_; }
  const PsMetrics& metrics() const { return metrics_; }
  double Rejected(RejectReason reason) const {
    return metrics_.rejected[static_cast<size_t>(reason)]->Value();
  }

  // Waits (bounded) for Run() to return on its own and joins it; Run's status, or TimedOut.
  Status WaitForExit() {
    if (!thread_.joinable()) return Status::Internal("server thread not running");
    if (done_.wait_for(kExitBound) != std::future_status::ready) {
      return Status::TimedOut("Run() did not return within the bound");
    }
    thread_.join();
    return done_.get();
  }

  // Raises the should_stop flag, then as WaitForExit.
  Status StopAndWait() {
    should_stop_.store(true);
    Status s = WaitForExit();
    if (s.code() == StatusCode::kTimedOut) {
      server_->Stop();  // a last resort so that the join below ends
      thread_.join();
    }
    return s;
  }

 private:
  static ServerOptions ShardOptions(int shard_index, int num_shards) {
    ServerOptions options;
    options.shard_index = shard_index;
    options.num_shards = num_shards;
    return options;
  }

  PsMetrics metrics_;  // outlives server_
  std::unique_ptr<Server> server_;
  std::string endpoint_;
  std::atomic<bool> should_stop_{false};
  std::promise<Status> result_;
  std::future<Status> done_;
  std::thread thread_;
};

}  // namespace parasync::testing

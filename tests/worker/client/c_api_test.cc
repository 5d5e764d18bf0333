// The C API (worker/client/c_api.h) as another language sees it: codes and messages, never an
// exception; buffers the caller's; against real servers over ZeroMQ on loopback.
#include "worker/client/c_api.h"

#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/mode.h"
#include "ps/server_options.h"
#include "tests/support/in_child.h"
#include "tests/support/in_process_server.h"
#include "tests/support/temp_dir.h"
#include "worker/data/dataset.h"

namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The message of a failed call, freed; "" for none.
std::string Take(char*& err) {
  std::string text = err == nullptr ? "" : err;
  parasync_free(err);
  err = nullptr;
  return text;
}

struct Handles {
  parasync_options_t* options = parasync_options_create();
  parasync_model_t* model = parasync_model_create();
  parasync_client_t* client = nullptr;
  ~Handles() {
    parasync_client_destroy(client);
    parasync_model_destroy(model);
    parasync_options_destroy(options);
  }
};

// A 6x4 kernel with rank 0's values and a table of 3-float rows.
void DescribeModel(parasync_model_t* m) {
  char* err = nullptr;
  const int64_t kernel[] = {6, 4};
  const int64_t bias[] = {4};
  ASSERT_EQ(parasync_model_add_variable(m, "kernel", kernel, 2, PARASYNC_INIT_PROVIDED, 0, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_add_variable(m, "bias", bias, 1, PARASYNC_INIT_CONSTANT, 0.5f, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_add_table(m, "words", 0, 3, PARASYNC_INIT_CONSTANT, 0.25f, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_set_optimizer(m, "sgd", 0.5, &err), PARASYNC_OK);
  parasync_model_set_seed(m, 3);
}

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.started());
    const std::string endpoint = server_.endpoint();  // tcp://127.0.0.1:PORT
    address_ = endpoint.substr(endpoint.find("//") + 2);
    char* err = nullptr;
    ASSERT_EQ(parasync_options_set_cluster(h_.options, address_.c_str(), 1, 0, &err), PARASYNC_OK)
        << Take(err);
    ASSERT_EQ(parasync_options_set_metrics(h_.options, "127.0.0.1", 0, dir_.path().c_str(), &err),
              PARASYNC_OK);
    ASSERT_EQ(parasync_options_set_timeouts(h_.options, 5, 5, 0.5, &err), PARASYNC_OK);
    ASSERT_EQ(parasync_client_connect(h_.options, &h_.client, &err), PARASYNC_OK) << Take(err);
    DescribeModel(h_.model);
  }

  zmq::context_t context_;
  parasync::testing::InProcessServer server_{context_, 0, 1};
  parasync::testing::TempDir dir_;
  std::string address_;
  Handles h_;
  std::vector<float> kernel_ = std::vector<float>(24, 0.125f);
  std::vector<float> bias_ = std::vector<float>(4);
};

TEST_F(CApiTest, ATrainingStepThroughTheCApi) {
  char* err = nullptr;
  EXPECT_EQ(parasync_client_rank(h_.client), 0);
  EXPECT_EQ(parasync_client_num_shards(h_.client), 1);
  EXPECT_STREQ(parasync_client_mode(h_.client), "async");
  EXPECT_GT(parasync_client_metrics_port(h_.client), 0);
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK) << Take(err);
  float* params[] = {kernel_.data(), bias_.data()};
  std::fill(kernel_.begin(), kernel_.end(), 0.0f);
  ASSERT_EQ(parasync_client_pull(h_.client, params, 2, 0, nullptr, 0, &err), PARASYNC_OK);
  EXPECT_EQ(kernel_, std::vector<float>(24, 0.125f));  // rank 0's values
  EXPECT_EQ(bias_, std::vector<float>(4, 0.5f));       // the constant initializer
  // A step: the gradients of both variables, and two rows (ids as unsigned, sorted).
  std::vector<float> gk(24, 0.25f), gb(4, 1.0f), rows(6, 2.0f);
  const uint64_t ids[] = {7, ~uint64_t{0}};
  parasync_rows_t pushed = {0, ids, 2, rows.data()};
  ASSERT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 1, gb.data(), &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 0, gk.data(), &err), PARASYNC_OK);
  parasync_step_times_t times{};
  ASSERT_EQ(parasync_client_step_finish(h_.client, &pushed, 1, params, 2, nullptr, 0, &times, &err),
            PARASYNC_OK)
      << Take(err);
  EXPECT_EQ(kernel_, std::vector<float>(24, 0.125f - 0.5f * 0.25f));
  EXPECT_EQ(bias_, std::vector<float>(4, 0.0f));
  EXPECT_GT(times.pulled, 0.0);
  std::vector<float> read(6);
  parasync_rows_t pulled = {0, ids, 2, read.data()};
  ASSERT_EQ(parasync_client_pull(h_.client, nullptr, 0, 0, &pulled, 1, &err), PARASYNC_OK);
  EXPECT_EQ(read, std::vector<float>(6, 0.25f - 0.5f * 2.0f));
  int64_t step = 0, examples = 0;
  ASSERT_EQ(parasync_client_global_progress(h_.client, &step, &examples, &err), PARASYNC_OK);
  EXPECT_EQ(step, 1);
  EXPECT_EQ(examples, 8);
  // What a worker reports: eval.jsonl and the metrics snapshot.
  parasync_client_observe_step(h_.client, 8, 0.5, 0.001, 0.002, 0.003);
  const parasync_eval_t eval = {1, 0.5, 0.25, 0.75, NAN, 100.0, 2.0, 8, nullptr, 0.0, 0.0};
  ASSERT_EQ(parasync_client_log_eval(h_.client, &eval, &err), PARASYNC_OK) << Take(err);
  EXPECT_EQ(parasync_client_last_logged_epoch(h_.client), 1);
  // A worker-side optimizer (parasync.horovod's) names itself and its rate.
  const parasync_eval_t worker_side = {2, 0.4, 0.2, 0.8, NAN, 100.0, 3.0, 8, "AdamW", 0.004,
                                       0.0};
  ASSERT_EQ(parasync_client_log_eval(h_.client, &worker_side, &err), PARASYNC_OK) << Take(err);
  // An evaluation within epoch 3, half of it done (--eval-every): not a whole epoch logged.
  const parasync_eval_t within = {3, NAN, 0.3, 0.7, NAN, 0.0, 3.5, 8, nullptr, 0.0, 2.5};
  ASSERT_EQ(parasync_client_log_eval(h_.client, &within, &err), PARASYNC_OK) << Take(err);
  EXPECT_EQ(parasync_client_last_logged_epoch(h_.client), 2);
  std::ifstream log(dir_.path() + "/eval.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  const auto row = nlohmann::json::parse(line);
  EXPECT_EQ(row["test_accuracy"], 0.75);
  EXPECT_EQ(row["step"], 1);
  EXPECT_EQ(row["examples"], 8);
  EXPECT_EQ(row["optimizer"], "sgd");
  EXPECT_TRUE(row["test_auc"].is_null());
  ASSERT_TRUE(std::getline(log, line));
  const auto second = nlohmann::json::parse(line);
  EXPECT_EQ(second["optimizer"], "AdamW");
  EXPECT_DOUBLE_EQ(second["learning_rate"].get<double>(), 0.004);
  EXPECT_EQ(second["lr_schedule"], "worker");
  EXPECT_FALSE(second.contains("within_epoch"));
  ASSERT_TRUE(std::getline(log, line));
  const auto third = nlohmann::json::parse(line);
  EXPECT_DOUBLE_EQ(third["epoch"].get<double>(), 2.5);
  EXPECT_EQ(third["within_epoch"], true);
  ASSERT_EQ(parasync_client_finish(h_.client, 1, &err), PARASYNC_OK) << Take(err);
  std::stringstream snapshot;
  snapshot << std::ifstream(dir_.path() + "/metrics-worker0.prom").rdbuf();
  EXPECT_THAT(snapshot.str(), HasSubstr("parasync_worker_examples_total{rank=\"0\",role=\"worker\"} 8"));
  EXPECT_THAT(snapshot.str(), HasSubstr("parasync_worker_finished{rank=\"0\",role=\"worker\"} 1"));
}

TEST_F(CApiTest, ErrorsAreACodeAndOneLineNeverAnException) {
  char* err = nullptr;
  EXPECT_EQ(parasync_options_set_mode(h_.options, "fast", &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("fast"));
  EXPECT_EQ(parasync_options_set_wire_dtype(h_.options, "int2", &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("int2"));
  EXPECT_EQ(parasync_model_set_optimizer(h_.model, "rmsprop", 0.1, &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("rmsprop"));
  EXPECT_EQ(parasync_model_set(h_.model, "nesterov", 1, &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("nesterov"));
  EXPECT_EQ(parasync_options_set_cluster(h_.options, "nohost", 1, 0, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("nohost"));
  // Before registering, nothing moves; a wrong number of arrays is refused by name.
  float* params[] = {kernel_.data(), bias_.data()};
  EXPECT_EQ(parasync_client_pull(h_.client, params, 2, 0, nullptr, 0, &err),
            PARASYNC_FAILED_PRECONDITION);
  EXPECT_THAT(Take(err), HasSubstr("not registered"));
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK);
  EXPECT_EQ(parasync_client_pull(h_.client, params, 1, 0, nullptr, 0, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("1 parameter arrays for a model of 2"));
  // Unsorted ids.
  std::vector<float> rows(6);
  const uint64_t ids[] = {9, 2};
  parasync_rows_t r = {0, ids, 2, rows.data()};
  EXPECT_EQ(parasync_client_pull(h_.client, nullptr, 0, 0, &r, 1, &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("sorted"));
}

TEST_F(CApiTest, AnotherModelThanTheServersHoldIsRefusedNamingTheVariable) {
  char* err = nullptr;
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK);
  parasync_model_t* other = parasync_model_create();
  const int64_t kernel[] = {6, 5};
  const int64_t bias[] = {4};
  ASSERT_EQ(parasync_model_add_variable(other, "kernel", kernel, 2, PARASYNC_INIT_PROVIDED, 0, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_add_variable(other, "bias", bias, 1, PARASYNC_INIT_CONSTANT, 0.5f, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_add_table(other, "words", 0, 3, PARASYNC_INIT_CONSTANT, 0.25f, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_set_optimizer(other, "sgd", 0.5, &err), PARASYNC_OK);
  parasync_model_set_seed(other, 3);
  std::vector<float> bigger(30);
  const float* values[] = {bigger.data(), nullptr};
  EXPECT_EQ(parasync_client_register(h_.client, other, values, &err), PARASYNC_FAILED_PRECONDITION);
  const std::string message = Take(err);
  EXPECT_THAT(message, HasSubstr("kernel"));
  EXPECT_THAT(message, HasSubstr("differs"));
  parasync_model_destroy(other);
}

// sync:delayed through step_launch: the exchange runs while the caller goes on, a position set
// meanwhile is the next push's, the next step's gradient counts from the parameters held
// before the launch (one version old: staleness 1), and each step is applied once.
TEST(CApiDelayedTest, ALaunchedStepIsExchangedBehindTheCallerAndCountedOnce) {
  zmq::context_t context;
  parasync::ServerOptions so;
  so.mode = *parasync::TrainingMode::Parse("sync:delayed");
  parasync::testing::InProcessServer server(context, so);
  ASSERT_TRUE(server.started());
  parasync::testing::TempDir dir;
  Handles h;
  char* err = nullptr;
  const std::string address = server.endpoint().substr(server.endpoint().find("//") + 2);
  ASSERT_EQ(parasync_options_set_cluster(h.options, address.c_str(), 1, 0, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_mode(h.options, "sync:delayed", &err), PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_metrics(h.options, "127.0.0.1", -1, dir.path().c_str(), &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_timeouts(h.options, 5, 5, 0.5, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_connect(h.options, &h.client, &err), PARASYNC_OK) << Take(err);
  const int64_t shape[] = {4};
  ASSERT_EQ(parasync_model_add_variable(h.model, "w", shape, 1, PARASYNC_INIT_CONSTANT, 1.0f, &err),
            PARASYNC_OK);
  ASSERT_EQ(parasync_model_set_optimizer(h.model, "sgd", 0.5, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_register(h.client, h.model, nullptr, &err), PARASYNC_OK) << Take(err);
  std::vector<float> w(4), next(4, -1.0f), g(4, 1.0f);
  float* params[] = {w.data()};
  float* into[] = {next.data()};
  ASSERT_EQ(parasync_client_pull(h.client, params, 1, 0, nullptr, 0, &err), PARASYNC_OK);
  parasync_step_times_t times{};
  EXPECT_EQ(parasync_client_step_wait(h.client, &times, &err), PARASYNC_FAILED_PRECONDITION);
  EXPECT_THAT(Take(err), HasSubstr("no step was launched"));
  for (int step = 1; step <= 3; ++step) {
    ASSERT_EQ(parasync_client_step_begin(h.client, 8, &err), PARASYNC_OK) << Take(err);
    ASSERT_EQ(parasync_client_step_gradient(h.client, 0, g.data(), &err), PARASYNC_OK);
    ASSERT_EQ(parasync_client_step_launch(h.client, into, 1, &err), PARASYNC_OK) << Take(err);
    parasync_client_set_progress(h.client, 1, 8 * step, 24);  // the next push's position
    ASSERT_EQ(parasync_client_step_wait(h.client, &times, &err), PARASYNC_OK) << Take(err);
    EXPECT_GE(times.pulled, times.pushes_acked);
    // Step s applied once: 1 - 0.5 s.
    EXPECT_EQ(next, std::vector<float>(4, 1.0f - 0.5f * static_cast<float>(step)));
    // The first gradient came from the latest pull; each later one from the parameters read
    // before the exchange that was then in flight.
    EXPECT_EQ(parasync_client_last_push_staleness(h.client), step == 1 ? 0 : 1);
  }
  EXPECT_EQ(parasync_client_step_wait(h.client, &times, &err), PARASYNC_FAILED_PRECONDITION);
  EXPECT_THAT(Take(err), HasSubstr("no step was launched"));
  int64_t step = 0, examples = 0;
  ASSERT_EQ(parasync_client_global_progress(h.client, &step, &examples, &err), PARASYNC_OK);
  EXPECT_EQ(step, 3);
  EXPECT_EQ(examples, 24);
  // A pull while an exchange is in flight waits for it, then reads the step it completes.
  ASSERT_EQ(parasync_client_step_begin(h.client, 8, &err), PARASYNC_OK) << Take(err);
  ASSERT_EQ(parasync_client_step_gradient(h.client, 0, g.data(), &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_launch(h.client, into, 1, &err), PARASYNC_OK) << Take(err);
  ASSERT_EQ(parasync_client_pull(h.client, params, 1, PARASYNC_NEXT_STEP, nullptr, 0, &err),
            PARASYNC_OK)
      << Take(err);
  EXPECT_EQ(w, std::vector<float>(4, 1.0f - 0.5f * 4));
  EXPECT_EQ(parasync_client_step_wait(h.client, &times, &err), PARASYNC_OK) << Take(err);
  // What the servers recorded (read back by registering again, as a restarted worker does):
  // the position set during the third step's exchange, carried by the fourth push.
  ASSERT_EQ(parasync_client_register(h.client, h.model, nullptr, &err), PARASYNC_OK) << Take(err);
  int epoch = 0;
  int64_t done = 0, of = 0;
  parasync_client_recorded_progress(h.client, &epoch, &done, &of);
  EXPECT_EQ(epoch, 1);
  EXPECT_EQ(done, 24);
}

// step_launch is sync:delayed's, for dense models: elsewhere it is refused by name and the step
// ends (the next one begins).
TEST_F(CApiTest, ALaunchOutsideSyncDelayedIsRefusedAndTheStepEnds) {
  char* err = nullptr;
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK) << Take(err);
  float* params[] = {kernel_.data(), bias_.data()};
  ASSERT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK);
  EXPECT_EQ(parasync_client_step_launch(h_.client, params, 2, &err), PARASYNC_FAILED_PRECONDITION);
  EXPECT_THAT(Take(err), HasSubstr("only sync:delayed accepts (this client runs async)"));
  EXPECT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK) << Take(err);
}

TEST(CApiConnectTest, NoServerAnsweringTimesOutNamingTheAddress) {
  Handles h;
  char* err = nullptr;
  ASSERT_EQ(parasync_options_set_cluster(h.options, "127.0.0.1:9", 1, 0, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_timeouts(h.options, 1, 1, 0.2, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_connect(h.options, &h.client, &err), PARASYNC_OK) << Take(err);
  DescribeModel(h.model);
  std::vector<float> kernel(24);
  const float* initial[] = {kernel.data(), nullptr};
  EXPECT_EQ(parasync_client_register(h.client, h.model, initial, &err), PARASYNC_TIMED_OUT);
  EXPECT_THAT(Take(err), HasSubstr("127.0.0.1:9"));
}

TEST(CApiShardTest, ShardIndicesAreTheWorkersOrder) {
  char* err = nullptr;
  size_t count = 0;
  ASSERT_EQ(parasync_shard_indices(103, 1, 4, 42, 3, 1, nullptr, 0, &count, &err), PARASYNC_OK);
  std::vector<int64_t> got(count);
  ASSERT_EQ(parasync_shard_indices(103, 1, 4, 42, 3, 1, got.data(), got.size(), &count, &err),
            PARASYNC_OK);
  // parasync-worker's: the shard, shuffled for epochs 1, 2 and 3 in turn.
  std::vector<int64_t> want = parasync::ShardIndices(103, 1, 4);
  for (int e = 1; e <= 3; ++e) parasync::ShuffleForEpoch(&want, 42, 1, e);
  EXPECT_EQ(got, want);
  EXPECT_EQ(parasync_shard_indices(103, 4, 4, 42, 1, 1, nullptr, 0, &count, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("rank"));
}

// ---- NULL: refused, never dereferenced ------------------------------------------------------

// What `calls` wrote on stdout and stderr: the library logs on either (spdlog's default
// logger before a client set up parasync's).
std::string Logged(const std::function<void()>& calls) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  calls();
  std::string out = ::testing::internal::GetCapturedStdout();
  return out + ::testing::internal::GetCapturedStderr();
}

TEST(CApiNullTest, CodedCallsRefuseANullHandleNamingIt) {
  char* err = nullptr;
  const auto refused = [&](int code, const std::string& what) {
    EXPECT_EQ(code, PARASYNC_INVALID_ARGUMENT) << what;
    EXPECT_THAT(Take(err), HasSubstr(what + " is NULL"));
  };
  refused(parasync_options_set_cluster(nullptr, "127.0.0.1:9", 1, 0, &err), "options");
  refused(parasync_options_set_mode(nullptr, "async", &err), "options");
  refused(parasync_options_set_timeouts(nullptr, 1, 1, 0.1, &err), "options");
  refused(parasync_options_set_curve(nullptr, nullptr, nullptr, &err), "options");
  refused(parasync_options_set_wire_dtype(nullptr, "float32", &err), "options");
  refused(parasync_options_set_metrics(nullptr, nullptr, -1, nullptr, &err), "options");
  refused(parasync_options_set_log_level(nullptr, "info", &err), "options");
  const int64_t shape[] = {2};
  refused(parasync_model_add_variable(nullptr, "w", shape, 1, PARASYNC_INIT_ZEROS, 0, &err),
          "model");
  refused(parasync_model_add_table(nullptr, "t", 0, 2, PARASYNC_INIT_ZEROS, 0, &err), "model");
  refused(parasync_model_set_optimizer(nullptr, "sgd", 0.1, &err), "model");
  refused(parasync_model_set(nullptr, "momentum", 0.9, &err), "model");
  refused(parasync_model_validate(nullptr, &err), "model");
  Handles h;
  ASSERT_EQ(parasync_options_set_cluster(h.options, "127.0.0.1:9", 1, 0, &err), PARASYNC_OK);
  refused(parasync_client_connect(nullptr, &h.client, &err), "options");
  EXPECT_EQ(h.client, nullptr);
  refused(parasync_client_connect(h.options, nullptr, &err), "client");
  refused(parasync_client_register(nullptr, h.model, nullptr, &err), "client");
  std::vector<float> values(2);
  float* params[] = {values.data()};
  const float* grads[] = {values.data()};
  refused(parasync_client_pull(nullptr, params, 1, 0, nullptr, 0, &err), "client");
  refused(parasync_client_push(nullptr, grads, 1, 1, nullptr, 0, &err), "client");
  refused(parasync_client_step_begin(nullptr, 1, &err), "client");
  refused(parasync_client_step_gradient(nullptr, 0, values.data(), &err), "client");
  refused(parasync_client_step_finish(nullptr, nullptr, 0, params, 1, nullptr, 0, nullptr, &err),
          "client");
  const parasync_eval_t eval{};
  refused(parasync_client_log_eval(nullptr, &eval, &err), "client");
  refused(parasync_client_wait_for_workers(nullptr, 1, &err), "client");
  int64_t step = 0, examples = 0;
  refused(parasync_client_global_progress(nullptr, &step, &examples, &err), "client");
  refused(parasync_client_checkpoint(nullptr, &err), "client");
  refused(parasync_client_finish(nullptr, 1, &err), "client");
  size_t count = 0;
  int64_t out[4];
  refused(parasync_shard_indices(8, 0, 2, 1, 1, 1, out, 4, nullptr, &err), "count");
  refused(parasync_shard_indices(8, 0, 2, 1, 1, 1, nullptr, 4, &count, &err), "out");
  // NULL where the call says it may be: learning the shard's size.
  EXPECT_EQ(parasync_shard_indices(8, 0, 2, 1, 1, 1, nullptr, 0, &count, &err), PARASYNC_OK);
  EXPECT_EQ(count, 4u);
}

TEST(CApiNullTest, CallsWithoutErrmsgRefuseANullHandleLoggingWhy) {
  struct Answers {
    size_t num_variables;
    int rank, num_workers, num_shards, metrics_port, dropped, logged_epoch;
    std::string mode;
    int64_t staleness, version, resends, reconnects;
  } got{};
  int epoch = 7;
  int64_t done = 7, of = 7;
  const std::string logged = Logged([&] {
    parasync_model_set_seed(nullptr, 1);
    parasync_model_set_name(nullptr, "m");
    parasync_model_set_description(nullptr, "{}");
    got.num_variables = parasync_model_num_variables(nullptr);
    got.rank = parasync_client_rank(nullptr);
    got.num_workers = parasync_client_num_workers(nullptr);
    got.num_shards = parasync_client_num_shards(nullptr);
    got.mode = parasync_client_mode(nullptr);
    got.metrics_port = parasync_client_metrics_port(nullptr);
    parasync_client_recorded_progress(nullptr, &epoch, &done, &of);
    parasync_client_set_progress(nullptr, 1, 2, 3);
    got.dropped = parasync_client_last_push_dropped(nullptr);
    got.staleness = parasync_client_last_push_staleness(nullptr);
    got.version = parasync_client_last_version(nullptr);
    parasync_client_observe_step(nullptr, 1, 0.5, 0, 0, 0);
    parasync_client_beat(nullptr);
    parasync_client_set_epoch(nullptr, 1);
    got.logged_epoch = parasync_client_last_logged_epoch(nullptr);
    got.resends = parasync_client_resends(nullptr);
    got.reconnects = parasync_client_reconnects(nullptr);
    parasync_log("info", nullptr);
  });
  EXPECT_EQ(got.num_variables, 0u);
  EXPECT_EQ(got.rank, -1);
  EXPECT_EQ(got.num_workers, -1);
  EXPECT_EQ(got.num_shards, -1);
  EXPECT_EQ(got.mode, "");
  EXPECT_EQ(got.metrics_port, -1);
  EXPECT_EQ(got.dropped, -1);
  EXPECT_EQ(got.staleness, -1);
  EXPECT_EQ(got.version, -1);
  EXPECT_EQ(got.logged_epoch, -1);
  EXPECT_EQ(got.resends, -1);
  EXPECT_EQ(got.reconnects, -1);
  EXPECT_EQ(epoch, 7);
  EXPECT_EQ(done, 7);
  EXPECT_EQ(of, 7);
  for (const char* call :
       {"parasync_model_set_seed", "parasync_model_set_name", "parasync_model_set_description",
        "parasync_model_num_variables"}) {
    EXPECT_THAT(logged, HasSubstr(std::string(call) + ": model is NULL"));
  }
  for (const char* call :
       {"parasync_client_rank", "parasync_client_num_workers", "parasync_client_num_shards",
        "parasync_client_mode", "parasync_client_metrics_port",
        "parasync_client_recorded_progress", "parasync_client_set_progress",
        "parasync_client_last_push_dropped", "parasync_client_last_push_staleness",
        "parasync_client_last_version", "parasync_client_observe_step", "parasync_client_beat",
        "parasync_client_set_epoch", "parasync_client_last_logged_epoch",
        "parasync_client_resends", "parasync_client_reconnects"}) {
    EXPECT_THAT(logged, HasSubstr(std::string(call) + ": client is NULL"));
  }
  EXPECT_THAT(logged, HasSubstr("parasync_log: message is NULL"));
}

TEST_F(CApiTest, NullArraysAndOutputsAreRefusedAndAStepStillEnds) {
  char* err = nullptr;
  EXPECT_EQ(parasync_client_register(h_.client, nullptr, nullptr, &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("model is NULL"));
  const float* no_kernel[] = {nullptr, nullptr};  // the kernel is PROVIDED
  EXPECT_EQ(parasync_client_register(h_.client, h_.model, no_kernel, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("initial_values[0] is NULL"));
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK) << Take(err);

  float* no_bias[] = {kernel_.data(), nullptr};
  EXPECT_EQ(parasync_client_pull(h_.client, nullptr, 2, 0, nullptr, 0, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("params is NULL"));
  EXPECT_EQ(parasync_client_pull(h_.client, no_bias, 2, 0, nullptr, 0, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("params[1] is NULL"));
  EXPECT_EQ(parasync_client_pull(h_.client, nullptr, 0, 0, nullptr, 1, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("rows is NULL"));
  std::vector<float> row_values(6);
  const parasync_rows_t no_ids = {0, nullptr, 2, row_values.data()};
  EXPECT_EQ(parasync_client_pull(h_.client, nullptr, 0, 0, &no_ids, 1, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("rows[0]: ids or values is NULL"));
  EXPECT_EQ(parasync_client_push(h_.client, nullptr, 2, 8, nullptr, 0, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("grads is NULL"));

  // A step whose finish is refused still ends (its early pushes settled): the next begins.
  std::vector<float> gk(24, 0.25f), gb(4, 1.0f);
  ASSERT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 0, gk.data(), &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 1, gb.data(), &err), PARASYNC_OK);
  EXPECT_EQ(parasync_client_step_finish(h_.client, nullptr, 0, no_bias, 2, nullptr, 0, nullptr,
                                        &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("params[1] is NULL"));
  ASSERT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK) << Take(err);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 0, gk.data(), &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 1, gb.data(), &err), PARASYNC_OK);
  EXPECT_EQ(parasync_client_step_finish(h_.client, nullptr, 1, nullptr, 0, nullptr, 0, nullptr,
                                        &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("push_rows is NULL"));
  ASSERT_EQ(parasync_client_step_begin(h_.client, 8, &err), PARASYNC_OK) << Take(err);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 0, gk.data(), &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_step_gradient(h_.client, 1, gb.data(), &err), PARASYNC_OK);
  float* params[] = {kernel_.data(), bias_.data()};
  ASSERT_EQ(parasync_client_step_finish(h_.client, nullptr, 0, params, 2, nullptr, 0, nullptr,
                                        &err),
            PARASYNC_OK)
      << Take(err);

  const parasync_eval_t* no_eval = nullptr;
  EXPECT_EQ(parasync_client_log_eval(h_.client, no_eval, &err), PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("eval is NULL"));
  int64_t examples = 0;
  EXPECT_EQ(parasync_client_global_progress(h_.client, nullptr, &examples, &err),
            PARASYNC_INVALID_ARGUMENT);
  EXPECT_THAT(Take(err), HasSubstr("step is NULL"));
  int64_t done = 7, of = 7;
  const std::string logged =
      Logged([&] { parasync_client_recorded_progress(h_.client, nullptr, &done, &of); });
  EXPECT_THAT(logged, HasSubstr("parasync_client_recorded_progress: epoch is NULL"));
  EXPECT_EQ(done, 7);
}

// ---- Signals: what was installed before still happens ---------------------------------------

// The wait status `status` in words: "killed by SIGTERM", "exited with 0".
std::string Described(int status) {
  if (status == -1) return "no child";
  if (WIFSIGNALED(status)) return std::string("killed by ") + sigabbrev_np(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  return "status " + std::to_string(status);
}

// In a child: `before` installed for `number`, then the library's handlers over it, then
// `number` raised; the child exits with what `after` returns (0: as expected) if it lives.
int RaiseOver(int number, const struct sigaction& before, const std::function<int()>& after) {
  return parasync::testing::RunInChild([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, number);
    if (sigprocmask(SIG_UNBLOCK, &set, nullptr) != 0) return 10;
    if (sigaction(number, &before, nullptr) != 0) return 11;
    parasync_install_signal_handlers();
    raise(number);
    return after();
  });
}

struct sigaction Disposition(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  return sa;
}

volatile sig_atomic_t g_handled = 0;
void Handle(int number) { g_handled = number; }
void HandleWithInfo(int number, siginfo_t* info, void*) {
  g_handled = info != nullptr && info->si_signo == number ? number : -1;
}

TEST(CApiSignalTest, WhereTheDefaultActionWasTheSignalStillEndsTheProcess) {
  for (int number : {SIGTERM, SIGINT}) {
    const int status = RaiseOver(number, Disposition(SIG_DFL), [] { return 0; });
    EXPECT_EQ(Described(status), std::string("killed by ") + sigabbrev_np(number));
  }
}

TEST(CApiSignalTest, AHandlerInstalledBeforeIsStillCalled) {
  struct sigaction with_info {};
  with_info.sa_sigaction = HandleWithInfo;
  with_info.sa_flags = SA_SIGINFO;
  sigemptyset(&with_info.sa_mask);
  for (int number : {SIGTERM, SIGINT}) {
    for (const struct sigaction& before : {Disposition(Handle), with_info}) {
      const int status = RaiseOver(number, before, [number] {
        if (g_handled != number) return 1;
        return parasync_stop_requested() == number ? 0 : 2;
      });
      EXPECT_EQ(Described(status), "exited with 0") << sigabbrev_np(number);
    }
  }
}

TEST(CApiSignalTest, WhereTheSignalWasIgnoredOnlyTheFlagIsSet) {
  for (int number : {SIGTERM, SIGINT}) {
    const int status = RaiseOver(number, Disposition(SIG_IGN), [number] {
      return parasync_stop_requested() == number ? 0 : 1;
    });
    EXPECT_EQ(Described(status), "exited with 0") << sigabbrev_np(number);
  }
}

// ---- The lock: every getter waits for the call in flight ------------------------------------

// Register waits 4 s for a server that never answers, resending after 1 s and 3 s. A getter
// called meanwhile waits for it, so it reads the count before (0) or after (2), never the 1
// between.
TEST(CApiLockTest, AGetterWaitsForTheCallInFlight) {
  Handles h;
  char* err = nullptr;
  ASSERT_EQ(parasync_options_set_cluster(h.options, "127.0.0.1:9", 1, 0, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_timeouts(h.options, 1, 4, 0.2, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_client_connect(h.options, &h.client, &err), PARASYNC_OK) << Take(err);
  DescribeModel(h.model);
  std::atomic<bool> returned{false};
  int code = -1;
  std::thread registering([&] {
    std::vector<float> kernel(24);
    const float* initial[] = {kernel.data(), nullptr};
    char* message = nullptr;
    code = parasync_client_register(h.client, h.model, initial, &message);
    parasync_free(message);
    returned = true;
  });
  std::set<int64_t> seen;
  while (!returned) {
    seen.insert(parasync_client_resends(h.client));
    // The other getters of state a call changes, for ThreadSanitizer.
    int epoch = 0;
    int64_t done = 0, of = 0;
    parasync_client_recorded_progress(h.client, &epoch, &done, &of);
    (void)parasync_client_reconnects(h.client);
    (void)parasync_client_last_version(h.client);
    (void)parasync_client_last_push_dropped(h.client);
    (void)parasync_client_last_push_staleness(h.client);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  registering.join();
  EXPECT_EQ(code, PARASYNC_TIMED_OUT);
  const int64_t resends = parasync_client_resends(h.client);
  ASSERT_GE(resends, 2) << "no count between the first and the last to see";
  seen.erase(0);
  seen.erase(resends);
  EXPECT_THAT(seen, IsEmpty()) << "counts read while register was in flight (of " << resends
                               << ")";
}

// Steps on one thread, the getters on another: meaningful under ThreadSanitizer
// (tools/run-sanitizers.sh tsan), which reports a getter that reads without the lock.
TEST_F(CApiTest, GettersReadUnderTheLockWhileAnotherThreadSteps) {
  char* err = nullptr;
  const float* initial[] = {kernel_.data(), nullptr};
  ASSERT_EQ(parasync_client_register(h_.client, h_.model, initial, &err), PARASYNC_OK) << Take(err);
  constexpr int kSteps = 20;
  std::atomic<bool> finished{false};
  int failed_at = -1;
  std::thread training([&] {
    std::vector<float> gk(24, 0.0f), gb(4, 0.0f);
    const float* grads[] = {gk.data(), gb.data()};
    float* params[] = {kernel_.data(), bias_.data()};
    char* message = nullptr;
    for (int i = 0; i < kSteps && failed_at < 0; ++i) {
      if (parasync_client_push(h_.client, grads, 2, 1, nullptr, 0, &message) != PARASYNC_OK ||
          parasync_client_pull(h_.client, params, 2, 0, nullptr, 0, &message) != PARASYNC_OK) {
        failed_at = i;
      }
      parasync_client_observe_step(h_.client, 1, 0.5, 0, 0, 0);
    }
    parasync_free(message);
    finished = true;
  });
  int64_t last = 0;
  bool ordered = true;
  while (!finished) {
    const int64_t version = parasync_client_last_version(h_.client);
    ordered = ordered && version >= last;
    last = version;
    (void)parasync_client_last_push_dropped(h_.client);
    (void)parasync_client_last_push_staleness(h_.client);
    (void)parasync_client_resends(h_.client);
    std::this_thread::yield();
  }
  training.join();
  EXPECT_EQ(failed_at, -1);
  EXPECT_TRUE(ordered) << "the version went back";
  EXPECT_EQ(parasync_client_last_version(h_.client), kSteps);
  EXPECT_EQ(parasync_client_last_push_dropped(h_.client), 0);
}

}  // namespace

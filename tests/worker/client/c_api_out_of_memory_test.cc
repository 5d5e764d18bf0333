// The C API when memory runs out: nothing thrown crosses it, whatever the call returns. This
// binary replaces the global operator new, and every operator delete that frees what it
// returns, with one that fails once on demand on the thread that asks, so that a bad_alloc
// starts inside the library (which takes its operator new from here: it imports it). Its own
// binary: the replacement is no concern of the other tests. Under AddressSanitizer the
// replacement takes the place of ASan's operator new (which reports an exhausted heap and
// ends the process, never throwing), allocating with ASan's malloc and freeing with its free.
#include "worker/client/c_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>

namespace {

// Whether this thread's next allocation fails (and only that one).
thread_local bool fail_next_allocation = false;

void* Allocate(std::size_t size) {
  if (fail_next_allocation) {
    fail_next_allocation = false;
    throw std::bad_alloc();
  }
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateOrNull(std::size_t size) noexcept {
  try {
    return Allocate(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

}  // namespace

void* operator new(std::size_t size) { return Allocate(size); }
void* operator new[](std::size_t size) { return Allocate(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return AllocateOrNull(size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return AllocateOrNull(size);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using ::testing::HasSubstr;

// Longer than any std::string keeps inline: copying it allocates.
const std::string kLongText(64, 'x');

// Runs `call` with this thread's next allocation failing: "returned" when that allocation
// was the call's and the call returned, else what happened.
template <typename Call>
std::string WithTheNextAllocationFailing(Call&& call) {
  fail_next_allocation = true;
  std::string outcome = "returned";
  try {
    call();
  } catch (const std::exception& e) {
    outcome = std::string("threw ") + e.what();
  }
  if (fail_next_allocation) outcome = "allocated nothing";
  fail_next_allocation = false;
  return outcome;
}

TEST(CApiOutOfMemoryTest, CallsWithoutErrmsgDoNothingAndReturn) {
  parasync_model_t* model = parasync_model_create();
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(
      WithTheNextAllocationFailing([&] { parasync_model_set_name(model, kLongText.c_str()); }),
      "returned");
  EXPECT_EQ(WithTheNextAllocationFailing(
                [&] { parasync_model_set_description(model, kLongText.c_str()); }),
            "returned");
  // An unknown level is "info": the level's text is copied first.
  EXPECT_EQ(WithTheNextAllocationFailing([&] { parasync_log(kLongText.c_str(), "a line"); }),
            "returned");
  // The model is still whole and usable.
  char* err = nullptr;
  const int64_t shape[] = {2};
  EXPECT_EQ(parasync_model_add_variable(model, "w", shape, 1, PARASYNC_INIT_ZEROS, 0, &err),
            PARASYNC_OK);
  EXPECT_EQ(parasync_model_num_variables(model), 1u);
  parasync_model_destroy(model);
}

TEST(CApiOutOfMemoryTest, AGetterThatAllocatesReturnsItsRefusalValue) {
  parasync_options_t* options = parasync_options_create();
  ASSERT_NE(options, nullptr);
  char* err = nullptr;
  // Connecting waits for no server: nothing answers on port 9, and nothing needs to.
  ASSERT_EQ(parasync_options_set_cluster(options, "127.0.0.1:9", 1, 0, &err), PARASYNC_OK);
  ASSERT_EQ(parasync_options_set_metrics(options, nullptr, -1, kLongText.c_str(), &err),
            PARASYNC_OK);
  parasync_client_t* client = nullptr;
  ASSERT_EQ(parasync_client_connect(options, &client, &err), PARASYNC_OK);
  int epoch = 0;
  // The path of eval.jsonl is made first.
  EXPECT_EQ(
      WithTheNextAllocationFailing([&] { epoch = parasync_client_last_logged_epoch(client); }),
      "returned");
  EXPECT_EQ(epoch, -1);
  parasync_client_destroy(client);
  parasync_options_destroy(options);
}

TEST(CApiOutOfMemoryTest, ACodedCallReturnsInternalWithTheMessage) {
  parasync_model_t* model = parasync_model_create();
  ASSERT_NE(model, nullptr);
  char* err = nullptr;
  const int64_t shape[] = {2};
  int code = PARASYNC_OK;
  EXPECT_EQ(WithTheNextAllocationFailing([&] {
              code = parasync_model_add_variable(model, kLongText.c_str(), shape, 1,
                                                 PARASYNC_INIT_ZEROS, 0, &err);
            }),
            "returned");
  EXPECT_EQ(code, PARASYNC_INTERNAL);
  ASSERT_NE(err, nullptr);
  EXPECT_THAT(std::string(err), HasSubstr("bad_alloc"));
  parasync_free(err);
  EXPECT_EQ(parasync_model_num_variables(model), 0u);
  parasync_model_destroy(model);
}

TEST(CApiOutOfMemoryTest, ACreateReturnsNull) {
  parasync_model_t* model = nullptr;
  EXPECT_EQ(WithTheNextAllocationFailing([&] { model = parasync_model_create(); }), "returned");
  EXPECT_EQ(model, nullptr);
}

}  // namespace

// --device parsing, GPU choice by local rank, and what each device choice creates on this
// machine (the GPU checks themselves are in cuda_backend_test.cc, labelled gpu).
#include "tests/support/test_models.h"
#include "worker/compute/backend_factory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace parasync {
namespace {

using Kind = DeviceChoice::Kind;

TEST(ParseDeviceTest, AcceptsEveryDocumentedForm) {
  auto a = ParseDevice("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, Kind::kAuto);
  EXPECT_FALSE(a->gpu.has_value());
  auto c = ParseDevice("cpu");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, Kind::kCpu);
  auto g = ParseDevice("cuda");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->kind, Kind::kCuda);
  EXPECT_FALSE(g->gpu.has_value());
  auto g3 = ParseDevice("cuda:3");
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(g3->kind, Kind::kCuda);
  EXPECT_EQ(g3->gpu, 3);
}

TEST(ParseDeviceTest, RejectsEverythingElseNamingIt) {
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "tpu",
                          "cuda:99999999999"}) {
    auto d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("'" + std::string(bad) + "'"), std::string::npos)
        << d.status().message();
  }
}

TEST(PickGpuTest, LocalRankTakesItsOwnGpuAndWrapsAround) {
  DeviceChoice any;  // auto or plain cuda
  for (int rank = 0; rank < 4; ++rank) {
    auto gpu = PickGpu(any, rank, 4);
    ASSERT_TRUE(gpu.ok());
    EXPECT_EQ(*gpu, rank);
  }
  auto wrapped = PickGpu(any, 5, 2);
  ASSERT_TRUE(wrapped.ok());
  EXPECT_EQ(*wrapped, 1);
  EXPECT_FALSE(PickGpu(any, -1, 2).ok());
  EXPECT_EQ(PickGpu(any, 0, 0).status().code(), StatusCode::kUnavailable);
}

TEST(PickGpuTest, NamedGpuWinsOverLocalRankAndMustExist) {
  DeviceChoice named;
  named.kind = Kind::kCuda;
  named.gpu = 1;
  auto gpu = PickGpu(named, 3, 2);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(*gpu, 1);
  named.gpu = 2;
  auto missing = PickGpu(named, 0, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("only 2 GPU(s)"), std::string::npos);
}

TEST(LocalRankTest, ComesFromLocalRankVariableOrIsZero) {
  unsetenv("LOCAL_RANK");
  auto unset = LocalRankFromEnvironment();
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(*unset, 0);
  setenv("LOCAL_RANK", "3", 1);
  auto three = LocalRankFromEnvironment();
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*three, 3);
  for (const char* bad : {"-1", "x", "2a"}) {
    setenv("LOCAL_RANK", bad, 1);
    auto r = LocalRankFromEnvironment();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos);
  }
  unsetenv("LOCAL_RANK");
}

// Whether this machine can run the CUDA backend (the module loads and a GPU is present).
bool HaveGpu() {
  DeviceChoice cuda;
  cuda.kind = Kind::kCuda;
  std::string why;
  return CreateBackend(cuda, testing::MakeModel("4-3", {4}), 0, &why).ok();
}

TEST(CreateBackendTest, CpuIsTheCpuBackend) {
  DeviceChoice cpu;
  cpu.kind = Kind::kCpu;
  std::string why;
  auto backend = CreateBackend(cpu, testing::MakeModel("4-3", {4}), 0, &why);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_EQ(why, "--device cpu");
}

TEST(CreateBackendTest, AutoSaysWhichDeviceItPickedAndWhy) {
  std::string why;
  auto backend = CreateBackend(DeviceChoice{}, testing::MakeModel("4-3", {4}), 0, &why);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  if (HaveGpu()) {
    EXPECT_EQ((*backend)->name().rfind("cuda:0", 0), 0u) << (*backend)->name();
    EXPECT_NE(why.find("found a GPU"), std::string::npos) << why;
  } else {
    EXPECT_EQ((*backend)->name(), "cpu");
    EXPECT_NE(why.find("using the CPU"), std::string::npos) << why;
  }
}

TEST(CreateBackendTest, CudaWithoutGpuIsUnavailableWithTheReason) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present";
  DeviceChoice cuda;
  cuda.kind = Kind::kCuda;
  std::string why;
  auto backend = CreateBackend(cuda, testing::MakeModel("4-3", {4}), 0, &why);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  // Either the module is missing (a CPU-only build) or it found no GPU.
  const std::string message = backend.status().message();
  EXPECT_TRUE(message.find("no GPU") != std::string::npos ||
              message.find("no CUDA support") != std::string::npos)
      << message;
}

TEST(CreateBackendTest, HostBuffersAreZeroedAndUsable) {
  std::string why;
  auto backend = CreateBackend(DeviceChoice{}, testing::MakeModel("4-3", {4}), 0, &why);
  ASSERT_TRUE(backend.ok());
  std::shared_ptr<void> buffer = (*backend)->AllocateHost(1000 * sizeof(float));
  ASSERT_NE(buffer, nullptr);
  float* f = static_cast<float*>(buffer.get());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(f[i], 0.0f) << i;
  f[999] = 1.0f;
  EXPECT_NE((*backend)->AllocateHost(0), nullptr);
}

}  // namespace
}  // namespace parasync

#include "worker/sparse_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "tests/support/test_models.h"
#include "worker/compute/backend.h"

namespace parasync {
namespace {

// 4 examples of 3 ids (repeats within and across examples, ids beyond float's range) and
// 2 features each.
Dataset IdData() {
  Dataset d;
  d.n = 4;
  d.dim = 2;
  d.shape = {2};
  d.x = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f};
  d.y = {1, 0, 1, 0};
  d.id_columns = 3;
  d.ids = {18446744073709551615ULL, 7, 7,  //
           3, 9000000000000000001ULL, 7,   //
           5, 5, 5,                         //
           9000000000000000000ULL, 3, 0};
  return d;
}

TEST(SparseBatchTest, LocalIdsMapBackToTheIdsAndUniqueIdsAreSortedAndDistinct) {
  const Dataset d = IdData();
  const std::vector<int64_t> idx = {3, 0, 1, 3};
  std::vector<float> x(idx.size() * 5, -1.0f);
  std::vector<uint8_t> y(idx.size());
  const SparseBatch batch = GatherSparseBatch(d, idx, x.data(), y.data());
  EXPECT_EQ(batch.unique_ids, (std::vector<uint64_t>{0, 3, 7, 9000000000000000000ULL,
                                                    9000000000000000001ULL,
                                                    18446744073709551615ULL}));
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t row = static_cast<size_t>(idx[k]);
    for (size_t c = 0; c < 3; ++c) {
      const float local = x[k * 5 + c];
      ASSERT_EQ(local, static_cast<float>(static_cast<size_t>(local)));
      ASSERT_LT(static_cast<size_t>(local), batch.unique_ids.size());
      EXPECT_EQ(batch.unique_ids[static_cast<size_t>(local)], d.ids[row * 3 + c]);
    }
    EXPECT_EQ(x[k * 5 + 3], d.x[row * 2]);
    EXPECT_EQ(x[k * 5 + 4], d.x[row * 2 + 1]);
    EXPECT_EQ(y[k], d.y[row]);
  }
  EXPECT_EQ(SparseRowsNeeded(32, 8), 256);
  EXPECT_GE(SparseRowsNeeded(static_cast<int64_t>(idx.size()), 3),
            static_cast<int64_t>(batch.unique_ids.size()));
}

TEST(SparseBatchTest, TheCtrGradientLivesInTheFirstUniqueRowsAndSumsRepeats) {
  // What a worker does with a batch: compact table rows for the unique ids, the backend
  // on local ids; gradient rows past unique_ids.size() stay zero.
  const Dataset d = IdData();
  const std::vector<int64_t> idx = {2, 2};  // one id, used six times
  const ModelInputs inputs{3, SparseRowsNeeded(2, 3)};
  const Model model = testing::MakeModel("ctr", {5}, inputs);
  Result<std::unique_ptr<ComputeBackend>> backend = CreateCpuBackend(model);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  std::vector<float> x(10);
  std::vector<uint8_t> y(2);
  const SparseBatch batch = GatherSparseBatch(d, idx, x.data(), y.data());
  ASSERT_EQ(batch.unique_ids, (std::vector<uint64_t>{5}));
  std::vector<std::vector<float>> params, grads;
  for (const VariableSpec& v : model.variables()) {
    params.emplace_back(static_cast<size_t>(v.num_elements()), 0.01f);
    grads.emplace_back(static_cast<size_t>(v.num_elements()), 99.0f);
  }
  std::vector<const float*> p;
  std::vector<float*> g;
  for (size_t v = 0; v < params.size(); ++v) {
    p.push_back(params[v].data());
    g.push_back(grads[v].data());
  }
  ASSERT_TRUE((*backend)->ForwardBackward(p, x.data(), y.data(), 2, 0, g).ok());
  const std::vector<float>& table = grads[static_cast<size_t>(model.sparse_tables()[0].variable)];
  ASSERT_EQ(table.size(), 6u * 16u);
  EXPECT_TRUE(std::any_of(table.begin(), table.begin() + 16, [](float v) { return v != 0; }));
  EXPECT_TRUE(std::all_of(table.begin() + 16, table.end(), [](float v) { return v == 0; }));
}

}  // namespace
}  // namespace parasync

// A parameter server's shard of a table (worker/ps/shard_table.h), without gRPC.
#include "worker/ps/shard_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

namespace lockstep::ps {
namespace {

TableSpec Spec(int64_t rows = 100, int32_t dim = 4) {
  TableSpec spec;
  spec.name = "emb";
  spec.rows = rows;
  spec.dim = dim;
  spec.learning_rate = 0.5f;
  spec.seed = 7;
  spec.init_scale = 0.1f;
  return spec;
}

std::unique_ptr<ShardTable> Make(const TableSpec& spec, int shard = 0, int shards = 1) {
  auto table = ShardTable::Create(spec, shard, shards);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(table).value() : nullptr;
}

// Every row the shard holds, in order.
std::vector<uint64_t> RowsOf(const ShardTable& table) {
  std::vector<uint64_t> rows;
  for (uint64_t r = static_cast<uint64_t>(table.shard());
       r < static_cast<uint64_t>(table.spec().rows); r += static_cast<uint64_t>(table.shards())) {
    rows.push_back(r);
  }
  return rows;
}

std::vector<float> PullAll(const ShardTable& table) {
  const std::vector<uint64_t> rows = RowsOf(table);
  std::vector<float> out(rows.size() * static_cast<size_t>(table.spec().dim));
  EXPECT_TRUE(table.Pull(rows.data(), rows.size(), out.data()).ok());
  return out;
}

TEST(ShardTableTest, ATableStartsTheSameHoweverManyShardsHoldIt) {
  const TableSpec spec = Spec(100, 4);
  auto whole = Make(spec);
  for (int shards : {2, 3}) {
    for (int shard = 0; shard < shards; ++shard) {
      auto part = Make(spec, shard, shards);
      const std::vector<uint64_t> rows = RowsOf(*part);
      std::vector<float> from_part(rows.size() * 4), from_whole(rows.size() * 4);
      ASSERT_TRUE(part->Pull(rows.data(), rows.size(), from_part.data()).ok());
      ASSERT_TRUE(whole->Pull(rows.data(), rows.size(), from_whole.data()).ok());
      EXPECT_EQ(from_part, from_whole) << "shard " << shard << " of " << shards;
    }
  }
}

TEST(ShardTableTest, RowsStartSpreadWithinTheScaleOrAtZero) {
  const std::vector<float> values = PullAll(*Make(Spec(1000, 8)));
  float low = 1, high = -1;
  for (float v : values) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  EXPECT_GE(low, -0.1f);
  EXPECT_LT(high, 0.1f);
  EXPECT_LT(low, -0.09f);  // spread over the range, not one value
  EXPECT_GT(high, 0.09f);
  TableSpec zeros = Spec();
  zeros.init_scale = 0;
  for (float v : PullAll(*Make(zeros))) ASSERT_EQ(v, 0.0f);
}

TEST(ShardTableTest, AGradientPushIsSgdAndADeltaIsAdded) {
  auto table = Make(Spec(10, 2));
  const std::vector<uint64_t> rows = {3, 7};
  std::vector<float> before(4), after(4);
  ASSERT_TRUE(table->Pull(rows.data(), 2, before.data()).ok());
  const std::vector<float> gradient = {1.0f, -2.0f, 0.25f, 4.0f};
  auto version = table->Push(rows.data(), 2, gradient.data(), PushKind::kGradient);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  ASSERT_TRUE(table->Pull(rows.data(), 2, after.data()).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(after[i], before[i] - 0.5f * gradient[i]) << i;

  const std::vector<float> delta = {0.5f, 0.5f, -1.0f, 2.0f};
  ASSERT_TRUE(table->Push(rows.data(), 2, delta.data(), PushKind::kDelta).ok());
  std::vector<float> last(4);
  ASSERT_TRUE(table->Pull(rows.data(), 2, last.data()).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(last[i], after[i] + delta[i]) << i;
  EXPECT_EQ(table->version(), 2u);
}

TEST(ShardTableTest, ARowNamedTwiceInOnePushTakesBothValuesInOrder) {
  TableSpec spec = Spec(10, 1);
  spec.init_scale = 0;
  auto table = Make(spec);
  const std::vector<uint64_t> rows = {4, 4, 4};
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(table->Push(rows.data(), 3, values.data(), PushKind::kDelta).ok());
  float row4 = 0;
  ASSERT_TRUE(table->Pull(rows.data(), 1, &row4).ok());
  EXPECT_EQ(row4, 6.0f);
}

TEST(ShardTableTest, RowsBeyondTheTableOrOfAnotherShardAreRefusedByNameAndChangeNothing) {
  auto table = Make(Spec(100, 2), /*shard=*/1, /*shards=*/2);
  const std::vector<float> before = PullAll(*table);
  const std::vector<float> values(6, 1.0f);

  const std::vector<uint64_t> beyond = {1, 3, 101};
  Status pushed = table->Push(beyond.data(), 3, values.data(), PushKind::kDelta).status();
  EXPECT_EQ(pushed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.message().find("rows[2] = 101 is beyond table emb's 100 rows"),
            std::string::npos)
      << pushed;

  const std::vector<uint64_t> other_shard = {1, 4, 5};
  pushed = table->Push(other_shard.data(), 3, values.data(), PushKind::kGradient).status();
  EXPECT_EQ(pushed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.message().find("rows[1] = 4 of table emb is held by server 0"),
            std::string::npos)
      << pushed;

  std::vector<float> out(6);
  EXPECT_EQ(table->Pull(beyond.data(), 3, out.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PullAll(*table), before);
  EXPECT_EQ(table->version(), 0u);
}

TEST(ShardTableTest, ValuesThatAreNotFiniteAreRefusedAndChangeNothing) {
  auto table = Make(Spec(10, 2));
  const std::vector<float> before = PullAll(*table);
  const std::vector<uint64_t> rows = {0, 1};
  const std::vector<float> values = {1.0f, 1.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  Status pushed = table->Push(rows.data(), 2, values.data(), PushKind::kGradient).status();
  EXPECT_EQ(pushed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.message().find("rows[1] = 1 are not all finite"), std::string::npos) << pushed;
  EXPECT_EQ(PullAll(*table), before);
}

TEST(ShardTableTest, ATableThatCannotBeHeldIsRefusedBeforeAnythingIsAllocated) {
  EXPECT_EQ(ShardTable::Create(Spec(0, 4), 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardTable::Create(Spec(10, 0), 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardTable::Create(Spec(10, 4), 2, 2).status().code(), StatusCode::kInvalidArgument);
  TableSpec unnamed = Spec();
  unnamed.name.clear();
  EXPECT_EQ(ShardTable::Create(unnamed, 0, 1).status().code(), StatusCode::kInvalidArgument);
  // 10^12 rows of 16 floats: 64 TB, or 32 TB on each of 2 servers.
  Status huge = ShardTable::Create(Spec(1'000'000'000'000, 16), 0, 2).status();
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.message().find("use more parameter servers"), std::string::npos) << huge;
}

TEST(ShardTableTest, NeighbouringIdsSpreadEvenlyOverTheShards) {
  std::vector<int> per_shard(4, 0);
  for (uint64_t id = 0; id < 40000; ++id) {
    const uint64_t row = RowOfId(id, 1'000'000);
    ASSERT_LT(row, 1'000'000u);
    ++per_shard[static_cast<size_t>(ShardOfRow(row, 4))];
  }
  for (int count : per_shard) {
    EXPECT_GT(count, 9500);
    EXPECT_LT(count, 10500);
  }
}

}  // namespace
}  // namespace lockstep::ps

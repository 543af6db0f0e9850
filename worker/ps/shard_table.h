// One parameter server's shard of one table (proto/parameter_server.proto): the rows r of the
// table with r % shards == shard, held in memory, read by Pull and changed by Push.
//
//   TableSpec spec{.name = "ads", .rows = 1'000'000, .dim = 16, .learning_rate = 0.05f};
//   LOCKSTEP_ASSIGN_OR_RETURN(auto table, ShardTable::Create(spec, /*shard=*/0, /*shards=*/2));
//   std::vector<float> values(rows.size() * spec.dim);
//   LOCKSTEP_RETURN_IF_ERROR(table->Pull(rows.data(), rows.size(), values.data()));
//   LOCKSTEP_RETURN_IF_ERROR(table->Push(rows.data(), rows.size(), gradients.data(),
//                                        PushKind::kGradient));
//
// Every row starts at InitialValue(spec, row, j), which depends on the row's global number only:
// a table starts the same however many shards hold it.
//
// Thread safety: Pull and Push may run on any threads at once. Each row is read and written
// under one of kStripes locks, so a pull never sees half of a push to a row; pushes to different
// rows run in parallel, and a push is not atomic across its rows (asynchronous SGD's usual
// guarantee, not a transaction).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::ps {

struct TableSpec {
  std::string name;
  int64_t rows = 0;             // >= 1
  int32_t dim = 0;              // >= 1
  float learning_rate = 0.01f;  // what a GRADIENT push is scaled by
  uint64_t seed = 1;
  float init_scale = 0.01f;  // rows start uniform in [-init_scale, init_scale); 0: zeros
};

// kGradient: row -= learning_rate * value; kDelta: row += value; kAssign: row = value;
// kDeferred: a gradient the server holds until the slowest worker's clock advances (ps_server.h).
enum class PushKind { kGradient, kDelta, kAssign, kDeferred };

// A feature id's row: a 64-bit mix of the id (so that neighbouring ids spread over the shards),
// modulo rows. Different ids may share a row (the hashing trick); rows >= 1.
uint64_t RowOfId(uint64_t id, int64_t rows);

// The shard that holds `row` among `shards`.
inline int ShardOfRow(uint64_t row, int shards) {
  return static_cast<int>(row % static_cast<uint64_t>(shards));
}

// Element j of row `row` before any push.
// Rows of `spec` that shard `shard` of `shards` holds (r % shards == shard).
inline int64_t LocalRowsOf(const TableSpec& spec, int shard, int shards) {
  return spec.rows > shard ? (spec.rows - shard + shards - 1) / shards : 0;
}

float InitialValue(const TableSpec& spec, uint64_t row, int32_t j);

// Each distinct row of `rows` once, in the order of first appearance, with the sum of its values
// (values[i * dim ...] belong to rows[i]) added in that order: what a push sends. A table held in
// this process applies the same sums (not each value in turn), so that the same gradients give
// the same table bit for bit whether it is here or on servers.
struct RowSums {
  std::vector<uint64_t> rows;
  std::vector<float> values;  // rows.size() x dim
};
RowSums SumByRow(const std::vector<uint64_t>& rows, const float* values, int32_t dim);

class ShardTable {
 public:
  // The most bytes one shard of one table may hold (4 GiB): a larger table needs more servers.
  static constexpr int64_t kMaxShardBytes = int64_t{4} << 30;

  // INVALID_ARGUMENT for an empty name, rows < 1, dim < 1, a learning rate or scale that is not
  // finite, or shard outside [0, shards); RESOURCE_EXHAUSTED when the shard would hold more than
  // kMaxShardBytes.
  static StatusOr<std::unique_ptr<ShardTable>> Create(TableSpec spec, int shard, int shards);

  const TableSpec& spec() const { return spec_; }
  int shard() const { return shard_; }
  int shards() const { return shards_; }
  int64_t local_rows() const { return local_rows_; }
  // Pushes taken so far.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

  // INVALID_ARGUMENT naming the first row that is >= rows or of another shard.
  Status CheckRows(const uint64_t* rows, size_t count) const;

  // out[i * dim ...] = row rows[i]. Checks the rows first and reads nothing when one is bad.
  Status Pull(const uint64_t* rows, size_t count, float* out) const;

  // Applies values[i * dim ...] to row rows[i], in order: row -= learning_rate * value
  // (kGradient), row += value (kDelta) or row = value (kAssign; kDeferred is the server's to
  // hold, and refused here). Checks every row and value first (a value that is not
  // finite is refused, naming its row) and changes nothing when one is bad. Returns the version
  // after the push.
  StatusOr<uint64_t> Push(const uint64_t* rows, size_t count, const float* values, PushKind kind);

  // This shard's rows, local_rows() x dim, in row order (a row is read whole, under its lock;
  // rows pushed meanwhile may show either value): what a checkpoint keeps.
  std::vector<float> Values() const;
  // Replaces every row with `values` (local_rows() x dim, finite): a checkpoint restored.
  Status SetValues(const std::vector<float>& values);

 private:
  static constexpr size_t kStripes = 64;
  ShardTable(TableSpec spec, int shard, int shards, int64_t local_rows);
  int64_t LocalIndex(uint64_t row) const { return static_cast<int64_t>(row) / shards_; }
  std::mutex& StripeOf(int64_t local) const {
    return stripes_[static_cast<size_t>(local) % kStripes];
  }

  const TableSpec spec_;
  const int shard_;
  const int shards_;
  const int64_t local_rows_;
  std::vector<float> values_;  // local_rows_ x dim
  mutable std::array<std::mutex, kStripes> stripes_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace lockstep::ps

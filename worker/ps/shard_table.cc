#include "worker/ps/shard_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <utility>

#include "worker/trainer/random.h"

namespace lockstep::ps {
namespace {

using trainer::Mix64;

std::string RowText(uint64_t row) { return std::to_string(row); }

}  // namespace

uint64_t RowOfId(uint64_t id, int64_t rows) {
  return Mix64(id) % static_cast<uint64_t>(rows < 1 ? 1 : rows);
}

float InitialValue(const TableSpec& spec, uint64_t row, int32_t j) {
  if (spec.init_scale == 0.0f) return 0.0f;
  const uint64_t bits =
      Mix64(Mix64(spec.seed ^ Mix64(row)) + static_cast<uint64_t>(static_cast<uint32_t>(j)));
  // The top 24 bits as a uniform in [0, 1): exact in a float.
  const float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * spec.init_scale;
}

RowSums SumByRow(const std::vector<uint64_t>& rows, const float* values, int32_t dim) {
  RowSums sums;
  std::unordered_map<uint64_t, size_t> slot_of;
  slot_of.reserve(rows.size());
  const size_t width = static_cast<size_t>(std::max(dim, 0));
  for (size_t i = 0; i < rows.size(); ++i) {
    auto [it, added] = slot_of.emplace(rows[i], sums.rows.size());
    if (added) {
      sums.rows.push_back(rows[i]);
      sums.values.resize(sums.values.size() + width, 0.0f);
    }
    float* target = sums.values.data() + it->second * width;
    const float* value = values + i * width;
    for (size_t j = 0; j < width; ++j) target[j] += value[j];
  }
  return sums;
}

StatusOr<std::unique_ptr<ShardTable>> ShardTable::Create(TableSpec spec, int shard, int shards) {
  const std::string where = "table " + (spec.name.empty() ? std::string("(unnamed)") : spec.name);
  if (spec.name.empty()) return InvalidArgumentError("a table needs a name");
  if (spec.rows < 1) {
    return InvalidArgumentError(where + ": rows must be >= 1 (got " + std::to_string(spec.rows) +
                                ")");
  }
  if (spec.dim < 1) {
    return InvalidArgumentError(where + ": dim must be >= 1 (got " + std::to_string(spec.dim) +
                                ")");
  }
  if (!std::isfinite(spec.learning_rate) || !std::isfinite(spec.init_scale) ||
      spec.init_scale < 0.0f) {
    return InvalidArgumentError(where +
                                ": learning rate and init scale must be finite, the scale "
                                ">= 0");
  }
  if (shards < 1 || shard < 0 || shard >= shards) {
    return InvalidArgumentError(where + ": shard " + std::to_string(shard) + " of " +
                                std::to_string(shards) + " does not exist");
  }
  // Rows r with r % shards == shard: ceil((rows - shard) / shards).
  const int64_t local_rows = LocalRowsOf(spec, shard, shards);
  if (local_rows > kMaxShardBytes / static_cast<int64_t>(sizeof(float)) / spec.dim) {
    return ResourceExhaustedError(where + ": " + std::to_string(local_rows) + " rows of " +
                                  std::to_string(spec.dim) + " floats on one server exceed " +
                                  std::to_string(kMaxShardBytes >> 30) +
                                  " GiB; use more parameter servers");
  }
  return std::unique_ptr<ShardTable>(new ShardTable(std::move(spec), shard, shards, local_rows));
}

ShardTable::ShardTable(TableSpec spec, int shard, int shards, int64_t local_rows)
    : spec_(std::move(spec)), shard_(shard), shards_(shards), local_rows_(local_rows) {
  const int32_t dim = spec_.dim;
  values_.resize(static_cast<size_t>(local_rows_) * static_cast<size_t>(dim));
  for (int64_t local = 0; local < local_rows_; ++local) {
    const uint64_t row = static_cast<uint64_t>(local) * static_cast<uint64_t>(shards_) +
                         static_cast<uint64_t>(shard_);
    float* out = values_.data() + local * dim;
    for (int32_t j = 0; j < dim; ++j) out[j] = InitialValue(spec_, row, j);
  }
}

Status ShardTable::CheckRows(const uint64_t* rows, size_t count) const {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t row = rows[i];
    if (row >= static_cast<uint64_t>(spec_.rows)) {
      return InvalidArgumentError("rows[" + std::to_string(i) + "] = " + RowText(row) +
                                  " is beyond table " + spec_.name + "'s " +
                                  std::to_string(spec_.rows) + " rows");
    }
    if (ShardOfRow(row, shards_) != shard_) {
      return InvalidArgumentError("rows[" + std::to_string(i) + "] = " + RowText(row) +
                                  " of table " + spec_.name + " is held by server " +
                                  std::to_string(ShardOfRow(row, shards_)) + ", not this one (" +
                                  std::to_string(shard_) + " of " + std::to_string(shards_) + ")");
    }
  }
  return OkStatus();
}

Status ShardTable::Pull(const uint64_t* rows, size_t count, float* out) const {
  LOCKSTEP_RETURN_IF_ERROR(CheckRows(rows, count));
  const int32_t dim = spec_.dim;
  for (size_t i = 0; i < count; ++i) {
    const int64_t local = LocalIndex(rows[i]);
    std::lock_guard<std::mutex> lock(StripeOf(local));
    const float* source = values_.data() + local * dim;
    std::copy(source, source + dim, out + static_cast<int64_t>(i) * dim);
  }
  return OkStatus();
}

StatusOr<uint64_t> ShardTable::Push(const uint64_t* rows, size_t count, const float* values,
                                    PushKind kind) {
  if (kind == PushKind::kDeferred) {
    return InvalidArgumentError("a deferred push is held by the server, not applied to a table");
  }
  LOCKSTEP_RETURN_IF_ERROR(CheckRows(rows, count));
  const int32_t dim = spec_.dim;
  for (size_t i = 0; i < count; ++i) {
    for (int32_t j = 0; j < dim; ++j) {
      if (!std::isfinite(values[static_cast<int64_t>(i) * dim + j])) {
        return InvalidArgumentError("values of rows[" + std::to_string(i) +
                                    "] = " + RowText(rows[i]) + " are not all finite (element " +
                                    std::to_string(j) + ")");
      }
    }
  }
  const float scale = kind == PushKind::kGradient ? -spec_.learning_rate : 1.0f;
  for (size_t i = 0; i < count; ++i) {
    const int64_t local = LocalIndex(rows[i]);
    std::lock_guard<std::mutex> lock(StripeOf(local));
    float* target = values_.data() + local * dim;
    const float* value = values + static_cast<int64_t>(i) * dim;
    if (kind == PushKind::kAssign) {
      std::copy(value, value + dim, target);
    } else {
      for (int32_t j = 0; j < dim; ++j) target[j] += scale * value[j];
    }
  }
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

std::vector<float> ShardTable::Values() const {
  std::vector<float> out(values_.size());
  const int32_t dim = spec_.dim;
  for (int64_t local = 0; local < local_rows_; ++local) {
    std::lock_guard<std::mutex> lock(StripeOf(local));
    std::copy(values_.begin() + local * dim, values_.begin() + (local + 1) * dim,
              out.begin() + local * dim);
  }
  return out;
}

Status ShardTable::SetValues(const std::vector<float>& values) {
  if (values.size() != values_.size()) {
    return InvalidArgumentError("table " + spec_.name + ": " + std::to_string(values.size()) +
                                " values for a shard of " + std::to_string(values_.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return InvalidArgumentError("table " + spec_.name + ": value " + std::to_string(i) +
                                  " is not finite");
    }
  }
  const int32_t dim = spec_.dim;
  for (int64_t local = 0; local < local_rows_; ++local) {
    std::lock_guard<std::mutex> lock(StripeOf(local));
    std::copy(values.begin() + local * dim, values.begin() + (local + 1) * dim,
              values_.begin() + local * dim);
  }
  return OkStatus();
}

}  // namespace lockstep::ps

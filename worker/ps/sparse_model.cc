#include "worker/ps/sparse_model.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <utility>

namespace lockstep::ps {

TableSpec EmbeddingTable(const SparseModelSpec& spec) {
  TableSpec table;
  table.name = "embeddings";
  table.rows = spec.table_rows;
  table.dim = spec.dim;
  table.learning_rate = spec.learning_rate;
  table.seed = spec.seed;
  table.init_scale = spec.init_scale;
  return table;
}

TableSpec DenseTable(const SparseModelSpec& spec, int64_t num_params) {
  TableSpec table;
  table.name = "dense";
  table.rows = std::max<int64_t>(1, (num_params + kDenseRowWidth - 1) / kDenseRowWidth);
  table.dim = kDenseRowWidth;
  table.learning_rate = spec.learning_rate;
  table.seed = spec.seed;
  table.init_scale = 0.0f;
  return table;
}

StatusOr<std::unique_ptr<LocalTable>> LocalTable::Create(const TableSpec& spec) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto table, ShardTable::Create(spec, 0, 1));
  return std::unique_ptr<LocalTable>(new LocalTable(std::move(table)));
}

Status LocalTable::Pull(const std::vector<uint64_t>& rows, float* out) {
  return table_->Pull(rows.data(), rows.size(), out);
}

Status LocalTable::Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) {
  const RowSums sums = SumByRow(rows, values, dim());
  return table_->Push(sums.rows.data(), sums.rows.size(), sums.values.data(), kind).status();
}

Status ServerTable::Pull(const std::vector<uint64_t>& rows, float* out) {
  return client_.Pull(spec_.name, spec_.dim, rows, out);
}

Status ServerTable::Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) {
  return client_.Push(spec_.name, spec_.dim, rows, values, kind);
}

Status GeoTable::Hold(const std::vector<uint64_t>& rows) {
  std::vector<uint64_t> missing;
  std::unordered_set<uint64_t> asked;
  for (uint64_t row : rows) {
    if (slot_.count(row) == 0 && asked.insert(row).second) missing.push_back(row);
  }
  if (missing.empty()) return OkStatus();
  std::vector<float> fresh(missing.size() * static_cast<size_t>(dim_));
  LOCKSTEP_RETURN_IF_ERROR(remote_.Pull(missing, fresh.data()));
  for (size_t i = 0; i < missing.size(); ++i) {
    slot_.emplace(missing[i], rows_.size());
    rows_.push_back(missing[i]);
  }
  values_.insert(values_.end(), fresh.begin(), fresh.end());
  pulled_.insert(pulled_.end(), fresh.begin(), fresh.end());
  return OkStatus();
}

Status GeoTable::Pull(const std::vector<uint64_t>& rows, float* out) {
  LOCKSTEP_RETURN_IF_ERROR(Hold(rows));
  const size_t width = static_cast<size_t>(dim_);
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* source = values_.data() + slot_.at(rows[i]) * width;
    std::copy(source, source + width, out + i * width);
  }
  return OkStatus();
}

Status GeoTable::Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) {
  LOCKSTEP_RETURN_IF_ERROR(Hold(rows));
  const RowSums sums = SumByRow(rows, values, dim_);
  const float scale = kind == PushKind::kGradient ? -learning_rate_ : 1.0f;
  const size_t width = static_cast<size_t>(dim_);
  for (size_t i = 0; i < sums.rows.size(); ++i) {
    float* target = values_.data() + slot_.at(sums.rows[i]) * width;
    const float* value = sums.values.data() + i * width;
    for (size_t j = 0; j < width; ++j) target[j] += scale * value[j];
  }
  return OkStatus();
}

Status GeoTable::Sync() {
  if (rows_.empty()) return OkStatus();
  std::vector<float> delta(values_.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = (values_[i] - pulled_[i]) * share_;
  const Status pushed = remote_.Push(rows_, delta.data(), PushKind::kDelta);
  // Dropped whether the push went through or not: a push that failed may have reached some of
  // the servers (it is not atomic across them), and sending it again would apply their part
  // twice. The changes a failed push did not deliver are lost, as an asynchronous worker's
  // failed push is.
  slot_.clear();
  rows_.clear();
  values_.clear();
  pulled_.clear();
  return pushed;
}

StatusOr<std::unique_ptr<SparseModel>> SparseModel::Create(const SparseModelSpec& spec) {
  if (spec.fields < 1 || spec.dim < 1 || spec.table_rows < 1 || spec.max_batch < 1) {
    return InvalidArgumentError("sparse model: fields, dim, table rows and max_batch must be >= 1");
  }
  if (!(spec.learning_rate > 0.0f) || !std::isfinite(spec.learning_rate)) {
    return InvalidArgumentError("sparse model: the learning rate must be positive");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      trainer::MlpModel model,
      trainer::MlpModel::Create(int64_t{spec.fields} * spec.dim, spec.hidden, 2, spec.activation));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Device> device,
                            kernels::CreateDevice(kernels::DeviceType::kCpu));
  std::unique_ptr<SparseModel> sparse(new SparseModel(spec, std::move(model), std::move(device)));
  LOCKSTEP_ASSIGN_OR_RETURN(
      trainer::MlpWorkspace workspace,
      trainer::MlpWorkspace::Create(sparse->model_, spec.max_batch, *sparse->device_));
  sparse->workspace_ = std::make_unique<trainer::MlpWorkspace>(std::move(workspace));
  return sparse;
}

SparseModel::SparseModel(SparseModelSpec spec, trainer::MlpModel model,
                         std::unique_ptr<kernels::Device> device)
    : spec_(std::move(spec)), model_(std::move(model)), device_(std::move(device)) {
  params_.resize(static_cast<size_t>(model_.layout().num_params));
  grads_.resize(params_.size());
  model_.InitializeParameters(spec_.seed, params_.data());
  const size_t width = static_cast<size_t>(spec_.fields) * static_cast<size_t>(spec_.dim);
  input_.resize(static_cast<size_t>(spec_.max_batch) * width);
  grad_input_.resize(input_.size());
  const int64_t dense_rows =
      (static_cast<int64_t>(params_.size()) + kDenseRowWidth - 1) / kDenseRowWidth;
  for (int64_t r = 0; r < dense_rows; ++r) dense_rows_.push_back(static_cast<uint64_t>(r));
  dense_values_.assign(static_cast<size_t>(dense_rows * kDenseRowWidth), 0.0f);
}

Status SparseModel::PullDense(TableRows& dense) {
  if (dense.dim() != kDenseRowWidth) {
    return InvalidArgumentError("the dense table's rows are " + std::to_string(dense.dim()) +
                                " floats; the model's " + std::to_string(kDenseRowWidth));
  }
  LOCKSTEP_RETURN_IF_ERROR(dense.Pull(dense_rows_, dense_values_.data()));
  std::copy(dense_values_.begin(),
            dense_values_.begin() + static_cast<std::ptrdiff_t>(params_.size()), params_.begin());
  return OkStatus();
}

Status SparseModel::InitializeDense(TableRows& dense) {
  if (dense.dim() != kDenseRowWidth) {
    return InvalidArgumentError("the dense table's rows are " + std::to_string(dense.dim()) +
                                " floats; the model's " + std::to_string(kDenseRowWidth));
  }
  std::fill(dense_values_.begin(), dense_values_.end(), 0.0f);
  std::copy(params_.begin(), params_.end(), dense_values_.begin());
  return dense.Push(dense_rows_, dense_values_.data(), PushKind::kAssign);
}

Status SparseModel::Rows(const ClickLog& log, int64_t first, int64_t rows,
                         std::vector<uint64_t>* out) const {
  if (log.fields != spec_.fields) {
    return InvalidArgumentError("the click log has " + std::to_string(log.fields) +
                                " fields; the model " + std::to_string(spec_.fields));
  }
  if (first < 0 || rows < 0 || first + rows > log.samples) {
    return OutOfRangeError("samples [" + std::to_string(first) + ", " +
                           std::to_string(first + rows) + ") are not in the log's " +
                           std::to_string(log.samples));
  }
  out->resize(static_cast<size_t>(rows) * static_cast<size_t>(spec_.fields));
  for (size_t i = 0; i < out->size(); ++i) {
    (*out)[i] = RowOfId(log.ids[static_cast<size_t>(first) * static_cast<size_t>(spec_.fields) + i],
                        spec_.table_rows);
  }
  return OkStatus();
}

StatusOr<double> SparseModel::Step(const ClickLog& log, int64_t first, int64_t rows,
                                   TableRows& embeddings, TableRows* dense,
                                   const SparseStepOptions& options) {
  if (rows < 1 || rows > spec_.max_batch) {
    return InvalidArgumentError("a step of " + std::to_string(rows) +
                                " samples; this model takes 1 to " +
                                std::to_string(spec_.max_batch));
  }
  LOCKSTEP_RETURN_IF_ERROR(Rows(log, first, rows, &rows_));
  if (dense != nullptr) LOCKSTEP_RETURN_IF_ERROR(PullDense(*dense));
  LOCKSTEP_RETURN_IF_ERROR(embeddings.Pull(rows_, input_.data()));
  labels_.assign(log.labels.begin() + first, log.labels.begin() + first + rows);
  const kernels::ExecutionContext& ctx = device_->compute();
  double loss_sum = 0;
  model_.Forward(ctx, params_.data(), input_.data(), rows, *workspace_);
  trainer::MlpModel::OutputGradient from;
  from.labels = labels_.data();
  from.grad_scale = options.share / static_cast<float>(rows);
  from.loss_sum = &loss_sum;
  model_.Backward(ctx, params_.data(), input_.data(), rows, from, grads_.data(), *workspace_,
                  nullptr, /*accumulate=*/false, grad_input_.data());
  // Plain SGD on the MLP, here or by the servers; the embeddings' rows by their store (the same
  // rule: w -= lr * g).
  if (dense != nullptr) {
    std::fill(dense_values_.begin(), dense_values_.end(), 0.0f);
    std::copy(grads_.begin(), grads_.end(), dense_values_.begin());
    LOCKSTEP_RETURN_IF_ERROR(dense->Push(dense_rows_, dense_values_.data(), options.push));
  } else {
    const float step = -spec_.learning_rate;
    for (size_t i = 0; i < params_.size(); ++i) params_[i] += step * grads_[i];
  }
  LOCKSTEP_RETURN_IF_ERROR(embeddings.Push(rows_, grad_input_.data(), options.push));
  return loss_sum / static_cast<double>(rows);  // unscaled: the samples' mean, whatever the share
}

StatusOr<std::vector<double>> SparseModel::Predict(const ClickLog& log, int64_t first, int64_t rows,
                                                   TableRows& embeddings, TableRows* dense) {
  if (dense != nullptr) LOCKSTEP_RETURN_IF_ERROR(PullDense(*dense));
  std::vector<double> probabilities;
  probabilities.reserve(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  const kernels::ExecutionContext& ctx = device_->compute();
  for (int64_t done = 0; done < rows; done += spec_.max_batch) {
    const int64_t chunk = std::min(spec_.max_batch, rows - done);
    LOCKSTEP_RETURN_IF_ERROR(Rows(log, first + done, chunk, &rows_));
    LOCKSTEP_RETURN_IF_ERROR(embeddings.Pull(rows_, input_.data()));
    const float* logits = model_.Forward(ctx, params_.data(), input_.data(), chunk, *workspace_);
    for (int64_t r = 0; r < chunk; ++r) {
      // softmax over (no click, click): sigmoid of the difference.
      const double difference = static_cast<double>(logits[2 * r + 1]) - logits[2 * r];
      probabilities.push_back(1.0 / (1.0 + std::exp(-difference)));
    }
  }
  return probabilities;
}

}  // namespace lockstep::ps

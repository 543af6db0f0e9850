// A click model over hashed categorical fields, the sparse model parameter servers exist for:
// each field's feature id selects a row of one shared embedding table (RowOfId), the fields'
// embeddings are concatenated and fed to the built-in MLP (worker/trainer/model.h) with two
// classes, no click and click. Its tables live where their TableRows say: here (LocalTable:
// plain SGD on a table in memory) or on parameter servers (ServerTable: pulled and pushed
// through a PsClient, SGD applied by the servers). Both apply the same per-row sums of the same
// gradients, so one worker and one server train exactly as plain SGD does here.
//
// The MLP's parameters are the model's own (each step updates them with plain SGD here), or,
// for asynchronous training, a dense table on the servers too (DenseTable: the flat parameter
// buffer cut into rows of kDenseRowWidth floats), pulled before each step and updated by the
// gradients each worker pushes after it, with no step waiting for another worker's.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto model, SparseModel::Create(spec));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto table, LocalTable::Create(EmbeddingTable(spec)));
//   for (int64_t first = 0; first + 256 <= log.samples; first += 256) {
//     LOCKSTEP_ASSIGN_OR_RETURN(double loss, model->Step(log, first, 256, *table));
//   }
//   LOCKSTEP_ASSIGN_OR_RETURN(std::vector<double> p, model->Predict(test, 0, test.samples,
//   *table));
//
// CPU only. Thread safety: a model is used by one thread; a ServerTable may be shared by the
// models of several threads (a LocalTable too: its table locks its rows).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kernels/device.h"
#include "worker/ps/click_log.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/shard_table.h"
#include "worker/trainer/model.h"

namespace lockstep::ps {

struct SparseModelSpec {
  int32_t fields = 8;
  int32_t dim = 8;  // floats per embedding
  int64_t table_rows = int64_t{1} << 20;
  std::vector<int32_t> hidden = {64};
  kernels::ActivationType activation = kernels::ActivationType::kRelu;
  float learning_rate = 0.05f;  // the MLP's and the table's
  uint64_t seed = 1;
  float init_scale = 0.01f;  // the table's rows start uniform in [-init_scale, init_scale)
  int64_t max_batch = 1024;
};

// The embedding table of `spec` (name "embeddings").
TableSpec EmbeddingTable(const SparseModelSpec& spec);

// The MLP's parameters as a table (name "dense"): `num_params` floats in rows of
// kDenseRowWidth, the last one padded with zeros. It starts at zero: the chief writes the
// model's initial parameters into it (SparseModel::InitializeDense) before training starts.
inline constexpr int32_t kDenseRowWidth = 64;
TableSpec DenseTable(const SparseModelSpec& spec, int64_t num_params);

// The rows of one table, here or on the servers.
class TableRows {
 public:
  virtual ~TableRows() = default;
  virtual int32_t dim() const = 0;
  // out[i * dim ...] = row rows[i].
  virtual Status Pull(const std::vector<uint64_t>& rows, float* out) = 0;
  // values[i * dim ...] applied to rows[i] (a row named more than once gets their sum,
  // SumByRow): SGD for kGradient, added for kDelta.
  virtual Status Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) = 0;
};

// A table in this process.
class LocalTable final : public TableRows {
 public:
  static StatusOr<std::unique_ptr<LocalTable>> Create(const TableSpec& spec);
  int32_t dim() const override { return table_->spec().dim; }
  Status Pull(const std::vector<uint64_t>& rows, float* out) override;
  Status Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) override;

 private:
  explicit LocalTable(std::unique_ptr<ShardTable> table) : table_(std::move(table)) {}
  std::unique_ptr<ShardTable> table_;
};

// A table on the job's parameter servers.
class ServerTable final : public TableRows {
 public:
  ServerTable(PsClient& client, TableSpec spec) : client_(client), spec_(std::move(spec)) {}
  int32_t dim() const override { return spec_.dim; }
  Status Pull(const std::vector<uint64_t>& rows, float* out) override;
  Status Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) override;

 private:
  PsClient& client_;
  const TableSpec spec_;
};

// Geo-SGD's view of a table on the servers: the rows a worker uses are pulled once into a copy
// here and trained there with plain SGD (a gradient push applies here), and Sync(), every few
// steps, sends each row's change since it was pulled, times `share` (a DELTA push: the servers
// add the workers' changes as they come), and drops the copy, so the next steps pull the rows
// fresh with every worker's changes in them. What travels is one delta per row used between
// syncs, not a gradient per step.
//
// share: 1 / workers for a table every worker trains the same rows of (the dense MLP: W deltas
// are W estimates of one update, and their sum would be a W-fold learning rate; PaddlePaddle's
// Geo-SGD divides by its trainers too); 1 for embedding rows, which few workers touch between
// syncs, so that each worker's change counts as its asynchronous pushes would have (measured on
// the click log in one run by hand: 1 / workers there left rare rows undertrained, AUC 0.716
// against 0.744).
class GeoTable final : public TableRows {
 public:
  GeoTable(TableRows& remote, float learning_rate, float share)
      : remote_(remote), learning_rate_(learning_rate), share_(share), dim_(remote.dim()) {}
  int32_t dim() const override { return dim_; }
  // Rows not held here are pulled from the servers first.
  Status Pull(const std::vector<uint64_t>& rows, float* out) override;
  // Applied to the copy here (rows not held here are pulled first).
  Status Push(const std::vector<uint64_t>& rows, const float* values, PushKind kind) override;
  // Pushes the changes of the rows held here and drops them (also when the push fails: it may
  // have reached some servers, and a second push would apply their part twice).
  Status Sync();
  size_t rows_held() const { return rows_.size(); }

 private:
  Status Hold(const std::vector<uint64_t>& rows);

  TableRows& remote_;
  const float learning_rate_;
  const float share_;
  const int32_t dim_;
  std::unordered_map<uint64_t, size_t> slot_;  // row -> its place in rows_
  std::vector<uint64_t> rows_;
  std::vector<float> values_, pulled_;  // rows_.size() x dim: now, and as pulled
};

// How a step's gradients reach the tables.
struct SparseStepOptions {
  // kGradient (applied at once) or kDeferred (held by the servers until the slowest worker's
  // clock advances: synchronous training).
  PushKind push = PushKind::kGradient;
  // The gradients' weight: 1 for the mean over this step's samples; 1 / workers in synchronous
  // training, so that the servers' sum is the mean over every worker's samples.
  float share = 1.0f;
};

class SparseModel {
 public:
  // INVALID_ARGUMENT for fields, dim, table rows or max_batch < 1, or a learning rate that is
  // not positive.
  static StatusOr<std::unique_ptr<SparseModel>> Create(const SparseModelSpec& spec);

  // One step of SGD on samples [first, first + rows) of `log` (rows <= max_batch): the rows of
  // the embedding table the batch uses are pulled, forward and backward run, and the embeddings'
  // gradients are pushed. The MLP is updated here, or, given `dense` (asynchronous training),
  // pulled from it first and its gradient pushed to it after. Returns the batch's mean
  // cross-entropy.
  StatusOr<double> Step(const ClickLog& log, int64_t first, int64_t rows, TableRows& embeddings,
                        TableRows* dense = nullptr, const SparseStepOptions& options = {});
  // The click probability of samples [first, first + rows) (any number of rows), with the MLP
  // from `dense` when given.
  StatusOr<std::vector<double>> Predict(const ClickLog& log, int64_t first, int64_t rows,
                                        TableRows& embeddings, TableRows* dense = nullptr);
  // Writes this model's initial MLP parameters into `dense` (kAssign): the chief's first act on
  // a dense table, harmless when a replaced chief does it again before training starts.
  Status InitializeDense(TableRows& dense);

  const std::vector<float>& mlp_params() const { return params_; }

 private:
  SparseModel(SparseModelSpec spec, trainer::MlpModel model,
              std::unique_ptr<kernels::Device> device);
  // The table rows of samples [first, first + rows), sample by sample, field by field.
  Status Rows(const ClickLog& log, int64_t first, int64_t rows, std::vector<uint64_t>* out) const;
  // The MLP's parameters from `dense` into params_.
  Status PullDense(TableRows& dense);

  const SparseModelSpec spec_;
  trainer::MlpModel model_;
  std::unique_ptr<kernels::Device> device_;
  std::unique_ptr<trainer::MlpWorkspace> workspace_;
  std::vector<float> params_, grads_, input_, grad_input_;
  std::vector<uint64_t> rows_;
  std::vector<uint64_t> dense_rows_;  // 0 .. rows of the dense table - 1
  std::vector<float> dense_values_;   // params_ or grads_ padded to whole rows
  std::vector<int32_t> labels_;
};

}  // namespace lockstep::ps

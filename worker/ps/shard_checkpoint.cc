#include "worker/ps/shard_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace lockstep::ps {
namespace {

constexpr char kTablePrefix[] = "table/";

template <typename T>
checkpoint::NamedTensor Tensor(const std::string& name, const std::string& dtype,
                               std::vector<int64_t> shape, const std::vector<T>& values) {
  checkpoint::NamedTensor tensor;
  tensor.name = name;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(tensor.bytes.data(), values.data(), tensor.bytes.size());
  return tensor;
}

}  // namespace

StatusOr<std::unique_ptr<ShardCheckpointer>> ShardCheckpointer::Open(
    ShardCheckpointOptions options) {
  LOCKSTEP_ASSIGN_OR_RETURN(checkpoint::StorageUri uri, checkpoint::ParseStorageUri(options.uri));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::Storage> storage,
                            checkpoint::OpenStorage(uri.uri, {}));
  const std::string root = checkpoint::JoinPath(
      uri.path, "ps-" + std::to_string(options.shard) + "-of-" + std::to_string(options.shards));
  return std::unique_ptr<ShardCheckpointer>(
      new ShardCheckpointer(std::move(options), std::move(storage), root));
}

ShardCheckpointer::ShardCheckpointer(ShardCheckpointOptions options,
                                     std::unique_ptr<checkpoint::Storage> storage, std::string root)
    : options_(std::move(options)), storage_(std::move(storage)), root_(std::move(root)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

ShardCheckpointer::~ShardCheckpointer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  writer_.join();
}

StatusOr<std::optional<ShardSnapshot>> ShardCheckpointer::LoadNewest() {
  // Only a checkpoint of this job's tables and workers is this shard's.
  auto accept = [this](const checkpoint::Manifest& manifest) -> Status {
    std::map<std::string, std::vector<int64_t>> expected;
    for (const TableSpec& table : options_.tables) {
      expected[kTablePrefix + table.name] = {LocalRowsOf(table, options_.shard, options_.shards),
                                             table.dim};
    }
    expected["clocks"] = {options_.workers};
    expected["initialized"] = {1};
    std::map<std::string, std::vector<int64_t>> found;
    for (const checkpoint::TensorEntry& entry : manifest.tensors) found[entry.name] = entry.shape;
    if (found != expected) {
      return FailedPreconditionError("its tables or workers are not this job's");
    }
    return OkStatus();
  };
  StatusOr<checkpoint::LoadedCheckpoint> loaded = checkpoint::LoadNewestValid(
      *storage_, root_, Deadline::AfterMs(options_.read_timeout_ms), accept);
  if (loaded.status().code() == StatusCode::kNotFound) return std::optional<ShardSnapshot>();
  if (!loaded.ok()) return loaded.status();
  ShardSnapshot snapshot;
  snapshot.step = loaded->state.step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_committed_ = std::max(last_committed_, snapshot.step);
  }
  for (const checkpoint::NamedTensor& tensor : loaded->state.tensors) {
    if (tensor.name == "clocks") {
      snapshot.clocks.resize(tensor.bytes.size() / sizeof(int64_t));
      std::memcpy(snapshot.clocks.data(), tensor.bytes.data(), tensor.bytes.size());
    } else if (tensor.name == "initialized") {
      snapshot.initialized = !tensor.bytes.empty() && tensor.bytes[0] != 0;
    } else if (tensor.name.rfind(kTablePrefix, 0) == 0) {
      std::vector<float>& values = snapshot.tables[tensor.name.substr(std::strlen(kTablePrefix))];
      values.resize(tensor.bytes.size() / sizeof(float));
      std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
    }
  }
  return std::optional<ShardSnapshot>(std::move(snapshot));
}

bool ShardCheckpointer::WriteInBackground(ShardSnapshot snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ || pending_.has_value() || stopping_) return false;
  pending_ = std::move(snapshot);
  cv_.notify_all();
  return true;
}

int64_t ShardCheckpointer::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

int64_t ShardCheckpointer::last_committed_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_committed_;
}

bool ShardCheckpointer::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !busy_ && !pending_.has_value() && !stopping_ &&
         (failed_at_ < 0 || MonotonicSeconds() - failed_at_ >= kRetryBackoffMs / 1000.0);
}

void ShardCheckpointer::WriterLoop() {
  checkpoint::CheckpointWriterOptions writer_options;
  writer_options.keep = options_.keep;
  while (true) {
    ShardSnapshot snapshot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || pending_.has_value(); });
      if (!pending_.has_value()) return;  // stopping with nothing to write
      snapshot = std::move(*pending_);
      pending_.reset();
      busy_ = true;
    }
    checkpoint::CheckpointState state;
    state.step = snapshot.step;
    state.optimizer.type = "sgd";
    for (const TableSpec& table : options_.tables) {
      const int64_t rows = LocalRowsOf(table, options_.shard, options_.shards);
      state.tensors.push_back(
          Tensor(kTablePrefix + table.name, "f32", {rows, table.dim}, snapshot.tables[table.name]));
    }
    state.tensors.push_back(
        Tensor("clocks", "i64", {static_cast<int64_t>(snapshot.clocks.size())}, snapshot.clocks));
    state.tensors.push_back(
        Tensor("initialized", "u8", {1},
               std::vector<uint8_t>{snapshot.initialized ? uint8_t{1} : uint8_t{0}}));
    writer_options.attempt_id = std::to_string(snapshot.step);
    checkpoint::CheckpointWriter writer(*storage_, root_, /*rank=*/0, /*world_size=*/1,
                                        writer_options);
    const Status status = writer.Write(state, Deadline::AfterMs(options_.write_timeout_ms));
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (status.ok()) {
      ++written_;
      last_committed_ = std::max(last_committed_, snapshot.step);
      failed_at_ = -1;
    } else {
      failed_at_ = MonotonicSeconds();
      LOCKSTEP_LOG(WARNING) << "checkpoint of step " << snapshot.step << " under " << root_
                            << " failed: " << status;
    }
  }
}

}  // namespace lockstep::ps

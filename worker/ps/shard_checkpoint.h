// A parameter server's checkpoints of its shard (the job's checkpoint format, checkpoint.h):
// under <spec.checkpoint.uri>/ps-<s>-of-<S>/ as step-<N> directories, N the slowest worker's
// clock when it was taken, each holding
//   table/<name>  f32 [local rows, dim]   every table's rows of this shard
//   clocks        i64 [workers]           every worker's clock
//   initialized   u8  [1]                 whether the chief had written the initial values
// written atomically (assembled under a .tmp- name, renamed into place) with the newest `keep`
// kept. A server that starts again loads the newest valid one of its shard, so the job loses only
// what was pushed to that shard after it (docs/parameter-servers.md, "Failures").
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto checkpoints, ShardCheckpointer::Open(options));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::optional<ShardSnapshot> restored, checkpoints->LoadNewest());
//   checkpoints->WriteInBackground(snapshot);   // skipped while the previous one is still written
//
// Thread safety: LoadNewest before any write; WriteInBackground from one thread at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/storage/storage.h"
#include "worker/ps/shard_table.h"

namespace lockstep::ps {

struct ShardSnapshot {
  int64_t step = 0;  // the slowest worker's clock
  std::vector<int64_t> clocks;
  bool initialized = false;
  std::map<std::string, std::vector<float>> tables;  // name -> local rows x dim
};

struct ShardCheckpointOptions {
  std::string uri;  // the job's spec.checkpoint.uri
  int shard = 0;
  int shards = 1;
  int keep = 3;
  // The shard's tables (their local rows are ShardTable::local_rows of each) and workers: a
  // checkpoint of other tables or another count of workers is not this job's, and is skipped.
  std::vector<TableSpec> tables;
  int workers = 1;
  int64_t write_timeout_ms = 60000;
  int64_t read_timeout_ms = 60000;
};

class ShardCheckpointer {
 public:
  // INVALID_ARGUMENT for a URI the storage layer does not take.
  static StatusOr<std::unique_ptr<ShardCheckpointer>> Open(ShardCheckpointOptions options);
  // Waits for a write in flight (bounded by its timeout).
  ~ShardCheckpointer();

  // The newest valid checkpoint of this shard; nullopt when there is none.
  StatusOr<std::optional<ShardSnapshot>> LoadNewest();
  // Writes `snapshot` on the checkpointer's thread; false (and nothing written) while the
  // previous one is still being written.
  bool WriteInBackground(ShardSnapshot snapshot);

  int64_t written() const;  // checkpoints committed so far
  // The step of the newest checkpoint committed since Open, or restored by LoadNewest; -1: none.
  int64_t last_committed_step() const;
  // Whether a write would be taken now: none in flight, and none failed in the last
  // kRetryBackoffMs.
  bool ready() const;
  static constexpr int64_t kRetryBackoffMs = 5000;
  std::string root() const { return root_; }

 private:
  ShardCheckpointer(ShardCheckpointOptions options, std::unique_ptr<checkpoint::Storage> storage,
                    std::string root);
  void WriterLoop();

  const ShardCheckpointOptions options_;
  std::unique_ptr<checkpoint::Storage> storage_;
  const std::string root_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ShardSnapshot> pending_;
  bool busy_ = false;
  bool stopping_ = false;
  int64_t written_ = 0;
  int64_t last_committed_ = -1;
  double failed_at_ = -1;  // MonotonicSeconds() of the last failed write; -1: none
  std::thread writer_;
};

}  // namespace lockstep::ps

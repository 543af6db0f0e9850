// Data sets for the built-in trainer: the manifest's `spec.trainer.data` loaded into memory as
// dense float features and int32 labels.
//
//   StatusOr<DataSplits> splits = LoadDatasets(job);
//   if (!splits.ok()) return splits.status();   // names the field and the file
//   const Dataset& train = splits->train;         // train.features[i * train.num_features + j]
//
// Formats (spec::DataFormat):
//   idx  data.train = [images, labels] (likewise data.test): the MNIST family's IDX files, read
//        straight from .gz through zlib, or uncompressed. Images are IDX type 0x00000803 (unsigned
//        bytes, N x rows x cols), labels 0x00000801 (unsigned bytes, N). A file must hold exactly
//        the bytes its header promises. Pixels are scaled to [0, 1] by 1/255.
//   csv  data.train = [file]: one sample per row, the features then the integer label last,
//        comma-separated, .gz or plain; blank lines are skipped; no header row. Features are
//        multiplied by 1/max|x| taken over the TRAIN split's features (1 when that is 0), and the
//        same factor is applied to the test split, so both splits see one consistent scale (test
//        values may therefore exceed 1).
//
// num_classes is max label + 1 over the train split; test labels must be < num_classes and the
// test split must have the train split's num_features.
//
// Errors: NotFound for a missing file, PermissionDenied for an unreadable one, InvalidArgument
// for everything about the contents (bad gzip, wrong magic, truncation, bad cell, ...). Messages
// start with the field and the resolved path, e.g.
//   spec.trainer.data.train[0]: /d/x.gz: truncated IDX file: header promises 60000 images of
//   28x28 (47040000 bytes), found 1234567
//
// Thread safety: the functions are reentrant; the returned data is plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::trainer {

// One split held in memory.
struct Dataset {
  int64_t num_samples = 0;
  int64_t num_features = 0;
  int32_t num_classes = 0;      // max train label + 1 (shared by both splits)
  std::vector<float> features;  // [num_samples, num_features], row-major
  std::vector<int32_t> labels;  // [num_samples], each in [0, num_classes)
  // For logs: "idx train: 60000 x 784 from /usr/share/.../train-images-idx3-ubyte.gz".
  std::string description;
};

struct DataSplits {
  Dataset train;                // never empty on success
  std::optional<Dataset> test;  // nullopt when spec.trainer.data.test is empty
};

// Loads the train split and, when data.test is given, the test split of job.spec.trainer.
// Requires job.spec.trainer to be set. Blocks on file I/O; Fashion-MNIST's train split loads in
// a few hundred milliseconds. Returns the first problem found.
StatusOr<DataSplits> LoadDatasets(const spec::TrainingJob& job);

// The sizes of the loaded splits, for estimating what a rank will hold (trainer/memory_estimate.h).
struct DataShape {
  int64_t train_samples = 0;
  int64_t test_samples = 0;  // 0 without a test split
  int64_t features = 0;
  int32_t classes = 0;
};

// What `lockstep validate` and `lockstep run` call before starting workers: loads both splits
// (same cost as LoadDatasets) and returns OK, or InvalidArgument/NotFound whose message lists
// every problem found, one per line (a train problem and a test problem are both reported).
// On OK, `shape` (when given) receives the splits' sizes.
Status CheckDatasets(const spec::TrainingJob& job, DataShape* shape = nullptr);

// Copies the samples `ids[0..count)` of `dataset` into `features_out` ([count, num_features],
// row-major) and `labels_out` ([count]). Ids must be in [0, dataset.num_samples) (asserted in
// debug builds); the caller owns the output buffers, sized for `count` samples.
void GatherBatch(const Dataset& dataset, const int64_t* ids, int64_t count, float* features_out,
                 int32_t* labels_out);

}  // namespace lockstep::trainer

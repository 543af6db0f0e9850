#include "worker/trainer/dataset.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep::trainer {
namespace {

namespace fs = std::filesystem;

const char kFashionDir[] = "/usr/share/datasets/fashion-mnist/";
const char kDigitsCsv[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

spec::TrainingJob JobWith(spec::DataFormat format, std::vector<std::string> train,
                          std::vector<std::string> test = {}) {
  spec::TrainingJob job;
  job.spec.trainer.emplace();
  job.spec.trainer->data.format = format;
  job.spec.trainer->data.train = std::move(train);
  job.spec.trainer->data.test = std::move(test);
  return job;
}

std::vector<uint8_t> BigEndian32(uint32_t value) {
  return {static_cast<uint8_t>(value >> 24), static_cast<uint8_t>(value >> 16),
          static_cast<uint8_t>(value >> 8), static_cast<uint8_t>(value)};
}

// An IDX header (magic and dimensions) followed by `payload_bytes` bytes of `fill`.
std::vector<uint8_t> Idx(uint32_t magic, std::vector<uint32_t> dims, size_t payload_bytes,
                         uint8_t fill = 0) {
  std::vector<uint8_t> bytes = BigEndian32(magic);
  for (uint32_t dim : dims) {
    std::vector<uint8_t> encoded = BigEndian32(dim);
    bytes.insert(bytes.end(), encoded.begin(), encoded.end());
  }
  bytes.resize(bytes.size() + payload_bytes, fill);
  return bytes;
}

// Fixtures live in a fresh directory per test, removed afterwards.
class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "lockstep-data-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WritePlain(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string WritePlain(const std::string& name, const std::vector<uint8_t>& content) {
    return WritePlain(name, std::string(content.begin(), content.end()));
  }
  std::string WriteGzip(const std::string& name, const std::vector<uint8_t>& content) {
    const std::string path = (dir_ / name).string();
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr);
    EXPECT_EQ(gzwrite(file, content.data(), static_cast<unsigned>(content.size())),
              static_cast<int>(content.size()));
    gzclose(file);
    return path;
  }
  std::string WriteGzip(const std::string& name, const std::string& content) {
    return WriteGzip(name, std::vector<uint8_t>(content.begin(), content.end()));
  }
  // A small valid labels file: `count` labels cycling through 0..classes-1.
  std::string WriteLabels(const std::string& name, uint32_t count, int classes = 3) {
    std::vector<uint8_t> bytes = Idx(0x00000801, {count}, 0);
    for (uint32_t i = 0; i < count; ++i) bytes.push_back(static_cast<uint8_t>(i % classes));
    return WriteGzip(name, bytes);
  }

  fs::path dir_;
};

TEST_F(DatasetTest, LoadsFashionMnistTrainAndTestFromGzip) {
  const std::string dir = kFashionDir;
  if (!fs::exists(dir + "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "no " << dir;
  const spec::TrainingJob job = JobWith(spec::DataFormat::kIdx,
                                        {"file://" + dir + "train-images-idx3-ubyte.gz",
                                         "file://" + dir + "train-labels-idx1-ubyte.gz"},
                                        {"file://" + dir + "t10k-images-idx3-ubyte.gz",
                                         "file://" + dir + "t10k-labels-idx1-ubyte.gz"});

  const auto start = std::chrono::steady_clock::now();
  StatusOr<DataSplits> splits = LoadDatasets(job);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(splits.ok()) << splits.status();
  RecordProperty("load_seconds", std::to_string(seconds));

  const Dataset& train = splits->train;
  EXPECT_EQ(train.num_samples, 60000);
  EXPECT_EQ(train.num_features, 784);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_EQ(train.features.size(), 60000u * 784u);
  EXPECT_EQ(train.labels.size(), 60000u);
  EXPECT_EQ(train.labels[0], 9);  // xxd: byte 8 of train-labels is 0x09 (ankle boot)
  const auto [min_pixel, max_pixel] =
      std::minmax_element(train.features.begin(), train.features.end());
  EXPECT_EQ(*min_pixel, 0.0f);
  EXPECT_EQ(*max_pixel, 1.0f);

  ASSERT_TRUE(splits->test.has_value());
  EXPECT_EQ(splits->test->num_samples, 10000);
  EXPECT_EQ(splits->test->num_features, 784);
  EXPECT_EQ(splits->test->num_classes, 10);
  EXPECT_EQ(splits->test->labels[0], 9);
  EXPECT_TRUE(CheckDatasets(job).ok());
}

TEST_F(DatasetTest, LoadsSklearnDigitsCsvScaledByTrainMaximum) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "no " << kDigitsCsv;
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kCsv, {std::string("file://") + kDigitsCsv}));
  ASSERT_TRUE(splits.ok()) << splits.status();
  const Dataset& train = splits->train;
  EXPECT_EQ(train.num_samples, 1797);
  EXPECT_EQ(train.num_features, 64);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_FALSE(splits->test.has_value());
  // Row 1 is "0,0,5,13,..." with label 0; the maximum feature is 16.
  EXPECT_EQ(train.labels[0], 0);
  EXPECT_EQ(train.labels[1], 1);
  EXPECT_FLOAT_EQ(train.features[2], 5.0f / 16.0f);
  EXPECT_EQ(*std::max_element(train.features.begin(), train.features.end()), 1.0f);
}

TEST_F(DatasetTest, CsvTestSplitUsesTheTrainSplitsScale) {
  const std::string train = WritePlain("train.csv", "1,4,0\n2,0,1\n");
  const std::string test = WriteGzip("test.csv.gz", "8,2,1\n");
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kCsv, {train}, {test}));
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train.features, (std::vector<float>{0.25f, 1.0f, 0.5f, 0.0f}));
  EXPECT_EQ(splits->test->features, (std::vector<float>{2.0f, 0.5f}));
  EXPECT_EQ(splits->train.num_classes, 2);
  EXPECT_EQ(splits->test->num_classes, 2);
}

TEST_F(DatasetTest, CsvSkipsBlankLinesAndAcceptsCrlf) {
  const std::string path = WritePlain("d.csv", "\n1, 2 ,0\r\n\r\n  \n3,4,2\n");
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kCsv, {path}));
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train.num_samples, 2);
  EXPECT_EQ(splits->train.labels, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(splits->train.num_classes, 3);
}

TEST_F(DatasetTest, TruncatedGzipIdxNamesWhatTheHeaderPromisesAndWhatWasFound) {
  const std::string images = WriteGzip("x.gz", Idx(0x00000803, {60000, 28, 28}, 1234567));
  const std::string labels = WriteLabels("y.gz", 60000);
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, labels}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: " + images +
                ": truncated IDX file: header promises 60000 images of 28x28 (47040000 bytes), "
                "found 1234567");
}

TEST_F(DatasetTest, TruncatedLabelFileIsRejected) {
  const std::string images = WriteGzip("x.gz", Idx(0x00000803, {4, 2, 2}, 16));
  const std::string labels = WriteGzip("y.gz", Idx(0x00000801, {4}, 3));
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, labels}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[1]: " + labels +
                ": truncated IDX file: header promises 4 labels (4 bytes), found 3");
}

TEST_F(DatasetTest, IdxLongerThanItsHeaderIsRejected) {
  const std::string images = WriteGzip("x.gz", Idx(0x00000803, {4, 2, 2}, 17));
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, WriteLabels("y.gz", 4)}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: " + images +
                ": IDX file longer than its header says: header promises 4 images of 2x2 (16 "
                "bytes), found at least 17");
}

TEST_F(DatasetTest, NonGzipContentInGzFileIsRejected) {
  const std::string images = WritePlain("x.gz", "<html>404 Not Found</html>\n");
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, WriteLabels("y.gz", 4)}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(), "spec.trainer.data.train[0]: " + images +
                                           ": not a gzip file (no gzip magic 1f 8b at its start)");
}

TEST_F(DatasetTest, CorruptGzipStreamIsRejected) {
  // A valid gzip cut in half: the deflate stream ends early.
  const std::string whole = WriteGzip("whole.gz", Idx(0x00000803, {100, 8, 8}, 6400, 7));
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string images = WritePlain("x.gz", bytes.substr(0, bytes.size() / 2));
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, WriteLabels("y.gz", 100)}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(
      splits.status().message().rfind(
          "spec.trainer.data.train[0]: " + images + ": corrupt or truncated gzip data (zlib: ", 0),
      0u)
      << splits.status();
}

TEST_F(DatasetTest, UncompressedIdxFilesAreAccepted) {
  std::vector<uint8_t> image_bytes = Idx(0x00000803, {2, 1, 2}, 0);
  for (uint8_t pixel : {0, 51, 255, 102}) image_bytes.push_back(pixel);
  const std::string images = WritePlain("images-idx3-ubyte", image_bytes);
  std::vector<uint8_t> label_bytes = Idx(0x00000801, {2}, 0);
  label_bytes.push_back(1);
  label_bytes.push_back(0);
  const std::string labels = WritePlain("labels-idx1-ubyte", label_bytes);
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, labels}));
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train.features, (std::vector<float>{0.0f, 0.2f, 1.0f, 0.4f}));
  EXPECT_EQ(splits->train.labels, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(splits->train.num_classes, 2);
}

TEST_F(DatasetTest, SwappedImagesAndLabelsFailOnTheMagicNumber) {
  const std::string labels = WriteLabels("labels.gz", 4);
  const std::string images = WriteGzip("images.gz", Idx(0x00000803, {4, 2, 2}, 16));
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kIdx, {labels, images}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: " + labels +
                ": not an IDX image file: magic 0x00000801, expected 0x00000803 (this is an IDX "
                "label file; idx data is [images, labels])");
}

TEST_F(DatasetTest, ImageAndLabelCountsMustAgree) {
  const std::string images = WriteGzip("x.gz", Idx(0x00000803, {5, 2, 2}, 20));
  const std::string labels = WriteLabels("y.gz", 4);
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, labels}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(), "spec.trainer.data.train: " + images +
                                           " holds 5 images but " + labels + " holds 4 labels");
}

TEST_F(DatasetTest, TestLabelsMustBeClassesOfTheTrainSplit) {
  const std::string train_images = WriteGzip("a.gz", Idx(0x00000803, {4, 2, 2}, 16));
  const std::string train_labels = WriteLabels("b.gz", 4, 3);  // classes 0..2
  const std::string test_images = WriteGzip("c.gz", Idx(0x00000803, {4, 2, 2}, 16));
  const std::string test_labels = WriteLabels("d.gz", 4, 4);  // sample 3 has label 3
  StatusOr<DataSplits> splits = LoadDatasets(
      JobWith(spec::DataFormat::kIdx, {train_images, train_labels}, {test_images, test_labels}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.test[1]: " + test_labels +
                ": label 3 of sample 3 is out of range: the train split has 3 classes (labels "
                "0..2)");
}

TEST_F(DatasetTest, CsvBadCellNamesLineAndColumn) {
  const std::string path = WritePlain("d.csv", "1,2,0\n\n3,x4,1\n");
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kCsv, {path}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(), "spec.trainer.data.train[0]: " + path +
                                           ": line 3, column 2: not a finite number: \"x4\"");
}

TEST_F(DatasetTest, CsvNonIntegerLabelIsRejected) {
  const std::string path = WritePlain("d.csv", "1,2,0.5\n");
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kCsv, {path}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: " + path +
                ": line 1, column 3: the label (last column) must be an integer in [0, 1048576], "
                "got \"0.5\"");
}

TEST_F(DatasetTest, CsvRowsOfDifferingWidthAreRejected) {
  const std::string path = WriteGzip("d.csv.gz", "1,2,0\n3,4,1\n5,1\n");
  StatusOr<DataSplits> splits = LoadDatasets(JobWith(spec::DataFormat::kCsv, {path}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(), "spec.trainer.data.train[0]: " + path +
                                           ": line 3: 2 columns, expected 3 (as on line 1)");
}

TEST_F(DatasetTest, MissingFileIsNotFoundNamingFieldAndPath) {
  const std::string missing = (dir_ / "nope.csv.gz").string();
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kCsv, {"file://" + missing}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: " + missing + ": file not found");
}

TEST_F(DatasetTest, RelativePathsResolveAgainstTheManifestDirectory) {
  WritePlain("d.csv", "1,0\n2,1\n");
  spec::TrainingJob job = JobWith(spec::DataFormat::kCsv, {"d.csv"});
  job.base_dir = dir_.string();
  StatusOr<DataSplits> splits = LoadDatasets(job);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train.num_samples, 2);
}

TEST_F(DatasetTest, NonFileUriSchemeIsRejected) {
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kCsv, {"hdfs://namenode:9870/d.csv"}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train[0]: \"hdfs://namenode:9870/d.csv\": unsupported URI scheme; "
            "data must be file:// or a path");
}

TEST_F(DatasetTest, WrongNumberOfFilesForTheFormatIsRejected) {
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kIdx, {WriteLabels("y.gz", 4)}));
  ASSERT_FALSE(splits.ok());
  EXPECT_EQ(splits.status().message(),
            "spec.trainer.data.train: format idx needs 2 files [images, labels], got 1");
}

// A gzip bomb: a valid header for ten 28x28 images, then `inflated_bytes` of zeros, which
// deflate to about a thousandth of that. Written in chunks so the test itself stays small.
std::string WriteIdxBomb(const fs::path& path, size_t inflated_bytes) {
  gzFile file = gzopen(path.c_str(), "wb1");
  EXPECT_NE(file, nullptr);
  const std::vector<uint8_t> header = Idx(0x00000803, {10, 28, 28}, 0);
  gzwrite(file, header.data(), static_cast<unsigned>(header.size()));
  const std::vector<uint8_t> zeros(8u << 20, 0);
  for (size_t written = 0; written < inflated_bytes; written += zeros.size()) {
    gzwrite(file, zeros.data(), static_cast<unsigned>(zeros.size()));
  }
  gzclose(file);
  return path.string();
}

TEST_F(DatasetTest, AGzipBombIsRefusedAfterInflatingNoMoreThanItsHeaderPromises) {
  const size_t bomb_bytes = size_t{512} << 20;
  const std::string images = WriteIdxBomb(dir_ / "images.gz", bomb_bytes);
  ASSERT_LT(fs::file_size(images), bomb_bytes / 100);
  const spec::TrainingJob job =
      JobWith(spec::DataFormat::kIdx, {images, WriteLabels("labels.gz", 10)});

  // Loaded in a child, whose peak resident memory the kernel reports at exit.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    const Status status = CheckDatasets(job);
    const std::string message = status.message();
    ssize_t ignored = write(pipe_fds[1], message.data(), message.size());
    (void)ignored;
    _exit(status.ok() ? 0 : 1);
  }
  close(pipe_fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t got; (got = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, got);
  close(pipe_fds[0]);
  int wait_status = 0;
  struct rusage usage {};
  ASSERT_EQ(wait4(child, &wait_status, 0, &usage), child);
  ASSERT_TRUE(WIFEXITED(wait_status));
  EXPECT_EQ(WEXITSTATUS(wait_status), 1);
  EXPECT_EQ(message, "spec.trainer.data.train[0]: " + images +
                         ": IDX file longer than its header says: header promises 10 images of "
                         "28x28 (7840 bytes), found at least 7841");
  // ru_maxrss is in KiB. Inflating the whole bomb would take 512 MiB; the promise is 7840 bytes.
  EXPECT_LT(usage.ru_maxrss, 128 * 1024) << "peak resident KiB while refusing a 512 MiB bomb";
}

TEST_F(DatasetTest, AHeaderPromisingMoreThanMemoryCanDecodeIsRefusedAtTheHeader) {
  // 4 billion images of 65535 x 65535: no machine decodes that, and nothing past the header is
  // inflated to find out (the file is a header and a kilobyte of zeros).
  const std::string images =
      WriteGzip("x.gz", Idx(0x00000803, {0xFFFFFFFFu, 65535, 65535}, 1024));
  StatusOr<DataSplits> splits =
      LoadDatasets(JobWith(spec::DataFormat::kIdx, {images, WriteLabels("y.gz", 4)}));
  ASSERT_FALSE(splits.ok());
  EXPECT_NE(splits.status().message().find(
                "spec.trainer.data.train[0]: " + images + ": IDX header promises "),
            std::string::npos)
      << splits.status();
  EXPECT_NE(splits.status().message().find("more than this machine's memory can decode"),
            std::string::npos)
      << splits.status();
}

TEST_F(DatasetTest, CheckDatasetsReportsEveryProblemOnePerLine) {
  const std::string bad_train = WritePlain("train.csv", "1,2,0\n1,0\n");
  const std::string missing_test = (dir_ / "test.csv").string();
  const Status status = CheckDatasets(JobWith(spec::DataFormat::kCsv, {bad_train}, {missing_test}));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "spec.trainer.data.train[0]: " + bad_train +
                                  ": line 2: 2 columns, expected 3 (as on line 1)\n"
                                  "spec.trainer.data.test[0]: " +
                                  missing_test + ": file not found");
}

TEST_F(DatasetTest, ExecModeJobHasNoDatasets) {
  spec::TrainingJob job;
  job.spec.command = {"python3", "train.py"};
  EXPECT_EQ(CheckDatasets(job).code(), StatusCode::kFailedPrecondition);
}

TEST(GatherBatchTest, CopiesTheRowsAndLabelsOfTheGivenIds) {
  Dataset dataset;
  dataset.num_samples = 3;
  dataset.num_features = 2;
  dataset.num_classes = 3;
  dataset.features = {0, 1, 10, 11, 20, 21};
  dataset.labels = {0, 1, 2};
  const int64_t ids[] = {2, 0, 2};
  std::vector<float> features(6);
  std::vector<int32_t> labels(3);
  GatherBatch(dataset, ids, 3, features.data(), labels.data());
  EXPECT_EQ(features, (std::vector<float>{20, 21, 0, 1, 20, 21}));
  EXPECT_EQ(labels, (std::vector<int32_t>{2, 0, 2}));
}

}  // namespace
}  // namespace lockstep::trainer

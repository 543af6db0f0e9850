#include "worker/trainer/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "worker/trainer/memory_estimate.h"

namespace lockstep::trainer {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr size_t kIdxImagesHeaderBytes = 16;
constexpr size_t kIdxLabelsHeaderBytes = 8;
// Decompression chunk: large enough that zlib inflates straight into our buffer.
constexpr unsigned kReadChunkBytes = 8u << 20;
// A CSV label above this is far more likely a misplaced feature column than a class id.
constexpr int64_t kMaxCsvLabel = 1 << 20;

std::string Hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// spec::ResolveDataPath with one guard: it passes other schemes through as if they were paths,
// and the trainer reads data from the local file system only, so hdfs:// etc. are named here
// instead of surfacing as a confusing "file not found".
StatusOr<std::string> ResolveLocalDataPath(const spec::TrainingJob& job, const std::string& field,
                                           const std::string& uri) {
  const size_t scheme_end = uri.find("://");
  if (scheme_end != std::string::npos && uri.compare(0, scheme_end, "file") != 0) {
    return InvalidArgumentError(field + ": \"" + uri +
                                "\": unsupported URI scheme; data must be file:// or a path");
  }
  if (uri.empty()) return InvalidArgumentError(field + ": empty path");
  return spec::ResolveDataPath(job, uri);
}

// Capacity hint for a file's content: a gzip file's trailer holds its inflated size mod 2^32
// (exact for a single-member file under 4 GiB); otherwise the file size. Only a hint: reading
// still grows the buffer as needed.
size_t InflatedSizeHint(int fd, off_t file_bytes) {
  uint8_t magic[2];
  uint8_t trailer[4];
  if (file_bytes >= 18 && ::pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b &&
      ::pread(fd, trailer, 4, file_bytes - 4) == 4) {
    const size_t trailer_size = uint32_t{trailer[0]} | (uint32_t{trailer[1]} << 8) |
                                (uint32_t{trailer[2]} << 16) | (uint32_t{trailer[3]} << 24);
    // Deflate expands at most ~1032:1, so a trailer claiming more is damaged or hostile and must
    // not make us reserve gigabytes.
    return std::min(trailer_size, static_cast<size_t>(file_bytes) * 1032);
  }
  return file_bytes > 0 ? static_cast<size_t>(file_bytes) : 0;
}

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// How far to read an IDX file, whose header says how long it is: once the header (the magic and
// `dimensions` sizes) is in, reading stops one byte past the length it promises, so a longer
// file is still recognised as one, and a gzip bomb costs no more than its header claims. A header
// that is not this kind's stops the read there (the parser then names why).
struct ReadBound {
  uint32_t magic = 0;
  int dimensions = 0;
  // A promise past this is refused at the header, before anything more is inflated: each byte
  // becomes a 4-byte float or int32 beside it, so more than memory / 5 cannot be decoded here.
  uint64_t most_bytes = std::numeric_limits<uint64_t>::max();

  size_t header_bytes() const { return 4 + 4 * static_cast<size_t>(dimensions); }
};

// What a ReadBound allows an IDX file on this machine (see ReadBound::most_bytes).
uint64_t DecodableIdxBytes() {
  const double memory = MachineMemoryBytes();
  return memory > 0 ? static_cast<uint64_t>(memory / 5) : std::numeric_limits<uint64_t>::max();
}

// The whole length an IDX header promises: header + product of the dimensions (one byte each);
// nullopt when the magic is not `magic`; saturates rather than overflows for a hostile header.
std::optional<uint64_t> IdxPromisedBytes(const uint8_t* header, uint32_t magic, int dimensions) {
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max() / 2;
  if (ReadBigEndian32(header) != magic) return std::nullopt;
  unsigned __int128 total = 1;
  for (int d = 0; d < dimensions; ++d) {
    total *= ReadBigEndian32(header + 4 + 4 * d);
    if (total > kHuge) return kHuge;
  }
  total += 4 + 4 * static_cast<uint64_t>(dimensions);
  return static_cast<uint64_t>(std::min<unsigned __int128>(total, kHuge));
}

struct FileBytes {
  std::vector<uint8_t> bytes;
  bool cut = false;  // reading stopped at the bound: the file holds more than `bytes`
};

// Reads a file into memory (all of it, or as far as `bound` allows), inflating it when it is gzip
// (detected by content, not by name). A name ending in .gz whose content is not gzip is an error:
// it is almost always a wrong or damaged file rather than a deliberately uncompressed one.
StatusOr<FileBytes> ReadMaybeGzipFile(const std::string& field, const std::string& path,
                                      const ReadBound* bound = nullptr) {
  const std::string where = field + ": " + path + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return NotFoundError(where + "file not found");
    if (error == EACCES) return PermissionDeniedError(where + "permission denied");
    return InvalidArgumentError(where + "cannot open: " + std::strerror(error));
  }
  struct stat info {};
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(where + "is a directory, not a file");
  }
  const size_t size_hint = InflatedSizeHint(fd, info.st_size);
  gzFile file = gzdopen(fd, "rb");  // takes ownership of fd
  if (file == nullptr) {
    ::close(fd);
    return InvalidArgumentError(where + "cannot open (zlib out of memory)");
  }
  gzbuffer(file, 1u << 20);

  // `limit`: the most bytes to read; until the header is in, only the header.
  constexpr size_t kUnbounded = std::numeric_limits<size_t>::max();
  size_t limit = bound != nullptr ? bound->header_bytes() : kUnbounded;
  bool header_done = bound == nullptr;
  FileBytes result;
  std::vector<uint8_t>& bytes = result.bytes;
  // +1: the final read finds EOF in place. A bounded read reserves no more than its header until
  // the header says how much to expect (the gzip trailer's size is the file's own claim).
  bytes.reserve((bound != nullptr ? bound->header_bytes() : std::min(size_hint, kUnbounded - 1)) +
                1);
  for (;;) {
    const size_t used = bytes.size();
    if (used >= limit) {
      if (header_done) {
        // One byte past the promise: the parser reports the file as longer than its header says,
        // and the rest need not be read.
        result.cut = true;
        break;
      }
      header_done = true;
      const std::optional<uint64_t> promised =
          IdxPromisedBytes(bytes.data(), bound->magic, bound->dimensions);
      if (!promised.has_value()) break;
      if (*promised > bound->most_bytes) {
        gzclose_r(file);
        return InvalidArgumentError(where + "IDX header promises " + std::to_string(*promised) +
                                    " bytes, more than this machine's memory can decode (" +
                                    std::to_string(bound->most_bytes) +
                                    " bytes, a fifth of it: each byte becomes 4 more)");
      }
      limit = *promised >= kUnbounded ? kUnbounded : static_cast<size_t>(*promised) + 1;
      bytes.reserve(std::min(size_hint, limit));
      continue;
    }
    const size_t room = bytes.capacity() - used;
    size_t want = room > 0 ? std::min<size_t>(room, kReadChunkBytes) : kReadChunkBytes;
    want = std::min(want, limit - used);
    bytes.resize(used + want);
    const int got = gzread(file, bytes.data() + used, static_cast<unsigned>(want));
    if (got < 0) {
      bytes.resize(used);
      break;
    }
    bytes.resize(used + static_cast<size_t>(got));
    if (got == 0) break;
  }
  std::string error;
  const bool transparent = gzdirect(file) != 0;
  int zlib_code = Z_OK;
  const char* zlib_message = gzerror(file, &zlib_code);
  if (zlib_code == Z_ERRNO) {
    error = std::string("read error: ") + std::strerror(errno);
  } else if (zlib_code != Z_OK) {
    error = std::string("corrupt or truncated gzip data (zlib: ") +
            (zlib_message != nullptr ? zlib_message : "unknown error") + ")";
  }
  gzclose_r(file);
  if (!error.empty()) return InvalidArgumentError(where + error);
  if (transparent && EndsWith(path, ".gz")) {
    return InvalidArgumentError(where + "not a gzip file (no gzip magic 1f 8b at its start)");
  }
  return result;
}

struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> pixels;
};

// `file.cut`: reading stopped one byte past the header's promise, so "found" is a lower bound.
StatusOr<IdxImages> ParseIdxImages(const std::string& where, const FileBytes& file) {
  const std::vector<uint8_t>& bytes = file.bytes;
  // The magic comes first so that a file in the wrong slot is named as such even when it is
  // shorter than this kind's header.
  if (bytes.size() < 4) {
    return InvalidArgumentError(where + "truncated IDX file: " + std::to_string(bytes.size()) +
                                " bytes, shorter than the 4-byte magic number");
  }
  const uint32_t magic = ReadBigEndian32(bytes.data());
  if (magic != kIdxImagesMagic) {
    std::string hint = magic == kIdxLabelsMagic
                           ? " (this is an IDX label file; idx data is [images, labels])"
                           : "";
    return InvalidArgumentError(where + "not an IDX image file: magic " + Hex32(magic) +
                                ", expected " + Hex32(kIdxImagesMagic) + hint);
  }
  if (bytes.size() < kIdxImagesHeaderBytes) {
    return InvalidArgumentError(where + "truncated IDX file: " + std::to_string(bytes.size()) +
                                " bytes, shorter than the 16-byte IDX image header");
  }
  IdxImages images;
  images.count = ReadBigEndian32(bytes.data() + 4);
  images.rows = ReadBigEndian32(bytes.data() + 8);
  images.cols = ReadBigEndian32(bytes.data() + 12);
  if (images.count == 0 || images.rows == 0 || images.cols == 0) {
    return InvalidArgumentError(
        where + "IDX header has an empty dimension: " + std::to_string(images.count) +
        " images of " + std::to_string(images.rows) + "x" + std::to_string(images.cols));
  }
  const std::string promise = "header promises " + std::to_string(images.count) + " images of " +
                              std::to_string(images.rows) + "x" + std::to_string(images.cols);
  // Each dimension is < 2^32, so rows * cols fits in uint64 and the 128-bit product is exact; a
  // hostile header cannot overflow the size check.
  const uint64_t pixels_per_image = static_cast<uint64_t>(images.rows) * images.cols;
  const unsigned __int128 promised =
      static_cast<unsigned __int128>(images.count) * pixels_per_image;
  const auto found = static_cast<int64_t>(bytes.size() - kIdxImagesHeaderBytes);
  if (promised > static_cast<unsigned __int128>(found)) {
    const std::string promised_text = promised > static_cast<unsigned __int128>(INT64_MAX)
                                          ? std::string("more than 2^63")
                                          : std::to_string(static_cast<int64_t>(promised));
    return InvalidArgumentError(where + "truncated IDX file: " + promise + " (" + promised_text +
                                " bytes), found " + std::to_string(found));
  }
  const auto expected = static_cast<int64_t>(promised);
  if (found != expected) {
    return InvalidArgumentError(where + "IDX file longer than its header says: " + promise + " (" +
                                std::to_string(expected) + " bytes), found " +
                                (file.cut ? "at least " : "") + std::to_string(found));
  }
  // A table makes each pixel exactly v / 255 (a multiply by 1/255 would be off by an ulp for
  // some values) at the cost of a lookup.
  float scale[256];
  for (int v = 0; v < 256; ++v) scale[v] = static_cast<float>(v) / 255.0f;
  images.pixels.resize(static_cast<size_t>(expected));
  const uint8_t* in = bytes.data() + kIdxImagesHeaderBytes;
  float* out = images.pixels.data();
  for (int64_t i = 0; i < expected; ++i) out[i] = scale[in[i]];
  return images;
}

StatusOr<std::vector<int32_t>> ParseIdxLabels(const std::string& where, const FileBytes& file) {
  const std::vector<uint8_t>& bytes = file.bytes;
  if (bytes.size() < 4) {
    return InvalidArgumentError(where + "truncated IDX file: " + std::to_string(bytes.size()) +
                                " bytes, shorter than the 4-byte magic number");
  }
  const uint32_t magic = ReadBigEndian32(bytes.data());
  if (magic != kIdxLabelsMagic) {
    std::string hint = magic == kIdxImagesMagic
                           ? " (this is an IDX image file; idx data is [images, labels])"
                           : "";
    return InvalidArgumentError(where + "not an IDX label file: magic " + Hex32(magic) +
                                ", expected " + Hex32(kIdxLabelsMagic) + hint);
  }
  if (bytes.size() < kIdxLabelsHeaderBytes) {
    return InvalidArgumentError(where + "truncated IDX file: " + std::to_string(bytes.size()) +
                                " bytes, shorter than the 8-byte IDX label header");
  }
  const int64_t count = ReadBigEndian32(bytes.data() + 4);
  const auto found = static_cast<int64_t>(bytes.size() - kIdxLabelsHeaderBytes);
  const std::string promise =
      "header promises " + std::to_string(count) + " labels (" + std::to_string(count) + " bytes)";
  if (found < count) {
    return InvalidArgumentError(where + "truncated IDX file: " + promise + ", found " +
                                std::to_string(found));
  }
  if (found > count) {
    return InvalidArgumentError(where + "IDX file longer than its header says: " + promise +
                                ", found " + (file.cut ? "at least " : "") + std::to_string(found));
  }
  return std::vector<int32_t>(bytes.begin() + kIdxLabelsHeaderBytes, bytes.end());
}

// The split's field, e.g. "spec.trainer.data.train", and its files resolved.
struct SplitSource {
  std::string name;   // "train" | "test"
  std::string field;  // "spec.trainer.data.train"
  std::vector<std::string> paths;
};

StatusOr<Dataset> LoadIdxSplit(const SplitSource& source) {
  const std::string images_where = source.field + "[0]: " + source.paths[0] + ": ";
  const std::string labels_where = source.field + "[1]: " + source.paths[1] + ": ";
  const uint64_t decodable = DecodableIdxBytes();
  const ReadBound images_bound{kIdxImagesMagic, 3, decodable};
  StatusOr<FileBytes> image_bytes =
      ReadMaybeGzipFile(source.field + "[0]", source.paths[0], &images_bound);
  if (!image_bytes.ok()) return image_bytes.status();
  StatusOr<IdxImages> images = ParseIdxImages(images_where, *image_bytes);
  if (!images.ok()) return images.status();
  image_bytes = FileBytes();  // release the inflated bytes before the labels

  const ReadBound labels_bound{kIdxLabelsMagic, 1, decodable};
  StatusOr<FileBytes> label_bytes =
      ReadMaybeGzipFile(source.field + "[1]", source.paths[1], &labels_bound);
  if (!label_bytes.ok()) return label_bytes.status();
  StatusOr<std::vector<int32_t>> labels = ParseIdxLabels(labels_where, *label_bytes);
  if (!labels.ok()) return labels.status();

  if (static_cast<int64_t>(labels->size()) != images->count) {
    return InvalidArgumentError(source.field + ": " + source.paths[0] + " holds " +
                                std::to_string(images->count) + " images but " + source.paths[1] +
                                " holds " + std::to_string(labels->size()) + " labels");
  }
  Dataset dataset;
  dataset.num_samples = images->count;
  dataset.num_features = images->rows * images->cols;
  dataset.features = std::move(images->pixels);
  dataset.labels = std::move(*labels);
  dataset.description = "idx " + source.name + ": " + std::to_string(dataset.num_samples) + " x " +
                        std::to_string(dataset.num_features) + " (" + std::to_string(images->rows) +
                        "x" + std::to_string(images->cols) + ") from " + source.paths[0];
  return dataset;
}

bool IsBlank(const char* begin, const char* end) {
  for (const char* p = begin; p < end; ++p) {
    if (*p != ' ' && *p != '\t' && *p != '\r') return false;
  }
  return true;
}

// Parses rows "f1,...,fk,label". Features are stored unscaled; the caller applies the train
// split's scale once both splits are loaded.
StatusOr<Dataset> ParseCsv(const std::string& where, const std::vector<uint8_t>& bytes) {
  Dataset dataset;
  const char* const data = reinterpret_cast<const char*>(bytes.data());
  const char* const data_end = data + bytes.size();
  int64_t columns = 0;  // per row, including the label; set by the first data row
  int64_t first_row_line = 0;
  int64_t line_number = 0;
  for (const char* line = data; line < data_end;) {
    ++line_number;
    const char* line_end = static_cast<const char*>(std::memchr(line, '\n', data_end - line));
    if (line_end == nullptr) line_end = data_end;
    const char* next_line = line_end < data_end ? line_end + 1 : data_end;
    if (line_end > line && line_end[-1] == '\r') --line_end;
    if (IsBlank(line, line_end)) {
      line = next_line;
      continue;
    }
    const int64_t row_columns = 1 + std::count(line, line_end, ',');
    const std::string at_line = where + "line " + std::to_string(line_number);
    if (columns == 0) {
      if (row_columns < 2) {
        return InvalidArgumentError(at_line +
                                    ": 1 column; a row needs at least one feature and the label");
      }
      columns = row_columns;
      first_row_line = line_number;
    } else if (row_columns != columns) {
      return InvalidArgumentError(at_line + ": " + std::to_string(row_columns) +
                                  " columns, expected " + std::to_string(columns) +
                                  " (as on line " + std::to_string(first_row_line) + ")");
    }
    const char* cell = line;
    for (int64_t column = 1; column <= columns; ++column) {
      const char* cell_end = static_cast<const char*>(std::memchr(cell, ',', line_end - cell));
      if (cell_end == nullptr) cell_end = line_end;
      const char* begin = cell;
      const char* end = cell_end;
      while (begin < end && (*begin == ' ' || *begin == '\t')) ++begin;
      while (end > begin && (end[-1] == ' ' || end[-1] == '\t')) --end;
      if (begin < end && *begin == '+') ++begin;  // from_chars rejects a leading '+'
      const std::string at_cell = at_line + ", column " + std::to_string(column);
      if (begin == end) return InvalidArgumentError(at_cell + ": empty cell");
      double value = 0;
      const auto [parsed_end, parse_error] = std::from_chars(begin, end, value);
      if (parse_error != std::errc() || parsed_end != end || !std::isfinite(value)) {
        return InvalidArgumentError(at_cell + ": not a finite number: \"" +
                                    std::string(cell, cell_end) + "\"");
      }
      if (column < columns) {
        dataset.features.push_back(static_cast<float>(value));
      } else {
        if (value < 0 || value > kMaxCsvLabel || value != std::floor(value)) {
          return InvalidArgumentError(
              at_cell + ": the label (last column) must be an integer in [0, " +
              std::to_string(kMaxCsvLabel) + "], got \"" + std::string(cell, cell_end) + "\"");
        }
        dataset.labels.push_back(static_cast<int32_t>(value));
      }
      cell = cell_end + 1;
    }
    line = next_line;
  }
  if (columns == 0) return InvalidArgumentError(where + "no data rows");
  dataset.num_samples = static_cast<int64_t>(dataset.labels.size());
  dataset.num_features = columns - 1;
  return dataset;
}

StatusOr<Dataset> LoadCsvSplit(const SplitSource& source) {
  const std::string field = source.field + "[0]";
  StatusOr<FileBytes> file = ReadMaybeGzipFile(field, source.paths[0]);
  if (!file.ok()) return file.status();
  StatusOr<Dataset> dataset = ParseCsv(field + ": " + source.paths[0] + ": ", file->bytes);
  if (!dataset.ok()) return dataset.status();
  dataset->description = "csv " + source.name + ": " + std::to_string(dataset->num_samples) +
                         " x " + std::to_string(dataset->num_features) + " from " + source.paths[0];
  return dataset;
}

StatusOr<SplitSource> ResolveSplit(const spec::TrainingJob& job, const std::string& name,
                                   const std::vector<std::string>& uris) {
  const spec::DataSpec& data = job.spec.trainer->data;
  SplitSource source;
  source.name = name;
  source.field = "spec.trainer.data." + name;
  const size_t wanted = data.format == spec::DataFormat::kIdx ? 2 : 1;
  if (uris.size() != wanted) {
    return InvalidArgumentError(
        source.field + ": format " + spec::ToString(data.format) + " needs " +
        (wanted == 2 ? std::string("2 files [images, labels]") : std::string("1 file")) + ", got " +
        std::to_string(uris.size()));
  }
  for (size_t i = 0; i < uris.size(); ++i) {
    StatusOr<std::string> path =
        ResolveLocalDataPath(job, source.field + "[" + std::to_string(i) + "]", uris[i]);
    if (!path.ok()) return path.status();
    source.paths.push_back(std::move(*path));
  }
  return source;
}

// Loads one split; `source` receives the resolved files when resolution succeeded.
StatusOr<Dataset> LoadSplit(const spec::TrainingJob& job, const std::string& name,
                            const std::vector<std::string>& uris, SplitSource* source) {
  StatusOr<SplitSource> resolved = ResolveSplit(job, name, uris);
  if (!resolved.ok()) return resolved.status();
  *source = std::move(*resolved);
  return job.spec.trainer->data.format == spec::DataFormat::kIdx ? LoadIdxSplit(*source)
                                                                 : LoadCsvSplit(*source);
}

// Settles what depends on both splits: num_classes, the CSV scale, and the test split's
// agreement with the train split.
Status ReconcileSplits(const spec::TrainingJob& job, Dataset& train, Dataset* test,
                       const SplitSource& test_source) {
  const spec::DataSpec& data = job.spec.trainer->data;
  int32_t max_label = 0;
  for (int32_t label : train.labels) max_label = std::max(max_label, label);
  train.num_classes = max_label + 1;

  if (data.format == spec::DataFormat::kCsv) {
    float max_magnitude = 0;
    for (float value : train.features) max_magnitude = std::max(max_magnitude, std::fabs(value));
    const float divisor = max_magnitude > 0 ? max_magnitude : 1.0f;
    for (float& value : train.features) value /= divisor;
    if (test != nullptr) {
      for (float& value : test->features) value /= divisor;
    }
    const std::string scale_note = " (features divided by " + std::to_string(divisor) + ")";
    train.description += scale_note;
    if (test != nullptr) test->description += scale_note;
  }
  if (test == nullptr) return OkStatus();

  test->num_classes = train.num_classes;
  const std::string test_where = "spec.trainer.data.test[0]: " + test_source.paths[0] + ": ";
  const std::string labels_where = data.format == spec::DataFormat::kIdx
                                       ? "spec.trainer.data.test[1]: " + test_source.paths[1] + ": "
                                       : test_where;
  for (int64_t i = 0; i < test->num_samples; ++i) {
    if (test->labels[i] >= train.num_classes) {
      return InvalidArgumentError(labels_where + "label " + std::to_string(test->labels[i]) +
                                  " of sample " + std::to_string(i) +
                                  " is out of range: the train split has " +
                                  std::to_string(train.num_classes) + " classes (labels 0.." +
                                  std::to_string(train.num_classes - 1) + ")");
    }
  }
  return OkStatus();
}

Status RequireTrainer(const spec::TrainingJob& job) {
  if (!job.spec.trainer.has_value()) {
    return FailedPreconditionError(
        "spec.trainer: not set; only the built-in trainer has data sets");
  }
  return OkStatus();
}

}  // namespace

StatusOr<DataSplits> LoadDatasets(const spec::TrainingJob& job) {
  if (Status status = RequireTrainer(job); !status.ok()) return status;
  const spec::DataSpec& data = job.spec.trainer->data;
  SplitSource train_source;
  SplitSource test_source;
  StatusOr<Dataset> train = LoadSplit(job, "train", data.train, &train_source);
  if (!train.ok()) return train.status();
  DataSplits splits;
  splits.train = std::move(*train);
  if (!data.test.empty()) {
    StatusOr<Dataset> test = LoadSplit(job, "test", data.test, &test_source);
    if (!test.ok()) return test.status();
    splits.test = std::move(*test);
  }
  Status reconciled =
      ReconcileSplits(job, splits.train, splits.test ? &*splits.test : nullptr, test_source);
  if (!reconciled.ok()) return reconciled;
  return splits;
}

Status CheckDatasets(const spec::TrainingJob& job, DataShape* shape) {
  if (Status status = RequireTrainer(job); !status.ok()) return status;
  const spec::DataSpec& data = job.spec.trainer->data;
  SplitSource train_source;
  SplitSource test_source;
  StatusOr<Dataset> train = LoadSplit(job, "train", data.train, &train_source);
  std::optional<StatusOr<Dataset>> test;
  if (!data.test.empty()) test = LoadSplit(job, "test", data.test, &test_source);

  Status first_error;
  std::string messages;
  auto note = [&](const Status& status) {
    if (status.ok()) return;
    if (first_error.ok()) first_error = status;
    if (!messages.empty()) messages += "\n";
    messages += status.message();
  };
  note(train.status());
  if (test) note(test->status());
  if (first_error.ok()) {
    note(ReconcileSplits(job, *train, test ? &**test : nullptr, test_source));
  }
  if (!first_error.ok()) return Status(first_error.code(), messages);
  if (shape != nullptr) {
    shape->train_samples = train->num_samples;
    shape->test_samples = test ? (*test)->num_samples : 0;
    shape->features = train->num_features;
    shape->classes = train->num_classes;
  }
  return OkStatus();
}

void GatherBatch(const Dataset& dataset, const int64_t* ids, int64_t count, float* features_out,
                 int32_t* labels_out) {
  const int64_t width = dataset.num_features;
  const float* features = dataset.features.data();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = ids[i];
    assert(id >= 0 && id < dataset.num_samples);
    std::memcpy(features_out + i * width, features + id * width, sizeof(float) * width);
    labels_out[i] = dataset.labels[id];
  }
}

}  // namespace lockstep::trainer

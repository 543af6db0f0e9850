#include "worker/checkpoint/storage/storage.h"

#include "worker/checkpoint/storage/local/local_storage.h"
#include "worker/checkpoint/storage/webhdfs/webhdfs_storage.h"

namespace lockstep::checkpoint {

Status Storage::WritePieces(const std::string& path, const std::vector<std::string_view>& pieces,
                            const WriteOptions& options, Deadline deadline) {
  size_t total_bytes = 0;
  for (std::string_view piece : pieces) total_bytes += piece.size();
  std::string joined;
  joined.reserve(total_bytes);
  for (std::string_view piece : pieces) joined.append(piece);
  return Write(path, joined, options, deadline);
}
namespace {

std::string NormalizePath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

StatusOr<StorageUri> ParseStorageUri(const std::string& uri) {
  StorageUri parsed;
  parsed.uri = uri;
  if (!uri.empty() && uri[0] == '/') {
    parsed.scheme = "file";
    parsed.path = NormalizePath(uri);
    return parsed;
  }
  const size_t scheme_end = uri.find("://");
  if (scheme_end == std::string::npos) {
    return InvalidArgumentError("storage URI '" + uri +
                                "': expected file:///path, hdfs://host:port/path or an absolute "
                                "path");
  }
  parsed.scheme = uri.substr(0, scheme_end);
  const std::string rest = uri.substr(scheme_end + 3);
  const size_t path_start = rest.find('/');
  parsed.authority = rest.substr(0, path_start);
  parsed.path = path_start == std::string::npos ? "/" : NormalizePath(rest.substr(path_start));
  if (parsed.scheme == "file") {
    if (!parsed.authority.empty() && parsed.authority != "localhost") {
      return InvalidArgumentError("storage URI '" + uri +
                                  "': file URIs name no host (file:///abs/path)");
    }
    parsed.authority.clear();
    return parsed;
  }
  if (parsed.scheme == "hdfs" || parsed.scheme == "webhdfs") {
    const size_t colon = parsed.authority.rfind(':');
    if (parsed.authority.empty() || colon == std::string::npos || colon == 0 ||
        colon + 1 == parsed.authority.size() ||
        parsed.authority.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return InvalidArgumentError("storage URI '" + uri +
                                  "': expected host:port of the namenode's HTTP endpoint");
    }
    return parsed;
  }
  return InvalidArgumentError("storage URI '" + uri + "': unsupported scheme '" + parsed.scheme +
                              "' (file, hdfs, webhdfs)");
}

StatusOr<std::unique_ptr<Storage>> OpenStorage(const std::string& uri,
                                               const StorageOptions& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(StorageUri parsed, ParseStorageUri(uri));
  if (parsed.scheme == "file") return std::unique_ptr<Storage>(new LocalStorage());
  return CreateWebHdfsStorage(parsed.authority, options);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string ParentPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace lockstep::checkpoint

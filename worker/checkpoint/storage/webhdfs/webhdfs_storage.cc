#include "worker/checkpoint/storage/webhdfs/webhdfs_storage.h"

#include <cpprest/http_client.h>
#include <cpprest/rawptrstream.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/logging.h"

namespace lockstep::checkpoint {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::methods;
using web::http::status_codes;
using web::http::client::http_client;
using web::http::client::http_client_config;

struct HttpResult {
  int status = 0;
  std::string location;
  std::vector<uint8_t> body;
};

std::string BodyText(const HttpResult& result) {
  return std::string(result.body.begin(), result.body.end());
}

// One HTTP request, bounded by min(request timeout, deadline); never throws. `base_url` is
// scheme://host:port and `resource` the encoded path and query.
StatusOr<HttpResult> Exchange(const std::string& base_url, const web::http::method& method,
                              const std::string& resource, const std::string_view* body,
                              int64_t request_timeout_ms, Deadline deadline,
                              const std::string& what) {
  const int64_t timeout_ms = std::min(request_timeout_ms, deadline.remaining_ms());
  if (timeout_ms <= 0) return DeadlineExceededError(what + ": deadline passed");
  http_client_config config;
  config.set_timeout(std::chrono::milliseconds(timeout_ms));
  config.set_max_redirects(0);  // the 307s of CREATE and OPEN are ours to follow
  auto promise = std::make_shared<std::promise<StatusOr<HttpResult>>>();
  std::future<StatusOr<HttpResult>> future = promise->get_future();
  pplx::cancellation_token_source cancel;
  std::unique_ptr<http_client> client;
  try {
    client = std::make_unique<http_client>(utility::conversions::to_string_t(base_url), config);
    http_request request(method);
    request.set_request_uri(utility::conversions::to_string_t(resource));
    if (body != nullptr) {
      // Streams straight from the caller's buffer, which outlives the request (we wait below).
      concurrency::streams::rawptr_buffer<uint8_t> buffer(
          reinterpret_cast<const uint8_t*>(body->data()), body->size());
      request.set_body(concurrency::streams::istream(buffer), body->size(),
                       "application/octet-stream");
    }
    client->request(request, cancel.get_token())
        .then([](http_response response) {
          return response.extract_vector().then(
              [response](pplx::task<std::vector<unsigned char>> body) {
                std::vector<unsigned char> bytes;
                try {
                  bytes = body.get();
                } catch (const pplx::task_canceled&) {
                  throw;
                } catch (const std::exception& e) {
                  // The headers came; the body did not, in full.
                  throw std::runtime_error(std::string("transfer cut short: ") + e.what());
                }
                HttpResult result;
                result.status = response.status_code();
                const auto& headers = response.headers();
                auto location = headers.find("Location");
                if (location != headers.end()) result.location = location->second;
                const utility::size64_t declared = headers.content_length();
                if (headers.has("Content-Length") && declared != bytes.size()) {
                  throw std::runtime_error("transfer cut short: received " +
                                           std::to_string(bytes.size()) + " of " +
                                           std::to_string(declared) + " bytes");
                }
                result.body.assign(bytes.begin(), bytes.end());
                return result;
              });
        })
        .then([promise, what](pplx::task<HttpResult> task) {
          try {
            promise->set_value(task.get());
          } catch (const pplx::task_canceled&) {
            promise->set_value(DeadlineExceededError(what + ": deadline passed"));
          } catch (const web::http::http_exception& e) {
            promise->set_value(UnavailableError(what + ": " + e.what()));
          } catch (const std::exception& e) {
            promise->set_value(UnavailableError(what + ": " + e.what()));
          }
        });
  } catch (const std::exception& e) {
    // Bad URIs and the like are thrown synchronously by the constructors.
    return InvalidArgumentError(what + ": " + e.what());
  }
  if (future.wait_until(deadline.at()) == std::future_status::timeout) {
    cancel.cancel();
    future.wait();  // cancellation ends the request promptly; nothing may outlive `client`
    return DeadlineExceededError(what + ": deadline passed during the request");
  }
  return future.get();
}

StatusCode CodeForException(const std::string& exception, int http_status) {
  if (exception == "FileNotFoundException") return StatusCode::kNotFound;
  if (exception == "FileAlreadyExistsException") return StatusCode::kAlreadyExists;
  if (exception == "AccessControlException" || exception == "SecurityException" ||
      exception == "AuthorizationException") {
    return StatusCode::kPermissionDenied;
  }
  if (exception == "IllegalArgumentException" || exception == "UnsupportedOperationException" ||
      exception == "InvalidPathException") {
    return StatusCode::kInvalidArgument;
  }
  if (exception == "PathIsNotEmptyDirectoryException" ||
      exception == "ParentNotDirectoryException") {
    return StatusCode::kFailedPrecondition;
  }
  if (exception == "StandbyException" || exception == "RetriableException" ||
      exception == "SafeModeException" || exception == "ConnectException" ||
      exception == "SocketTimeoutException" || http_status >= 500) {
    return StatusCode::kUnavailable;
  }
  if (!exception.empty()) return StatusCode::kUnknown;
  switch (http_status) {
    case 400:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    default:
      return StatusCode::kUnknown;
  }
}

// The Status for a response that is not the one expected.
Status ErrorFromResponse(const HttpResult& result, const std::string& what) {
  const nlohmann::json json = nlohmann::json::parse(result.body, nullptr, false);
  std::string exception;
  std::string message;
  if (json.is_object() && json.contains("RemoteException") && json["RemoteException"].is_object()) {
    const nlohmann::json& remote = json["RemoteException"];
    exception = remote.value("exception", std::string());
    message = remote.value("message", std::string());
  }
  std::string text = what + ": ";
  if (!exception.empty()) {
    text += exception + ": " + message;
  } else {
    std::string body = BodyText(result);
    if (body.size() > 200) body = body.substr(0, 200) + "...";
    text += "unexpected HTTP " + std::to_string(result.status) + (body.empty() ? "" : ": " + body);
  }
  return Status(CodeForException(exception, result.status),
                text + " (HTTP " + std::to_string(result.status) + ")");
}

StatusOr<nlohmann::json> ParseJsonBody(const HttpResult& result, const std::string& what) {
  nlohmann::json json = nlohmann::json::parse(result.body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return UnavailableError(what + ": response is not a JSON object");
  }
  return json;
}

StatusOr<bool> BooleanResult(const HttpResult& result, const std::string& what) {
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonBody(result, what));
  if (!json.contains("boolean") || !json["boolean"].is_boolean()) {
    return UnavailableError(what + ": response has no \"boolean\"");
  }
  return json["boolean"].get<bool>();
}

FileInfo InfoFromFileStatus(const nlohmann::json& status) {
  FileInfo info;
  info.name = status.value("pathSuffix", std::string());
  info.is_dir = status.value("type", std::string()) == "DIRECTORY";
  info.size_bytes = status.value("length", int64_t{0});
  info.modification_time_ms = status.value("modificationTime", int64_t{0});
  return info;
}

// Splits "http://dn:9864/webhdfs/v1/x?op=OPEN&..." into the base URL and the resource.
StatusOr<std::pair<std::string, std::string>> SplitLocation(const std::string& location,
                                                            const std::string& what) {
  try {
    web::uri uri(utility::conversions::to_string_t(location));
    if (uri.scheme() != "http" && uri.scheme() != "https") {
      return UnavailableError(what + ": redirect to unsupported location '" + location + "'");
    }
    return std::make_pair(utility::conversions::to_utf8string(uri.authority().to_string()),
                          utility::conversions::to_utf8string(uri.resource().to_string()));
  } catch (const std::exception& e) {
    return UnavailableError(what + ": bad redirect location '" + location + "': " + e.what());
  }
}

// The two-step operations (CREATE, OPEN): the namenode answers 307 with a datanode's Location
// (redirects are never followed automatically: the data must not go to the namenode), then the
// request, with `body`, goes to that datanode. Returns the datanode's response; the caller checks
// its status.
StatusOr<HttpResult> ExchangeThroughDatanode(const std::string& namenode_url,
                                             const web::http::method& method,
                                             const std::string& resource,
                                             const std::string_view* body,
                                             int64_t request_timeout_ms, Deadline deadline,
                                             const std::string& what) {
  LOCKSTEP_ASSIGN_OR_RETURN(HttpResult redirect, Exchange(namenode_url, method, resource, nullptr,
                                                          request_timeout_ms, deadline, what));
  if (redirect.status != status_codes::TemporaryRedirect) {
    return ErrorFromResponse(redirect, what);
  }
  if (redirect.location.empty()) return UnavailableError(what + ": 307 without Location");
  LOCKSTEP_ASSIGN_OR_RETURN(auto datanode, SplitLocation(redirect.location, what));
  return Exchange(datanode.first, method, datanode.second, body, request_timeout_ms, deadline,
                  what);
}

std::string DefaultUser() {
  const char* user = std::getenv("USER");
  return user != nullptr && *user != '\0' ? user : "root";
}

// Runs `attempt` until it returns anything but UNAVAILABLE, backing off exponentially with
// jitter, and never past `deadline`. Running out of time names the last retried error, whether
// the deadline passed between attempts or during one.
Status RetryUnavailable(const StorageOptions& options, Deadline deadline, const std::string& what,
                        const std::function<Status()>& attempt) {
  thread_local std::mt19937_64 random(std::random_device{}());
  int64_t backoff_ms = std::max<int64_t>(1, options.retry_initial_backoff_ms);
  Status last_retried;
  for (int attempts = 1;; ++attempts) {
    Status status = attempt();
    if (status.code() == StatusCode::kDeadlineExceeded && !last_retried.ok()) {
      return DeadlineExceededError(std::string(status.message()) + " (attempt " +
                                   std::to_string(attempts) + "); last error before it: " +
                                   last_retried.ToString());
    }
    if (status.code() != StatusCode::kUnavailable) return status;
    last_retried = status;
    std::uniform_int_distribution<int64_t> jitter(backoff_ms / 2, backoff_ms);
    const int64_t pause_ms = jitter(random);
    if (deadline.remaining_ms() <= pause_ms) {
      return DeadlineExceededError(what + ": deadline passed after " + std::to_string(attempts) +
                                   " attempt(s); last error: " + status.ToString());
    }
    LOCKSTEP_LOG(DEBUG) << status.ToString() << "; retrying in " << pause_ms << " ms";
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    backoff_ms = std::min(backoff_ms * 2, std::max<int64_t>(1, options.retry_max_backoff_ms));
  }
}

std::string EncodeQueryValue(const std::string& value) {
  return utility::conversions::to_utf8string(
      web::uri::encode_data_string(utility::conversions::to_string_t(value)));
}

}  // namespace

WebHdfsStorage::WebHdfsStorage(std::string namenode, StorageOptions options)
    : namenode_(std::move(namenode)),
      namenode_url_("http://" + namenode_),
      options_(std::move(options)) {
  if (options_.user.empty()) options_.user = DefaultUser();
}

std::string WebHdfsStorage::NamenodeResource(const std::string& path, const std::string& op,
                                             const std::string& extra) const {
  const std::string encoded_path = utility::conversions::to_utf8string(
      web::uri::encode_uri(utility::conversions::to_string_t(path), web::uri::components::path));
  return "/webhdfs/v1" + encoded_path + "?op=" + op +
         "&user.name=" + EncodeQueryValue(options_.user) + extra;
}

Status WebHdfsStorage::Write(const std::string& path, std::string_view bytes,
                             const WriteOptions& options, Deadline deadline) {
  const std::string what = "webhdfs CREATE " + path;
  const std::string resource = NamenodeResource(
      path, "CREATE", std::string("&overwrite=") + (options.overwrite ? "true" : "false"));
  return RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult created,
                              ExchangeThroughDatanode(namenode_url_, methods::PUT, resource, &bytes,
                                                      options_.request_timeout_ms, deadline, what));
    if (created.status != status_codes::Created) return ErrorFromResponse(created, what);
    return OkStatus();
  });
}

StatusOr<std::vector<uint8_t>> WebHdfsStorage::Read(const std::string& path, int64_t offset,
                                                    int64_t length, Deadline deadline) {
  const std::string what = "webhdfs OPEN " + path;
  if (offset < 0) return InvalidArgumentError(what + ": negative offset");
  std::string extra = "&offset=" + std::to_string(offset);
  if (length >= 0) extra += "&length=" + std::to_string(length);
  const std::string resource = NamenodeResource(path, "OPEN", extra);
  std::vector<uint8_t> bytes;
  Status status = RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(
        HttpResult data, ExchangeThroughDatanode(namenode_url_, methods::GET, resource, nullptr,
                                                 options_.request_timeout_ms, deadline, what));
    if (data.status != status_codes::OK) return ErrorFromResponse(data, what);
    if (length >= 0 && static_cast<int64_t>(data.body.size()) > length) {
      return DataLossError(what + ": datanode sent " + std::to_string(data.body.size()) +
                           " bytes for a request of " + std::to_string(length));
    }
    bytes = std::move(data.body);
    return OkStatus();
  });
  if (!status.ok()) return status;
  return bytes;
}

StatusOr<FileInfo> WebHdfsStorage::Stat(const std::string& path, Deadline deadline) {
  const std::string what = "webhdfs GETFILESTATUS " + path;
  const std::string resource = NamenodeResource(path, "GETFILESTATUS", "");
  FileInfo info;
  Status status = RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult result,
                              Exchange(namenode_url_, methods::GET, resource, nullptr,
                                       options_.request_timeout_ms, deadline, what));
    if (result.status != status_codes::OK) return ErrorFromResponse(result, what);
    LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonBody(result, what));
    if (!json.contains("FileStatus") || !json["FileStatus"].is_object()) {
      return UnavailableError(what + ": response has no FileStatus");
    }
    info = InfoFromFileStatus(json["FileStatus"]);
    info.name = path == "/" ? "" : BaseName(path);
    return OkStatus();
  });
  if (!status.ok()) return status;
  return info;
}

StatusOr<std::vector<FileInfo>> WebHdfsStorage::List(const std::string& dir, Deadline deadline) {
  const std::string what = "webhdfs LISTSTATUS " + dir;
  const std::string resource = NamenodeResource(dir, "LISTSTATUS", "");
  std::vector<FileInfo> entries;
  Status status = RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult result,
                              Exchange(namenode_url_, methods::GET, resource, nullptr,
                                       options_.request_timeout_ms, deadline, what));
    if (result.status != status_codes::OK) return ErrorFromResponse(result, what);
    LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonBody(result, what));
    const nlohmann::json* statuses = nullptr;
    if (json.contains("FileStatuses") && json["FileStatuses"].is_object() &&
        json["FileStatuses"].contains("FileStatus") &&
        json["FileStatuses"]["FileStatus"].is_array()) {
      statuses = &json["FileStatuses"]["FileStatus"];
    }
    if (statuses == nullptr) return UnavailableError(what + ": response has no FileStatuses");
    entries.clear();
    for (const nlohmann::json& entry : *statuses) {
      FileInfo info = InfoFromFileStatus(entry);
      // LISTSTATUS of a file answers with the file itself under an empty suffix.
      if (info.name.empty()) return FailedPreconditionError(what + ": not a directory");
      entries.push_back(std::move(info));
    }
    return OkStatus();
  });
  if (!status.ok()) return status;
  std::sort(entries.begin(), entries.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  return entries;
}

Status WebHdfsStorage::MakeDirs(const std::string& path, Deadline deadline) {
  const std::string what = "webhdfs MKDIRS " + path;
  const std::string resource = NamenodeResource(path, "MKDIRS", "");
  return RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult result,
                              Exchange(namenode_url_, methods::PUT, resource, nullptr,
                                       options_.request_timeout_ms, deadline, what));
    if (result.status != status_codes::OK) return ErrorFromResponse(result, what);
    LOCKSTEP_ASSIGN_OR_RETURN(bool made, BooleanResult(result, what));
    if (!made) return FailedPreconditionError(what + ": the namenode answered false");
    return OkStatus();
  });
}

Status WebHdfsStorage::Rename(const std::string& src, const std::string& dst, Deadline deadline) {
  const std::string what = "webhdfs RENAME " + src + " to " + dst;
  // HDFS would move src into an existing directory dst; our contract is to refuse.
  StatusOr<FileInfo> existing = Stat(dst, deadline);
  if (existing.ok()) return AlreadyExistsError(what + ": destination exists");
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  const std::string resource =
      NamenodeResource(src, "RENAME", "&destination=" + EncodeQueryValue(dst));
  bool renamed = false;
  LOCKSTEP_RETURN_IF_ERROR(RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult result,
                              Exchange(namenode_url_, methods::PUT, resource, nullptr,
                                       options_.request_timeout_ms, deadline, what));
    if (result.status != status_codes::OK) return ErrorFromResponse(result, what);
    LOCKSTEP_ASSIGN_OR_RETURN(renamed, BooleanResult(result, what));
    return OkStatus();
  }));
  if (renamed) return OkStatus();
  // {"boolean": false} says no more than "refused": find the reason for the caller.
  StatusOr<FileInfo> source = Stat(src, deadline);
  if (source.status().code() == StatusCode::kNotFound) {
    return NotFoundError(what + ": rename refused (boolean false): source does not exist");
  }
  StatusOr<FileInfo> parent = Stat(ParentPath(dst), deadline);
  if (parent.status().code() == StatusCode::kNotFound) {
    return NotFoundError(what + ": rename refused (boolean false): destination's parent " +
                         ParentPath(dst) + " does not exist");
  }
  if (Stat(dst, deadline).ok()) {
    return AlreadyExistsError(what + ": rename refused (boolean false): destination exists");
  }
  return FailedPreconditionError(what + ": rename refused by the namenode (boolean false)");
}

Status WebHdfsStorage::Delete(const std::string& path, bool recursive, Deadline deadline) {
  const std::string what = "webhdfs DELETE " + path;
  const std::string resource =
      NamenodeResource(path, "DELETE", std::string("&recursive=") + (recursive ? "true" : "false"));
  bool deleted = false;
  LOCKSTEP_RETURN_IF_ERROR(RetryUnavailable(options_, deadline, what, [&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpResult result,
                              Exchange(namenode_url_, methods::DEL, resource, nullptr,
                                       options_.request_timeout_ms, deadline, what));
    if (result.status != status_codes::OK) return ErrorFromResponse(result, what);
    LOCKSTEP_ASSIGN_OR_RETURN(deleted, BooleanResult(result, what));
    return OkStatus();
  }));
  // HDFS answers false for a path that does not exist.
  if (!deleted) return NotFoundError(what + ": nothing deleted (boolean false): no such path");
  return OkStatus();
}

StatusOr<std::unique_ptr<Storage>> CreateWebHdfsStorage(const std::string& namenode,
                                                        const StorageOptions& options) {
  return std::unique_ptr<Storage>(new WebHdfsStorage(namenode, options));
}

}  // namespace lockstep::checkpoint

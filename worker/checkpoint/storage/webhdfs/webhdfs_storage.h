// WebHdfsStorage: Storage over Hadoop's WebHDFS REST API (hdfs:// and webhdfs:// URIs), through
// cpprestsdk.
//
// Requests go to http://<namenode>/webhdfs/v1/<path>?op=...&user.name=<user>. The protocol details
// that matter:
//  - CREATE and OPEN are two requests. The namenode answers 307 Temporary Redirect with a datanode
//    URL in Location; the client sends (CREATE: PUT with the data, 201 Created) or fetches (OPEN:
//    GET, 200 with the bytes) there. cpprestsdk is configured never to follow redirects itself
//    (http_client_config::set_max_redirects(0)): an automatic follow would replay a PUT without
//    its body semantics under our control and hide which node failed.
//  - RENAME and DELETE report refusal as 200 {"boolean": false}, not as an HTTP error; Rename maps
//    that to NOT_FOUND / ALREADY_EXISTS / FAILED_PRECONDITION after asking the namenode why.
//    HDFS moves a source *into* an existing destination directory; Storage::Rename must fail
//    instead, so Rename checks that the destination is absent first. That check and the rename
//    are two requests: a concurrent creator of `dst` in between is not detected. Checkpoints have
//    one renamer per directory (rank 0), so this does not arise there.
//  - Errors arrive as {"RemoteException": {"exception", "javaClassName", "message"}}. The
//    exception maps to NOT_FOUND (FileNotFoundException), ALREADY_EXISTS
//    (FileAlreadyExistsException), PERMISSION_DENIED (AccessControlException, SecurityException),
//    INVALID_ARGUMENT (IllegalArgumentException, UnsupportedOperationException),
//    FAILED_PRECONDITION (PathIsNotEmptyDirectoryException, ParentNotDirectoryException) and
//    UNAVAILABLE (StandbyException, RetriableException, any 5xx, connection failures, a
//    transfer cut short); the server's message is kept.
//
// Retries: only UNAVAILABLE, with exponential back-off and jitter, until the call's deadline.
// Each HTTP request has its own timeout (StorageOptions::request_timeout_ms, never past the
// deadline) and is cancelled at the deadline. A retried CREATE repeats both steps.
//
// Thread-safe: calls share nothing but the immutable configuration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {

class WebHdfsStorage : public Storage {
 public:
  // `namenode` is host:port of the namenode's HTTP endpoint (dfs.namenode.http-address).
  WebHdfsStorage(std::string namenode, StorageOptions options);

  Status Write(const std::string& path, std::string_view bytes, const WriteOptions& options,
               Deadline deadline) override;
  StatusOr<std::vector<uint8_t>> Read(const std::string& path, int64_t offset, int64_t length,
                                      Deadline deadline) override;
  StatusOr<FileInfo> Stat(const std::string& path, Deadline deadline) override;
  StatusOr<std::vector<FileInfo>> List(const std::string& dir, Deadline deadline) override;
  Status MakeDirs(const std::string& path, Deadline deadline) override;
  // The namenode syncs its edit log before it answers: every acknowledged operation is durable.
  Status SyncDirectory(const std::string&, Deadline) override { return OkStatus(); }
  Status Rename(const std::string& src, const std::string& dst, Deadline deadline) override;
  Status Delete(const std::string& path, bool recursive, Deadline deadline) override;
  std::string Describe() const override { return "hdfs://" + namenode_; }

 private:
  // "/webhdfs/v1/<path>?op=<op>&user.name=<user><extra>"
  std::string NamenodeResource(const std::string& path, const std::string& op,
                               const std::string& extra) const;

  std::string namenode_;
  std::string namenode_url_;  // http://host:port
  StorageOptions options_;
};

StatusOr<std::unique_ptr<Storage>> CreateWebHdfsStorage(const std::string& namenode,
                                                        const StorageOptions& options);

}  // namespace lockstep::checkpoint

#!/usr/bin/env python3
"""A WebHDFS server for tests: a namenode and a datanode endpoint over a temporary directory.

It follows Hadoop's WebHDFS REST specification (hadoop-hdfs/WebHDFS.html) and the FileSystem
specification (hadoop-common/filesystem/filesystem.html) as the real servers implement them; it is
not shaped to any one client:

  * Separate listeners (ports) for the namenode and the datanode.
  * CREATE: the namenode answers the first PUT with 307 and a Location on the datanode carrying
    the parameters a real namenode adds (namenoderpcaddress, createparent, overwrite); the datanode
    refuses a request without namenoderpcaddress (400 IllegalArgumentException), creates the file
    (parents included) when the data arrives and answers 201 Created with a webhdfs:// Location.
    As in HDFS, the file is visible (growing) while it is being written, and it is the datanode
    that reports FileAlreadyExistsException (overwrite=false) or a directory in the way.
  * OPEN: 307 to the datanode with offset/length; the datanode answers 200 with the bytes.
  * GETFILESTATUS / LISTSTATUS: the FileStatus / FileStatuses JSON shapes. LISTSTATUS of a file
    lists the file itself with an empty pathSuffix, as HDFS does.
  * MKDIRS: {"boolean": true}; creating a directory where a file is: FileAlreadyExistsException, a
    file in the parent chain: ParentNotDirectoryException.
  * RENAME, FileSystem.rename semantics as HDFS implements them (filesystem.html, "rename"):
    {"boolean": false} when the source does not exist, the destination is an existing file, the
    destination's parent does not exist, or the destination lies inside the source; when the
    destination is an existing directory the source moves *into* it (dst/basename(src)), false if
    that name is taken. The destination must be absolute (400 IllegalArgumentException).
  * DELETE: {"boolean": false} for a path that does not exist (and for "/"); a non-empty
    directory without recursive=true: 403 PathIsNotEmptyDirectoryException.
  * Errors: {"RemoteException": {"exception", "javaClassName", "message"}} with the status codes of
    Hadoop's ExceptionHandler: 404 FileNotFoundException, 403 for IOExceptions and
    AccessControlException, 400 IllegalArgumentException, 401 SecurityException.
  * Authentication "simple" with anonymous access disabled: a request without user.name is
    refused with 401 SecurityException.

Fault injection and observation through a third, admin listener (GET or POST):
  /fault?target=namenode|datanode&kind=KIND[&count=N][&ms=T]
      unavailable  503 RetriableException for the next N requests, or for T ms
      reset        close the connection without a response (next N requests)
      refuse       close the listening socket for T ms (connection refused), then listen again
      truncate     datanode OPEN: send Content-Length in full, then only half the bytes, and close
      slow         delay the next N responses by T ms
  /deny?path=/p   AccessControlException for any operation on /p or below
  /log            the requests received, as JSON [{server, method, path, op, query}]
  /clear          forget the log, the faults and the denials

On start it prints one JSON line, {"namenode": P, "datanode": Q, "admin": R, "root": DIR}, on
stdout (ports chosen by the kernel). It exits when stdin is closed or on SIGTERM.
"""

import argparse
import json
import os
import posixpath
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JAVA_CLASSES = {
    "FileNotFoundException": "java.io.FileNotFoundException",
    "FileAlreadyExistsException": "org.apache.hadoop.fs.FileAlreadyExistsException",
    "AccessControlException": "org.apache.hadoop.security.AccessControlException",
    "SecurityException": "java.lang.SecurityException",
    "IllegalArgumentException": "java.lang.IllegalArgumentException",
    "PathIsNotEmptyDirectoryException": "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
    "ParentNotDirectoryException": "org.apache.hadoop.fs.ParentNotDirectoryException",
    "RetriableException": "org.apache.hadoop.ipc.RetriableException",
    "IOException": "java.io.IOException",
}


class RemoteError(Exception):
    def __init__(self, status, exception, message):
        super().__init__(message)
        self.status, self.exception, self.message = status, exception, message


class State:
    def __init__(self, root):
        self.root = root
        self.fs_root = os.path.join(root, "fs")
        os.makedirs(self.fs_root, exist_ok=True)
        self.lock = threading.Lock()  # namespace operations are atomic, as on a namenode
        self.log = []
        self.faults = {"namenode": {}, "datanode": {}}
        self.denied = []
        self.ports = {}
        self.servers = {}
        self.start_times = {"namenode": time.time() * 1000}

    def local(self, hdfs_path):
        if not hdfs_path.startswith("/"):
            raise RemoteError(400, "IllegalArgumentException", "Invalid path name " + hdfs_path)
        parts = [p for p in hdfs_path.split("/") if p]
        if any(p in (".", "..") or ":" in p for p in parts):
            raise RemoteError(400, "IllegalArgumentException", "Invalid path name " + hdfs_path)
        return os.path.join(self.fs_root, *parts) if parts else self.fs_root

    def check_access(self, hdfs_path, user, access):
        for denied in self.denied:
            if hdfs_path == denied or hdfs_path.startswith(denied.rstrip("/") + "/"):
                raise RemoteError(
                    403, "AccessControlException",
                    "Permission denied: user=%s, access=%s, inode=\"%s\":hdfs:supergroup:drwx------"
                    % (user, access, denied))

    def take_fault(self, target, kind):
        """Returns the fault's parameters when it applies to this request (and uses it up)."""
        with self.lock:
            fault = self.faults[target].get(kind)
            if fault is None:
                return None
            if fault.get("until") is not None:
                if time.monotonic() < fault["until"]:
                    return fault
                del self.faults[target][kind]
                return None
            if fault.get("count", 0) > 0:
                fault["count"] -= 1
                if fault["count"] == 0:
                    del self.faults[target][kind]
                return fault
            del self.faults[target][kind]
            return None


def file_status(path, name):
    st = os.stat(path)
    is_dir = os.path.isdir(path)
    return {
        "accessTime": 0 if is_dir else int(st.st_atime * 1000),
        "blockSize": 0 if is_dir else 134217728,
        "childrenNum": len(os.listdir(path)) if is_dir else 0,
        "fileId": st.st_ino,
        "group": "supergroup",
        "length": 0 if is_dir else st.st_size,
        "modificationTime": int(st.st_mtime * 1000),
        "owner": "hdfs",
        "pathSuffix": name,
        "permission": "755" if is_dir else "644",
        "replication": 0 if is_dir else 3,
        "storagePolicy": 0,
        "type": "DIRECTORY" if is_dir else "FILE",
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "WebHdfsTestServer/1.0"
    role = None  # "namenode" | "datanode"
    state = None

    def log_message(self, fmt, *args):  # keep the test's output clean
        pass

    # --- plumbing -------------------------------------------------------------------------
    def send_bytes(self, status, body, content_type="application/json", headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def send_json(self, status, obj):
        self.send_bytes(status, json.dumps(obj).encode())

    def send_remote_error(self, error):
        self.send_json(error.status, {"RemoteException": {
            "exception": error.exception,
            "javaClassName": JAVA_CLASSES.get(error.exception, "java.io.IOException"),
            "message": error.message}})

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(length) if length else b""

    def drop_connection(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self):
        self.dispatch("GET")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_POST(self):
        self.dispatch("POST")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        op = query.get("op", "").upper()
        self._body_read = True
        hdfs_path = urllib.parse.unquote(url.path)
        with self.state.lock:
            self.state.log.append({"server": self.role, "method": method, "path": hdfs_path,
                                   "op": op, "query": query})
        if self.state.take_fault(self.role, "reset"):
            self.drop_connection()
            return
        slow = self.state.take_fault(self.role, "slow")
        if slow:
            time.sleep(slow.get("ms", 0) / 1000.0)
        body = self.read_body() if method in ("PUT", "POST") and not (
            self.role == "datanode" and op == "CREATE") else None
        if self.state.take_fault(self.role, "unavailable"):
            self.send_remote_error(RemoteError(503, "RetriableException",
                                               "Server is not ready (injected fault)"))
            return
        prefix = "/webhdfs/v1"
        if not (hdfs_path == prefix or hdfs_path.startswith(prefix + "/")):
            self.send_bytes(404, b"Not Found", "text/plain")
            return
        hdfs_path = hdfs_path[len(prefix):] or "/"
        if len(hdfs_path) > 1:
            hdfs_path = hdfs_path.rstrip("/")
        try:
            if self.role == "namenode":
                self.namenode(method, op, hdfs_path, query)
            else:
                self.datanode(method, op, hdfs_path, query)
        except RemoteError as error:
            if self.role == "datanode" and op == "CREATE" and not getattr(self, "_body_read", True):
                self.read_body()  # keep the connection usable
            self.send_remote_error(error)

    # --- namenode -------------------------------------------------------------------------
    def namenode(self, method, op, path, query):
        user = query.get("user.name")
        if not user:
            raise RemoteError(401, "SecurityException",
                              "Failed to obtain user group information: "
                              "org.apache.hadoop.security.authentication.client."
                              "AuthenticationException: Anonymous requests are disallowed")
        allowed = {"GET": ("OPEN", "GETFILESTATUS", "LISTSTATUS"),
                   "PUT": ("CREATE", "MKDIRS", "RENAME"),
                   "DELETE": ("DELETE",), "POST": ()}
        if op not in allowed.get(method, ()):
            raise RemoteError(400, "IllegalArgumentException",
                              "Invalid value for webhdfs parameter \"op\": %s is not a valid %s "
                              "operation" % (op or "null", method))
        state = self.state
        local = state.local(path)
        datanode = "http://127.0.0.1:%d" % state.ports["datanode"]
        rpc = "127.0.0.1:%d" % state.ports["namenode"]
        quoted = urllib.parse.quote(path)
        if op == "OPEN":
            state.check_access(path, user, "READ")
            if not os.path.exists(local):
                raise RemoteError(404, "FileNotFoundException", "File does not exist: " + path)
            if os.path.isdir(local):
                raise RemoteError(404, "FileNotFoundException", "Path is not a file: " + path)
            params = {"op": "OPEN", "user.name": user, "namenoderpcaddress": rpc,
                      "offset": query.get("offset", "0")}
            if "length" in query:
                params["length"] = query["length"]
            location = "%s/webhdfs/v1%s?%s" % (datanode, quoted, urllib.parse.urlencode(params))
            self.send_bytes(307, b"", headers={"Location": location})
        elif op == "CREATE":
            state.check_access(path, user, "WRITE")
            overwrite = query.get("overwrite", "false")
            if overwrite not in ("true", "false"):
                raise RemoteError(400, "IllegalArgumentException",
                                  "Invalid value for webhdfs parameter \"overwrite\": " + overwrite)
            params = {"op": "CREATE", "user.name": user, "namenoderpcaddress": rpc,
                      "createflag": "", "createparent": "true", "overwrite": overwrite}
            location = "%s/webhdfs/v1%s?%s" % (datanode, quoted, urllib.parse.urlencode(params))
            self.send_bytes(307, b"", headers={"Location": location})
        elif op == "GETFILESTATUS":
            state.check_access(path, user, "READ")
            if not os.path.exists(local):
                raise RemoteError(404, "FileNotFoundException", "File does not exist: " + path)
            self.send_json(200, {"FileStatus": file_status(local, "")})
        elif op == "LISTSTATUS":
            state.check_access(path, user, "READ_EXECUTE")
            with state.lock:
                if not os.path.exists(local):
                    raise RemoteError(404, "FileNotFoundException",
                                      "File " + path + " does not exist.")
                if os.path.isdir(local):
                    entries = [file_status(os.path.join(local, name), name)
                               for name in sorted(os.listdir(local))]
                else:
                    entries = [file_status(local, "")]
            self.send_json(200, {"FileStatuses": {"FileStatus": entries}})
        elif op == "MKDIRS":
            state.check_access(path, user, "WRITE")
            with state.lock:
                self.check_parents_are_dirs(path)
                if os.path.exists(local) and not os.path.isdir(local):
                    raise RemoteError(403, "FileAlreadyExistsException",
                                      "Path is not a directory: " + path)
                os.makedirs(local, exist_ok=True)
            self.send_json(200, {"boolean": True})
        elif op == "RENAME":
            destination = query.get("destination", "")
            if not destination.startswith("/"):
                raise RemoteError(400, "IllegalArgumentException",
                                  "Invalid value for webhdfs parameter \"destination\": "
                                  "\"%s\" is not an absolute path" % destination)
            destination = posixpath.normpath(destination)
            state.check_access(path, user, "WRITE")
            state.check_access(destination, user, "WRITE")
            with state.lock:
                self.send_json(200, {"boolean": self.rename(path, destination)})
        elif op == "DELETE":
            state.check_access(path, user, "WRITE")
            recursive = query.get("recursive", "false")
            if recursive not in ("true", "false"):
                raise RemoteError(400, "IllegalArgumentException",
                                  "Invalid value for webhdfs parameter \"recursive\": " + recursive)
            with state.lock:
                if path == "/" or not os.path.exists(local):
                    self.send_json(200, {"boolean": False})
                    return
                if os.path.isdir(local):
                    if os.listdir(local) and recursive != "true":
                        raise RemoteError(403, "PathIsNotEmptyDirectoryException",
                                          "`%s is non empty': Directory is not empty" % path)
                    shutil.rmtree(local)
                else:
                    os.unlink(local)
            self.send_json(200, {"boolean": True})

    def check_parents_are_dirs(self, path):
        parent = posixpath.dirname(path)
        while parent not in ("/", ""):
            local = self.state.local(parent)
            if os.path.exists(local) and not os.path.isdir(local):
                raise RemoteError(403, "ParentNotDirectoryException",
                                  "%s (is not a directory)" % parent)
            parent = posixpath.dirname(parent)

    def rename(self, src, dst):
        state = self.state
        src_local, dst_local = state.local(src), state.local(dst)
        if src == "/" or not os.path.exists(src_local):
            return False
        if dst == src:
            return os.path.isfile(src_local)
        if dst.startswith(src.rstrip("/") + "/"):
            return False  # into itself
        if os.path.isdir(dst_local):
            # FileSystem.rename: an existing directory destination receives the source.
            dst = posixpath.join(dst, posixpath.basename(src))
            dst_local = state.local(dst)
            if os.path.exists(dst_local):
                return False
        elif os.path.exists(dst_local):
            return False
        elif not os.path.isdir(os.path.dirname(dst_local)):
            return False
        os.rename(src_local, dst_local)
        return True

    # --- datanode -------------------------------------------------------------------------
    def datanode(self, method, op, path, query):
        if not query.get("namenoderpcaddress"):
            if op == "CREATE":
                self._body_read = False
            raise RemoteError(400, "IllegalArgumentException",
                              "Invalid value for webhdfs parameter \"namenoderpcaddress\": "
                              "namenoderpcaddress is not set.")
        state = self.state
        local = state.local(path)
        if method == "PUT" and op == "CREATE":
            self._body_read = False
            with state.lock:
                self.check_parents_are_dirs(path)
                if os.path.isdir(local):
                    raise RemoteError(403, "FileAlreadyExistsException",
                                      "%s already exists as a directory" % path)
                if os.path.exists(local) and query.get("overwrite", "false") != "true":
                    raise RemoteError(403, "FileAlreadyExistsException",
                                      "%s for client %s already exists"
                                      % (path, self.client_address[0]))
                os.makedirs(os.path.dirname(local), exist_ok=True)
                handle = open(local, "wb")  # visible while being written, as in HDFS
            with handle:
                self._body_read = True
                length = int(self.headers.get("Content-Length", "0") or 0)
                chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
                if chunked:
                    handle.write(self.read_body())
                else:
                    left = length
                    while left > 0:
                        chunk = self.rfile.read(min(left, 1 << 20))
                        if not chunk:
                            raise RemoteError(400, "IOException", "premature end of request body")
                        handle.write(chunk)
                        left -= len(chunk)
            location = "webhdfs://127.0.0.1:%d%s" % (state.ports["namenode"], path)
            self.send_bytes(201, b"", headers={"Location": location})
        elif method == "GET" and op == "OPEN":
            if not os.path.isfile(local):
                raise RemoteError(404, "FileNotFoundException", "File does not exist: " + path)
            offset = int(query.get("offset", "0"))
            with open(local, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if offset > size:
                    raise RemoteError(403, "IOException",
                                      "Offset=%d out of the range [0, %d]" % (offset, size))
                handle.seek(offset)
                length = int(query["length"]) if "length" in query else size - offset
                data = handle.read(max(0, min(length, size - offset)))
            if state.take_fault("datanode", "truncate"):
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                self.drop_connection()
                return
            self.send_bytes(200, data, "application/octet-stream")
        else:
            raise RemoteError(400, "IllegalArgumentException",
                              "Invalid value for webhdfs parameter \"op\": " + op)


class AdminHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None
    restart = None

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0") or 0)
        if length:
            self.rfile.read(length)
        self.do_GET()

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        state = self.state
        if url.path == "/log":
            with state.lock:
                self.reply(200, list(state.log))
        elif url.path == "/clear":
            with state.lock:
                state.log.clear()
                state.faults = {"namenode": {}, "datanode": {}}
                state.denied.clear()
            self.reply(200, {"ok": True})
        elif url.path == "/deny":
            with state.lock:
                state.denied.append(query["path"])
            self.reply(200, {"ok": True})
        elif url.path == "/fault":
            target, kind = query.get("target", "namenode"), query["kind"]
            if target not in ("namenode", "datanode"):
                self.reply(400, {"error": "target"})
                return
            if kind == "refuse":
                AdminHandler.restart(target, int(query["ms"]))
            else:
                fault = {"count": int(query.get("count", "0")), "ms": int(query.get("ms", "0"))}
                if kind in ("unavailable",) and "count" not in query:
                    fault["until"] = time.monotonic() + fault["ms"] / 1000.0
                elif "count" not in query:
                    fault["count"] = 1
                with state.lock:
                    state.faults[target][kind] = fault
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": "unknown admin path"})


def make_server(role, state, port=0):
    handler = type(role.capitalize() + "Handler", (Handler,), {"role": role, "state": state})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="directory to keep the files in (default: a new temp dir)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="webhdfs-test-")
    state = State(root)
    for role in ("namenode", "datanode"):
        state.servers[role] = make_server(role, state)
        state.ports[role] = state.servers[role].server_address[1]
    restart_lock = threading.Lock()

    def refuse(role, ms):
        # Connection refused for `ms`: the listening socket is closed, then bound again.
        with restart_lock:
            server = state.servers[role]
            server.shutdown()
            server.server_close()

        def reopen():
            time.sleep(ms / 1000.0)
            with restart_lock:
                for _ in range(100):
                    try:
                        state.servers[role] = make_server(role, state, state.ports[role])
                        return
                    except OSError:
                        time.sleep(0.05)
        threading.Thread(target=reopen, daemon=True).start()

    AdminHandler.state = state
    AdminHandler.restart = staticmethod(refuse)
    admin = ThreadingHTTPServer(("127.0.0.1", 0), AdminHandler)
    admin.daemon_threads = True
    threading.Thread(target=admin.serve_forever, daemon=True).start()
    print(json.dumps({"namenode": state.ports["namenode"], "datanode": state.ports["datanode"],
                      "admin": admin.server_address[1], "root": root}), flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def watch_stdin():
        sys.stdin.read()
        done.set()
    threading.Thread(target=watch_stdin, daemon=True).start()
    while not done.wait(0.5):
        pass
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

// `lockstep ckpt`: inspect checkpoints from the command line.
//
//   lockstep ckpt ls URI [--checksums]   one line per checkpoint: step, valid/damaged, world size,
//                                        size, creation time (and the damage); sizes are checked,
//                                        checksums only with --checksums
//   lockstep ckpt verify URI [--step N]  checks the newest (or step N) with checksums
//
// URI: file:///abs/dir, an absolute path, or hdfs://namenode:port/dir (WebHDFS).
// Exit status: 0 valid (ls: listed), 1 damaged or storage error (message on `err`),
// 2 usage error or bad URI.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace lockstep::checkpoint {

// `args` are the words after "ckpt" ({"ls", "hdfs://nn:9870/ckpt"}). Blocks at most about
// LOCKSTEP_CKPT_TIMEOUT_MS (default 120000) for storage.
int RunCkptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace lockstep::checkpoint

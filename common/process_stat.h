// What /proc/<pid>/stat says about a process that a supervisor needs: its state and its parent.
//
//   if (auto stat = ReadProcessStat(pid); stat && stat->state == 'Z') { ...a zombie... }
//
// proc(5): "pid (comm) state ppid ...". comm may hold spaces and parentheses, so the fields are
// read after the last ')'.
#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

namespace lockstep {

struct ProcessStat {
  char state = 0;     // R, S, D, Z (zombie), X (dead), T, ...
  pid_t parent = -1;  // ppid
};

// nullopt when the process does not exist (or exited while it was read).
std::optional<ProcessStat> ReadProcessStat(pid_t pid);

struct ProcessEntry {
  pid_t pid = 0;
  ProcessStat stat;
};

// Every process visible in /proc, with its stat: a snapshot (a process that exits while the
// table is read is left out, one that starts may be).
std::vector<ProcessEntry> ProcessTable();

}  // namespace lockstep

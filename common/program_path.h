// Where a command's program is: the lookup execvp does, done before the fork so that a missing
// or unexecutable program is reported by name, not by a child's exit status.
//
//   StatusOr<std::string> program = ResolveProgram("python3", EnvString("PATH", "/usr/bin:/bin"));
#pragma once

#include <string>

#include "common/status.h"

namespace lockstep {

// `name` itself when it holds a '/', else the first entry of `path_env` (colon separated; an
// empty entry is the current directory) where it is an executable file; when none is
// executable, the first where it exists (so exec reports EACCES), else NotFound naming the PATH
// searched.
StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& path_env);

// Why exec of the existing file `path` failed with ENOENT, when the file itself is there: the
// interpreter its "#!" line names, or the loader its ELF header names (PT_INTERP), is missing
// from this filesystem (a script for a shell an image lacks, a glibc program in a musl image).
// "" when neither is the cause or the file cannot be read. Reads at most 4 KiB of the file.
std::string MissingInterpreter(const std::string& path);

}  // namespace lockstep

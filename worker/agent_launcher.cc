// lockstep-agent's entry in a user's own image (scripts/bundle/agent.sh installs it as
// bin/lockstep-agent, the agent itself beside it as bin/lockstep-agent-main).
//
// The agent runs on the bundle's own glibc and loader, so that nothing of the image is loaded
// into it. A loader still obeys the environment, though: LD_PRELOAD (PyTorch images often preload
// tcmalloc or jemalloc), LD_LIBRARY_PATH (CUDA images name their library folders), LD_AUDIT. What
// those name is built for the image's glibc, often newer than the bundle's 2.36, and loaded into
// the agent it stops it before main ("version `GLIBC_2.38' not found"). This program is linked
// statically: no loader reads the environment for it. It renames every LD_* variable to
// LOCKSTEP_IMAGE_LD_* and executes the agent with the same arguments; the agent gives them back,
// under their own names, to every program it starts (RestoreParkedLoaderVariables), so the
// user's command sees the image's environment unchanged.
//
// It uses nothing but the C library's environment and exec calls, so that a static link stays
// small (glibc's static NSS, the reason not to link the agent statically, is never reached).
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "worker/agent/parked_loader.h"

extern char** environ;

namespace {

constexpr char kAgent[] = "lockstep-agent-main";
// Where the bundle is when /proc is not mounted (scripts/bundle/agent.sh's default --prefix,
// which is where the operator mounts it).
constexpr char kAgentFallback[] = "/lockstep/bin/lockstep-agent-main";

int Fail(const char* what, const char* detail) {
  std::fprintf(stderr, "lockstep-agent: error: %s%s\n", what, detail);
  return 127;
}

}  // namespace

int main(int, char** argv) {
  // The agent beside this program: the folder /proc/self/exe names (kAgentFallback without /proc,
  // or where the path leaves no room for the agent's name).
  char path[PATH_MAX];
  const ssize_t room = static_cast<ssize_t>(sizeof(path) - sizeof(kAgent) - 1);
  const ssize_t size = readlink("/proc/self/exe", path, static_cast<size_t>(room));
  if (size > 0 && size < room) {
    path[size] = '\0';
    char* slash = std::strrchr(path, '/');
    if (slash == nullptr) return Fail("cannot tell the agent's folder from ", path);
    std::strcpy(slash + 1, kAgent);
  } else {
    std::strcpy(path, kAgentFallback);
  }

  // Park every LD_* variable (collected first: setenv and unsetenv change environ).
  int count = 0;
  for (char** entry = environ; *entry != nullptr; ++entry) ++count;
  char** loader = static_cast<char**>(std::calloc(static_cast<size_t>(count) + 1, sizeof(char*)));
  if (loader == nullptr) return Fail("out of memory", "");
  const size_t prefix_size = std::strlen(lockstep::agent::kLoaderVariablePrefix);
  int parked = 0;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, lockstep::agent::kLoaderVariablePrefix, prefix_size) == 0 &&
        std::strchr(*entry, '=') != nullptr) {
      loader[parked] = strdup(*entry);
      if (loader[parked] == nullptr) return Fail("out of memory", "");
      ++parked;
    }
  }
  for (int i = 0; i < parked; ++i) {
    char* equals = std::strchr(loader[i], '=');
    *equals = '\0';
    const char* name = loader[i];
    const char* value = equals + 1;
    char parked_name[256];
    if (std::snprintf(parked_name, sizeof(parked_name), "%s%s",
                      lockstep::agent::kParkedLoaderPrefix,
                      name) >= static_cast<int>(sizeof(parked_name))) {
      continue;  // no loader variable has such a name: the loader ignores it, so may the agent
    }
    if (setenv(parked_name, value, 1) != 0 || unsetenv(name) != 0) {
      return Fail("cannot move the environment variable ", name);
    }
  }
  execv(path, argv);
  return Fail("cannot execute ", path);
}

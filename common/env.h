// Tunables read from the environment, once, where they are used (NCCL's param.h is the model):
//
//   // Heartbeat period of a rendezvous member; smaller: faster failure detection, more RPCs.
//   LOCKSTEP_PARAM_INT(HeartbeatIntervalMs, "LOCKSTEP_HEARTBEAT_INTERVAL_MS", 200);
//   ... HeartbeatIntervalMs() ...
//
// A value that does not parse is reported once on stderr and the default is used.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace lockstep {

// The variable's value, or `fallback` when it is unset or empty.
std::string EnvString(const char* name, const std::string& fallback);
int64_t EnvInt(const char* name, int64_t fallback);
double EnvDouble(const char* name, double fallback);
// The variable's value, or NotFound/InvalidArgument naming the variable.
StatusOr<std::string> RequireEnv(const char* name);

}  // namespace lockstep

#define LOCKSTEP_PARAM_INT(function, env_name, default_value)                      \
  inline int64_t function() {                                                      \
    static const int64_t value = ::lockstep::EnvInt(env_name, (default_value));    \
    return value;                                                                  \
  }
#define LOCKSTEP_PARAM_DOUBLE(function, env_name, default_value)                   \
  inline double function() {                                                       \
    static const double value = ::lockstep::EnvDouble(env_name, (default_value));  \
    return value;                                                                  \
  }

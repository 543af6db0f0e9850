// Base64 (RFC 4648, standard alphabet, padded), as Kubernetes Secrets and kubeconfig *-data
// fields carry bytes.
#pragma once

#include <string>

#include "common/status.h"

namespace lockstep {

std::string Base64Encode(const std::string& bytes);
// INVALID_ARGUMENT for a character outside the alphabet or a bad length; whitespace is skipped
// (kubeconfigs wrap long values).
StatusOr<std::string> Base64Decode(const std::string& text);

}  // namespace lockstep

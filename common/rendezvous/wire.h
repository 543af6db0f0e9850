// Wire helpers shared by the rendezvous client and server: mapping between gRPC and Lockstep
// statuses (the codes are the same numbers), the token metadata key, a constant-time token
// compare, and conversions between the proto messages and the public structs.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "common/rendezvous/client.h"
#include "common/rendezvous/straggler_detector.h"
#include "common/status.h"
#include "proto/rendezvous.pb.h"

namespace lockstep::rendezvous {

// Metadata key that carries the job's token on every call.
inline constexpr char kTokenMetadataKey[] = "x-lockstep-token";
// Metadata of a heartbeat stream: whose stream it is (the job, the member, the generation in
// decimal), so that the service binds it to the member as it opens (proto/rendezvous.proto).
inline constexpr char kJobMetadataKey[] = "x-lockstep-job";
inline constexpr char kMemberMetadataKey[] = "x-lockstep-member";
inline constexpr char kGenerationMetadataKey[] = "x-lockstep-generation";
// Initial metadata the service sends on a heartbeat stream it took (job hosted, token right),
// so that a reconnecting member knows a service is back (an older service sends none).
inline constexpr char kStreamAcceptedMetadataKey[] = "x-lockstep-accepted";

Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const Status& status);

// Compares in time that depends only on the lengths, so a caller cannot learn a token's prefix
// by timing refusals.
// An empty expected token never matches: a job without a token is a configuration error.
bool TokensEqual(const std::string& expected, const std::string& presented);

ProgressReport FromProto(const v1::Progress& progress);
Pace FromProto(const v1::Pace& pace);
v1::Progress ToProto(const ProgressReport& progress);
Assignment FromProto(const v1::JoinResponse& response);
v1::JoinResponse ToProto(const Assignment& assignment);
// A JoinResponse with the members alone (every other field unset, so not encoded): the list a
// client without JoinRequest.without_members gets (proto/rendezvous.proto).
v1::JoinResponse MembersToProto(const std::vector<MemberInfo>& members);

}  // namespace lockstep::rendezvous

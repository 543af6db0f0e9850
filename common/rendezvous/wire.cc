#include "common/rendezvous/wire.h"

namespace lockstep::rendezvous {

namespace {

constexpr char kErrorInfoTypeUrl[] = "type.googleapis.com/google.rpc.ErrorInfo";
constexpr char kErrorDomain[] = "rendezvous.lockstep.dev";

}  // namespace

Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return OkStatus();
  Status converted(static_cast<StatusCode>(status.error_code()), status.error_message());
  v1::StatusDetails details;
  if (status.error_details().empty() || !details.ParseFromString(status.error_details())) {
    return converted;
  }
  for (const google::protobuf::Any& detail : details.details()) {
    v1::ErrorInfo info;
    if (detail.type_url() == kErrorInfoTypeUrl && info.ParseFromString(detail.value()) &&
        info.domain() == kErrorDomain) {
      return converted.WithReason(info.reason());
    }
  }
  return converted;
}

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (status.reason().empty()) return grpc::Status(code, status.message());
  v1::ErrorInfo info;
  info.set_reason(status.reason());
  info.set_domain(kErrorDomain);
  v1::StatusDetails details;
  details.set_code(static_cast<int32_t>(status.code()));
  details.set_message(status.message());
  google::protobuf::Any* any = details.add_details();
  any->set_type_url(kErrorInfoTypeUrl);
  any->set_value(info.SerializeAsString());
  return grpc::Status(code, status.message(), details.SerializeAsString());
}

bool TokensEqual(const std::string& expected, const std::string& presented) {
  // Walk the expected token in full whatever the presented one holds; fold the length difference
  // into the result rather than returning early.
  unsigned char diff = expected.size() == presented.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(expected[i]) ^ p;
  }
  return diff == 0 && !expected.empty();
}

Pace FromProto(const v1::Pace& pace) { return Pace{pace.steps(), pace.compute_seconds()}; }

ProgressReport FromProto(const v1::Progress& progress) {
  ProgressReport out;
  out.step = progress.step();
  out.total_steps = progress.total_steps();
  out.loss = progress.loss();
  out.samples_per_second = progress.samples_per_second();
  out.scaling_efficiency = progress.scaling_efficiency();
  out.samples = progress.samples();
  out.eval_accuracy = progress.eval_accuracy();
  out.last_checkpoint_step = progress.last_checkpoint_step();
  out.last_checkpoint_uri = progress.last_checkpoint_uri();
  out.comm_exposed_fraction = progress.comm_exposed_fraction();
  out.resumed_from_step = progress.resumed_from_step();
  out.restarts = progress.restarts();
  out.has_loss = !progress.no_loss();
  out.wire_bytes_per_step = progress.wire_bytes_per_step();
  out.eval_auc = progress.has_eval_auc() ? progress.eval_auc() : -1;
  return out;
}

v1::Progress ToProto(const ProgressReport& progress) {
  v1::Progress out;
  out.set_step(progress.step);
  out.set_total_steps(progress.total_steps);
  out.set_loss(progress.loss);
  out.set_samples_per_second(progress.samples_per_second);
  out.set_scaling_efficiency(progress.scaling_efficiency);
  out.set_samples(progress.samples);
  out.set_eval_accuracy(progress.eval_accuracy);
  out.set_last_checkpoint_step(progress.last_checkpoint_step);
  out.set_last_checkpoint_uri(progress.last_checkpoint_uri);
  out.set_comm_exposed_fraction(progress.comm_exposed_fraction);
  out.set_resumed_from_step(progress.resumed_from_step);
  out.set_restarts(progress.restarts);
  out.set_no_loss(!progress.has_loss);
  out.set_wire_bytes_per_step(progress.wire_bytes_per_step);
  if (progress.eval_auc >= 0) {
    out.set_eval_auc(progress.eval_auc);
    out.set_has_eval_auc(true);
  }
  return out;
}

Assignment FromProto(const v1::JoinResponse& response) {
  Assignment out;
  out.generation = response.generation();
  out.rank = response.rank();
  out.world_size = response.world_size();
  out.heartbeat_interval_ms = response.heartbeat_interval_ms();
  out.heartbeat_idle_interval_ms = response.heartbeat_idle_interval_ms();
  out.heartbeat_timeout_ms = response.heartbeat_timeout_ms();
  out.local_rank = response.local_rank();
  out.local_world_size = response.local_world_size();
  out.pod_rank = response.pod_rank();
  out.pod_count = response.pod_count();
  out.first_host = response.first_host();
  if (!response.has_host() && response.members_size() == out.world_size && out.world_size > 0) {
    // A service of an older version sends no placement, only every member's record: place the
    // member from that, as the service now does.
    std::vector<std::string> hosts;
    for (const v1::Member& member : response.members()) hosts.push_back(member.host());
    if (out.rank >= 0 && out.rank < out.world_size) out.host = PlaceOnHosts(hosts)[out.rank];
    out.first_host = hosts[0];
    return out;
  }
  const v1::HostPlacement& host = response.host();
  out.host.host_rank = host.host_rank();
  out.host.host_count = host.host_count();
  out.host.local_rank = host.local_rank();
  out.host.local_size = host.local_size();
  out.host.contiguous = host.contiguous();
  return out;
}

v1::JoinResponse MembersToProto(const std::vector<MemberInfo>& members) {
  v1::JoinResponse out;
  for (const auto& member : members) {
    v1::Member* wire = out.add_members();
    wire->set_member_id(member.member_id);
    wire->set_host(member.host);
    wire->set_rank(member.rank);
    wire->set_state_step(member.state_step);
    // Every member's list holds every member: a pod named like its member is left out.
    if (member.pod != member.member_id) wire->set_pod(member.pod);
    wire->set_local_rank(member.local_rank);
  }
  return out;
}

v1::JoinResponse ToProto(const Assignment& assignment) {
  v1::JoinResponse out;
  out.set_generation(assignment.generation);
  out.set_rank(assignment.rank);
  out.set_world_size(assignment.world_size);
  out.set_heartbeat_interval_ms(assignment.heartbeat_interval_ms);
  out.set_heartbeat_idle_interval_ms(assignment.heartbeat_idle_interval_ms);
  out.set_heartbeat_timeout_ms(assignment.heartbeat_timeout_ms);
  out.set_local_rank(assignment.local_rank);
  out.set_local_world_size(assignment.local_world_size);
  out.set_pod_rank(assignment.pod_rank);
  out.set_pod_count(assignment.pod_count);
  out.set_first_host(assignment.first_host);
  v1::HostPlacement* host = out.mutable_host();
  host->set_host_rank(assignment.host.host_rank);
  host->set_host_count(assignment.host.host_count);
  host->set_local_rank(assignment.host.local_rank);
  host->set_local_size(assignment.host.local_size);
  host->set_contiguous(assignment.host.contiguous);
  return out;
}

}  // namespace lockstep::rendezvous

// The worker pod's security settings, applied by DesiredPod after spec.template is merged, only
// where the template is silent: a template loosens exactly what it must. Pure functions of the
// pod's JSON, table-tested through DesiredPod (tests/operator/trainingjob/children_test.cc) and
// on a real API server (children_apiserver_test.cc).
#pragma once

#include <nlohmann/json.hpp>

namespace lockstep::op::trainingjob {

// The Pod Security "restricted" profile (kubernetes.io/docs/concepts/security/
// pod-security-standards): no service account token (the worker never calls the API), seccomp
// RuntimeDefault, and a worker container that runs as a non-root user, cannot gain privileges
// and holds no capability.
//
// RDMA jobs (`rdma`) are the exception the profile cannot express: registering (pinning) NIC
// memory past the memlock limit needs CAP_IPC_LOCK, and Kubernetes gives an added capability to
// the process only when it runs as root (a non-root process gets it in its bounding set alone:
// kubernetes/kubernetes#56374; no ambient capabilities). So an RDMA worker runs as root with
// IPC_LOCK as its only capability, unless the template names a user.
//
// The worker container's defaults are set on it, not on the pod, so a sidecar the template adds
// runs as its image says. `pod`'s first container is the worker.
void HardenPod(nlohmann::json* pod, bool rdma);

// Tells the worker container (LOCKSTEP_TERMINATION_LOG) the file the kubelet reads its
// termination message from: its terminationMessagePath, which a template may set. A worker that
// exits with an error writes it there (the job's failure condition quotes it), and an exec job's
// agents write there that they gave up, so that the job fails at once (ReconcilePods).
void PointTerminationLog(nlohmann::json* pod);

}  // namespace lockstep::op::trainingjob

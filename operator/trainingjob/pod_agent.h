// The Lockstep agent brought into a user's own image (docs/exec.md, "Your own image"), the way
// Argo Workflows' emissary and Tekton's entrypoint reach images that know nothing of them.
//
// A job that runs a command (spec.command) in an image the user named (NamedWorkerImage: the
// template's "worker" container's image, or spec.image) other than the operator's worker image
// gets, in every worker pod:
//  - an emptyDir volume "lockstep-agent" (a template that defines a volume of that name, say a
//    memory-backed one, keeps its own);
//  - an init container "lockstep-agent", first among the pod's init containers, from the agent
//    image (the Dockerfile's agent stage: the bundle at /lockstep and nothing else), that copies
//    the agent's bundle into the volume: `/lockstep/bin/lockstep-agent install /lockstep-volume`.
//    It runs as the agent image's non-root user (65532) with the restricted profile's settings
//    whatever the pod's own user is, and with the worker's cpu and memory, so that it changes
//    neither the pod's QoS class nor what the scheduler reserves. A failure (a volume it cannot
//    write) is its termination message "lockstep: gave up: ...", which fails the job naming the
//    pod and the cause (WorkerGaveUpMessage reads the init container too);
//  - the volume mounted read-only at /lockstep in the worker container, which runs
//    `/lockstep/bin/lockstep-agent exec -- <spec.command>`: the image's entrypoint gives way to
//    the command, as a Kubernetes container's `command` replaces it; its environment, working
//    directory and user are the image's (or the template's).
// The operator's own worker image holds lockstep-worker, which runs the command itself; a
// built-in trainer job always runs lockstep-worker from the image it names.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/spec/training_job.h"

namespace lockstep::op::trainingjob {

inline constexpr char kAgentContainer[] = "lockstep-agent";  // the init container and the volume
// Where the bundle is in the worker container: scripts/bundle/agent.sh's --prefix (default
// /lockstep) names its loader there, so the two must agree. The agent image holds it there too.
inline constexpr char kAgentMountPath[] = "/lockstep";
inline constexpr char kAgentProgram[] = "/lockstep/bin/lockstep-agent";
// Where the init container mounts the volume it fills.
inline constexpr char kAgentVolumePath[] = "/lockstep-volume";
// The agent image's user (the Dockerfile's agent stage), which the init container runs as.
inline constexpr int64_t kAgentUser = 65532;

// The image the worker container runs: NamedWorkerImage(spec), else `default_image`.
std::string WorkerImage(const spec::TrainingJobSpec& spec, const std::string& default_image);

// Whether the job's worker pods get the agent: a command job whose image is not `default_image`.
bool BringsAgent(const spec::TrainingJobSpec& spec, const std::string& default_image);

// Adds the volume, the init container and the worker container's mount to `pod` (the worker
// container first, after MergeTemplate, so that the template's init containers and its own
// agent volume are there to keep). The worker's command is the caller's: kAgentProgram exec.
void BringAgent(nlohmann::json* pod, const std::string& agent_image);

}  // namespace lockstep::op::trainingjob

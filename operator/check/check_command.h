// `lockstep-operator check`: the command line of the installation check (installation_check.h),
// which the chart's `helm test` pod runs.
//
//   lockstep-operator check --webhook-url=https://lockstep-webhook.ns.svc:443/validate-trainingjob
//       --rendezvous-address=lockstep-rendezvous.ns.svc:7443
//       --metrics-url=http://lockstep-metrics.ns.svc:8080/metrics --ca-file=/var/run/ca/ca.crt
//
// Prints one line per check and exits 0 when every check passed, 1 when one failed, 2 on a bad
// flag (naming it).
#pragma once

namespace lockstep::op::check {

// argv[0] is "check".
int RunCheckCommand(int argc, const char* const* argv);

}  // namespace lockstep::op::check

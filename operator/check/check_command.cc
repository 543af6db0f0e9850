#include "operator/check/check_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "common/command_line.h"
#include "common/pem_file.h"
#include "operator/check/installation_check.h"

namespace lockstep::op::check {

int RunCheckCommand(int argc, const char* const* argv) {
  CheckOptions options;
  std::string ca_file;
  CLI::App app{
      "Checks an installed operator through its Services, as `helm test` does: the webhook "
      "refuses a bad TrainingJob naming the field, the rendezvous service answers over TLS, "
      "the metrics are served. Exits 0 when every check passed, 1 when one failed, 2 on bad "
      "flags.",
      "lockstep-operator check"};
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--webhook-url", options.webhook_url,
                 "the webhook's URL through its Service (empty: the webhook is not checked)")
      ->type_name("URL");
  app.add_option("--webhook-server-name", options.webhook_server_name,
                 "the name the webhook's certificate must carry when --webhook-url holds an "
                 "address (<service>.<namespace>.svc, as the API server calls it)")
      ->type_name("NAME");
  app.add_option("--rendezvous-address", options.rendezvous_address,
                 "host:port of the rendezvous Service")
      ->required()
      ->type_name("HOST:PORT");
  app.add_option("--metrics-url", options.metrics_url, "the metrics Service's /metrics URL")
      ->required()
      ->type_name("URL");
  app.add_option("--ca-file", ca_file,
                 "the operator's CA certificate (ca.crt of its Secret); empty: plaintext")
      ->type_name("FILE");
  app.add_option("--namespace", options.namespace_name,
                 "the namespace the reviewed TrainingJob claims (default: $POD_NAMESPACE)")
      ->type_name("NS");
  app.add_option("--timeout-ms", options.timeout_ms, "each check's deadline")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{100}, int64_t{600000}))
      ->type_name("MS");
  if (const char* ns = std::getenv("POD_NAMESPACE"); ns != nullptr && *ns != '\0') {
    options.namespace_name = ns;
  }
  const CommandLineParse parsed = ParseCommandLine(app, {argv + 1, argv + argc});
  if (parsed.help) {
    std::cout << app.help();
    return 0;
  }
  if (!parsed.error.empty()) {
    std::cerr << "lockstep-operator check: " << parsed.error << " (see --help)\n";
    return 2;
  }
  if (!ca_file.empty()) {
    StatusOr<std::string> ca = PemFile(ca_file, kPemCertificate, "PEM certificate", "--ca-file");
    if (!ca.ok()) {
      std::cerr << "lockstep-operator check: " << ca.status().message() << "\n";
      return 2;
    }
    options.ca_pem = *ca;
  }
  const std::vector<CheckResult> results = CheckInstallation(
      options, [](const CheckResult& result) { std::cout << CheckLine(result) << std::flush; });
  std::cout << CheckVerdict(results) << std::flush;
  for (const CheckResult& result : results) {
    if (!result.status.ok()) return 1;
  }
  return 0;
}

}  // namespace lockstep::op::check

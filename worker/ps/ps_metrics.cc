#include "worker/ps/ps_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <mutex>

#include "common/http/http_endpoint.h"

namespace lockstep::ps {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

struct PsMetrics::Impl {
  const ShardServer* server = nullptr;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<http::HttpEndpoint> endpoint;
  std::mutex mu;          // one scrape at a time moves the counters
  ShardServerStats last;  // what the counters hold
  prometheus::Counter *pulls, *pushes, *clocks, *rows_pulled, *rows_pushed, *bytes_received,
      *bytes_sent, *refused, *checkpoints;
  prometheus::Gauge *min_clock, *staleness, *restored_step;

  // Counters advance by what the stats gained since the last scrape.
  void Sync() {
    std::lock_guard<std::mutex> lock(mu);
    const ShardServerStats now = server->stats();
    auto advance = [](prometheus::Counter* counter, uint64_t before, uint64_t after) {
      if (after > before) counter->Increment(static_cast<double>(after - before));
    };
    advance(pulls, last.pulls, now.pulls);
    advance(pushes, last.pushes, now.pushes);
    advance(clocks, last.clocks, now.clocks);
    advance(rows_pulled, last.rows_pulled, now.rows_pulled);
    advance(rows_pushed, last.rows_pushed, now.rows_pushed);
    advance(bytes_received, last.bytes_received, now.bytes_received);
    advance(bytes_sent, last.bytes_sent, now.bytes_sent);
    advance(refused, last.refused, now.refused);
    advance(checkpoints, static_cast<uint64_t>(last.checkpoints),
            static_cast<uint64_t>(now.checkpoints));
    min_clock->Set(static_cast<double>(now.min_clock));
    staleness->Set(static_cast<double>(now.max_clock - now.min_clock));
    restored_step->Set(static_cast<double>(now.restored_step));
    last = now;
  }
};

StatusOr<std::unique_ptr<PsMetrics>> PsMetrics::Create(const std::string& job, int shard, int port,
                                                       const ShardServer& server) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics port must be in 0..65535 (got " + std::to_string(port) +
                                ")");
  }
  auto impl = std::make_unique<Impl>();
  impl->server = &server;
  prometheus::Registry& registry = *impl->registry;
  const std::map<std::string, std::string> labels{{"job", job}, {"shard", std::to_string(shard)}};
  auto with = [&](const char* key, const char* value) {
    std::map<std::string, std::string> more = labels;
    more[key] = value;
    return more;
  };
  auto& requests = BuildCounter()
                       .Name("lockstep_ps_requests_total")
                       .Help("Calls the parameter server answered, by kind (pull, push, clock)")
                       .Register(registry);
  impl->pulls = &requests.Add(with("kind", "pull"));
  impl->pushes = &requests.Add(with("kind", "push"));
  impl->clocks = &requests.Add(with("kind", "clock"));
  auto& rows = BuildCounter()
                   .Name("lockstep_ps_rows_total")
                   .Help("Table rows the parameter server served (pulled) and took (pushed)")
                   .Register(registry);
  impl->rows_pulled = &rows.Add(with("direction", "pulled"));
  impl->rows_pushed = &rows.Add(with("direction", "pushed"));
  auto& bytes = BuildCounter()
                    .Name("lockstep_ps_bytes_total")
                    .Help("Bytes of the parameter server's requests received and responses sent")
                    .Register(registry);
  impl->bytes_received = &bytes.Add(with("direction", "received"));
  impl->bytes_sent = &bytes.Add(with("direction", "sent"));
  impl->refused = &BuildCounter()
                       .Name("lockstep_ps_refused_total")
                       .Help("Calls the parameter server answered with an error")
                       .Register(registry)
                       .Add(labels);
  impl->checkpoints = &BuildCounter()
                           .Name("lockstep_ps_checkpoints_total")
                           .Help("Checkpoints of the server's shard written since it started")
                           .Register(registry)
                           .Add(labels);
  impl->min_clock = &BuildGauge()
                         .Name("lockstep_ps_min_clock")
                         .Help("The slowest worker's step, as this server has it")
                         .Register(registry)
                         .Add(labels);
  impl->staleness = &BuildGauge()
                         .Name("lockstep_ps_staleness_steps")
                         .Help("Steps between the fastest and the slowest worker")
                         .Register(registry)
                         .Add(labels);
  impl->restored_step = &BuildGauge()
                             .Name("lockstep_ps_restored_step")
                             .Help("The checkpoint step the shard was restored from; -1: none")
                             .Register(registry)
                             .Add(labels);
  impl->Sync();
  Impl* raw = impl.get();
  if (port != 0) {
    http::HttpHandler serve = http::PrometheusHandler(impl->registry);
    auto endpoint = http::HttpEndpoint::Start("0.0.0.0", port, {{"/metrics", [raw, serve] {
                                                                   raw->Sync();
                                                                   return serve();
                                                                 }}});
    if (!endpoint.ok()) return endpoint.status().WithContext("metrics endpoint");
    impl->endpoint = std::move(endpoint).value();
  }
  return std::unique_ptr<PsMetrics>(new PsMetrics(std::move(impl)));
}

PsMetrics::PsMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsMetrics::~PsMetrics() = default;

int PsMetrics::port() const { return impl_->endpoint ? impl_->endpoint->port() : 0; }

std::string PsMetrics::Text() {
  impl_->Sync();
  return http::PrometheusHandler(impl_->registry)().body;
}

}  // namespace lockstep::ps

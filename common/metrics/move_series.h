// Moving a Prometheus series to a new label set (a worker whose rank changed with a new
// generation) without losing what it counted.
//
//   MoveSeries(steps_family, &steps_series, {{"job", job}, {"rank", "1"}});
//
// A counter's total carries over to the new series, so rate() over it sees no reset; a gauge
// keeps its last value until the next Set. The old series is removed, so no stale rank stays
// exported. Histograms cannot be moved (their observations are not readable); keep their old
// series. Callers serialise calls for one series.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/labels.h>

namespace lockstep::metrics {

namespace internal {
inline void Restore(prometheus::Counter& counter, double value) { counter.Increment(value); }
inline void Restore(prometheus::Gauge& gauge, double value) { gauge.Set(value); }
}  // namespace internal

// *series may be null (nothing to carry). On return *series is the series with `labels`.
template <typename Metric>
void MoveSeries(prometheus::Family<Metric>* family, Metric** series,
                const prometheus::Labels& labels) {
  double value = 0;
  if (*series != nullptr) {
    value = (*series)->Value();
    family->Remove(*series);
  }
  *series = &family->Add(labels);
  internal::Restore(**series, value);
}

}  // namespace lockstep::metrics

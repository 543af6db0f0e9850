// Gradient buckets: how the flat gradient buffer is cut into the all-reduce units of the DDP
// engine.
//
// A bucket is a run of whole layers, taken in backward order, so it is a contiguous slice of the
// flat buffer (see model.h) that is complete as soon as backward has finished its last layer.
// Buckets are filled greedily up to the byte cap; a layer is never split, and a layer larger
// than the cap is a bucket of its own. The assignment is a pure function of (layout, cap), so
// every rank computes the same buckets and issues their all-reduces in the same order, which
// is what the collectives' contract requires.
//
// Trade-off of the cap: smaller buckets start communicating earlier and overlap more of
// backward, but pay the per-collective latency more often; larger buckets amortise latency but
// leave more communication exposed after backward.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/trainer/model.h"

namespace lockstep::trainer {

struct GradientBucket {
  int64_t offset = 0;  // first float of the slice in the flat gradient buffer
  int64_t count = 0;   // floats in the slice
  // Backward indices (0 = the model's last layer) of the first and last layer it holds.
  int first_backward_layer = 0;
  int last_backward_layer = 0;
};

// A slice [offset, offset + count) of the flat parameter and gradient buffers.
struct ParamRange {
  int64_t offset = 0;
  int64_t count = 0;
};

// cap_bytes <= 0 means one bucket per layer. With `layers` (a pipeline stage), only those
// layers, with offsets into their slice of the flat buffers (RangeOffset is 0).
std::vector<GradientBucket> AssignBuckets(const ParameterLayout& layout, int64_t cap_bytes,
                                          std::optional<LayerRange> layers = std::nullopt);

// Bytes of a MiB count from the manifest (allreduce.bucketMiB may be fractional).
int64_t BucketCapBytes(double bucket_mib);

}  // namespace lockstep::trainer

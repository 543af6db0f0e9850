#include "worker/trainer/buckets.h"

#include <cmath>

namespace lockstep::trainer {

std::vector<GradientBucket> AssignBuckets(const ParameterLayout& layout, int64_t cap_bytes) {
  std::vector<GradientBucket> buckets;
  const int64_t cap_floats = cap_bytes / static_cast<int64_t>(sizeof(float));
  bool open = false;
  GradientBucket current;
  for (int b = 0; b < layout.num_layers(); ++b) {
    const LayerLayout& layer = layout.layers[static_cast<size_t>(layout.ForwardIndex(b))];
    const int64_t count = layer.num_params();
    if (open && current.count + count > cap_floats) {
      buckets.push_back(current);
      open = false;
    }
    if (!open) {
      current = GradientBucket{layer.weight_offset, 0, b, b};
      open = true;
    }
    current.count += count;
    current.last_backward_layer = b;
  }
  if (open) buckets.push_back(current);
  return buckets;
}

int64_t BucketCapBytes(double bucket_mib) {
  return static_cast<int64_t>(std::llround(bucket_mib * 1024.0 * 1024.0));
}

}  // namespace lockstep::trainer

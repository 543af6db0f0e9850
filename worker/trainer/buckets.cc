#include "worker/trainer/buckets.h"

#include <cmath>

namespace lockstep::trainer {

std::vector<GradientBucket> AssignBuckets(const ParameterLayout& layout, int64_t cap_bytes,
                                          std::optional<LayerRange> layers) {
  std::vector<GradientBucket> buckets;
  const int64_t cap_floats = cap_bytes / static_cast<int64_t>(sizeof(float));
  const LayerRange range = layers.value_or(LayerRange{0, layout.num_layers()});
  const int64_t shift = RangeOffset(layout, range);
  bool open = false;
  GradientBucket current;
  // Backward indices of the range's layers: its last layer first.
  for (int b = layout.ForwardIndex(range.last - 1); b <= layout.ForwardIndex(range.first); ++b) {
    const LayerLayout& layer = layout.layers[static_cast<size_t>(layout.ForwardIndex(b))];
    const int64_t count = layer.num_params();
    if (open && current.count + count > cap_floats) {
      buckets.push_back(current);
      open = false;
    }
    if (!open) {
      current = GradientBucket{layer.weight_offset - shift, 0, b, b};
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

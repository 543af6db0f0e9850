// The CPU device of kernels/device.h and the kernels the device-agnostic trainer added
// (SoftmaxCrossEntropyAccumulate, SetZero, CountNonFinite) on the CPU path; their CUDA twins are
// in cuda_kernels_test.cc.
#include "kernels/device.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"

namespace lockstep::kernels {
namespace {

using testing::CpuContext;
using testing::RandomFloats;
using testing::RandomLabels;

TEST(CpuDeviceTest, ArraysAreZeroFilledAndCopiesRoundTrip) {
  Device& cpu = CpuDevice();
  EXPECT_EQ(cpu.type(), DeviceType::kCpu);
  EXPECT_EQ(cpu.name(), "cpu");
  DeviceArray<float> a;
  ASSERT_TRUE(a.Allocate(cpu, 1000).ok());
  EXPECT_EQ(*a.ToHost(), std::vector<float>(1000, 0.0f));
  const std::vector<float> values = RandomFloats(1000, 5, -1.0f, 1.0f);
  ASSERT_TRUE(a.CopyFromHost(values.data(), 1000).ok());
  EXPECT_EQ(*a.ToHost(), values);
  std::vector<float> part(10);
  ASSERT_TRUE(a.CopyToHost(part.data(), 10, 990).ok());
  EXPECT_EQ(part[9], values[999]);
}

TEST(CpuDeviceTest, CopiesOutsideTheArrayAreRefusedNamingTheRange) {
  DeviceArray<int32_t> a;
  ASSERT_TRUE(a.Allocate(CpuDevice(), 8).ok());
  std::vector<int32_t> host(8);
  Status status = a.CopyToHost(host.data(), 4, 6);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("[6, 10)"), std::string::npos) << status;
  EXPECT_EQ(a.CopyFromHost(host.data(), -1).code(), StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, MovedArrayOwnsTheMemoryOnce) {
  DeviceArray<float> a;
  ASSERT_TRUE(a.Allocate(CpuDevice(), 4).ok());
  float* memory = a.device_data();
  DeviceArray<float> b = std::move(a);
  EXPECT_EQ(b.device_data(), memory);
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(a.device_data(), nullptr);
}

TEST(CudaUsableTest, WithoutAUsableGpuTheReasonIsSaidAndNoDeviceIsMade) {
  if (CudaUsable().ok()) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_FALSE(CudaUsable().message().empty());
  auto device = CreateDevice(DeviceType::kCuda);
  EXPECT_EQ(device.status().code(), StatusCode::kUnavailable) << device.status();
  EXPECT_EQ(CudaDeviceCount(), 0);
}

TEST(SoftmaxCrossEntropyAccumulateTest, AddsTheSameLossAndGradientsAsTheHostForm) {
  const int64_t rows = 33, classes = 7;
  const std::vector<float> logits = RandomFloats(rows * classes, 8, -5.0f, 5.0f);
  const std::vector<int32_t> labels = RandomLabels(rows, classes, 9);
  std::vector<float> expected(rows * classes), actual(rows * classes, NAN);
  double loss = 0;
  SoftmaxCrossEntropy(CpuContext(), rows, classes, logits.data(), labels.data(), 0.25f,
                      expected.data(), &loss, nullptr);
  double accumulator = 2.5;
  SoftmaxCrossEntropyAccumulate(CpuContext(), rows, classes, logits.data(), labels.data(), 0.25f,
                                actual.data(), &accumulator);
  SoftmaxCrossEntropyAccumulate(CpuContext(), rows, classes, logits.data(), labels.data(), 0.25f,
                                actual.data(), &accumulator);
  EXPECT_DOUBLE_EQ(accumulator, 2.5 + 2 * loss);
  EXPECT_EQ(actual, expected);
}

TEST(CountNonFiniteTest, CountsInfinitiesAndNaNsOfEveryPayload) {
  std::vector<float> x = RandomFloats(1001, 3, -1e30f, 1e30f);
  EXPECT_EQ(CountNonFinite(CpuContext(), 1001, x.data()), 0);
  x[0] = std::numeric_limits<float>::infinity();
  x[500] = -std::numeric_limits<float>::infinity();
  x[1000] = std::numeric_limits<float>::quiet_NaN();
  uint32_t payload_nan = 0x7f800001u;  // a signalling NaN
  std::memcpy(&x[7], &payload_nan, sizeof(float));
  x[8] = std::numeric_limits<float>::max();  // finite
  x[9] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(CountNonFinite(CpuContext(), 1001, x.data()), 4);
  EXPECT_EQ(CountNonFinite(CpuContext(), 0, x.data()), 0);
}

TEST(SetZeroTest, ClearsExactlyTheRange) {
  std::vector<float> x(10, 3.0f);
  SetZero(CpuContext(), 8, x.data() + 1);
  EXPECT_EQ(x.front(), 3.0f);
  EXPECT_EQ(x.back(), 3.0f);
  for (int i = 1; i < 9; ++i) EXPECT_EQ(x[i], 0.0f);
}

}  // namespace
}  // namespace lockstep::kernels

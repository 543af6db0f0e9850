// Bandwidth of the memory-bound CPU kernels next to memcpy. Every benchmark reports
// bytes_per_second as the bytes it reads plus the bytes it writes, so a kernel at memcpy speed
// shows the same GB/s as BM_Memcpy of the same traffic; the element count is the argument.
// Sizes: 256 Ki elements (1 MiB per float array, cache-resident-ish) and 16 Mi elements (64 MiB,
// DRAM).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::kernels {
namespace {

const ExecutionContext kCpu{};

std::vector<float> Filled(int64_t n, float value) { return std::vector<float>(n, value); }

void SetTraffic(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
}

// memcpy of `arrays` float arrays' worth of traffic: copies arrays/2 arrays (read + write).
void BM_Memcpy(benchmark::State& state, int arrays) {
  const int64_t n = state.range(0);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float) * arrays / 2;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 2 * static_cast<int64_t>(bytes));
}

void BM_Scale(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> x = Filled(n, 1.0f);
  for (auto _ : state) {
    Scale(kCpu, n, 1.0f, x.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 2 * n * 4);
}

void BM_BiasActivationForward(benchmark::State& state, ActivationType act) {
  const int64_t n = state.range(0), cols = 256, rows = n / cols;
  std::vector<float> x = Filled(n, 0.5f), bias = Filled(cols, 0.0f), pre(n);
  for (auto _ : state) {
    BiasActivationForward(kCpu, act, rows, cols, bias.data(), x.data(), pre.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 3 * n * 4);  // read x, write x and pre
}

void BM_BiasActivationBackward(benchmark::State& state, ActivationType act) {
  const int64_t n = state.range(0), cols = 256, rows = n / cols;
  std::vector<float> y = Filled(n, 0.5f), pre = Filled(n, 0.5f), dy = Filled(n, 1.0f), dbias(cols);
  for (auto _ : state) {
    BiasActivationBackward(kCpu, act, rows, cols, y.data(), pre.data(), dy.data(), dbias.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 3 * n * 4);  // read y (or pre) and dy, write dy
}

void BM_SgdMomentumUpdate(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> param = Filled(n, 1.0f), grad = Filled(n, 0.0f), buffer = Filled(n, 0.0f);
  for (auto _ : state) {
    SgdMomentumUpdate(kCpu, n, 0.01f, 0.9f, 0.0f, false, param.data(), grad.data(), buffer.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 5 * n * 4);  // read param, grad, buffer; write param, buffer
}

void BM_AdamWUpdate(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> param = Filled(n, 1.0f), grad = Filled(n, 0.0f), m = Filled(n, 0.0f),
                     v = Filled(n, 0.0f);
  int64_t step = 0;
  for (auto _ : state) {
    AdamWUpdate(kCpu, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, ++step, param.data(), grad.data(),
                m.data(), v.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, 7 * n * 4);  // read param, grad, m, v; write param, m, v
}

void BM_PackHalf(benchmark::State& state, HalfType type) {
  const int64_t n = state.range(0);
  std::vector<float> in = Filled(n, 0.3f);
  std::vector<uint16_t> out(n);
  for (auto _ : state) {
    PackHalf(kCpu, type, n, 0.25f, in.data(), out.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, n * 6);
}

void BM_UnpackHalf(benchmark::State& state, HalfType type) {
  const int64_t n = state.range(0);
  std::vector<uint16_t> in(n, 0x3c00);
  std::vector<float> out(n);
  for (auto _ : state) {
    UnpackHalf(kCpu, type, n, 0.25f, in.data(), out.data());
    benchmark::ClobberMemory();
  }
  SetTraffic(state, n * 6);
}

#define LOCKSTEP_SIZES ->Arg(1 << 18)->Arg(1 << 24)->Unit(benchmark::kMicrosecond)

BENCHMARK_CAPTURE(BM_Memcpy, traffic_of_2_arrays, 2) LOCKSTEP_SIZES;
BENCHMARK(BM_Scale) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_Memcpy, traffic_of_3_arrays, 3) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_BiasActivationForward, relu, ActivationType::kRelu) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_BiasActivationForward, gelu, ActivationType::kGelu) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_BiasActivationBackward, relu, ActivationType::kRelu) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_BiasActivationBackward, gelu, ActivationType::kGelu) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_Memcpy, traffic_of_5_arrays, 5) LOCKSTEP_SIZES;
BENCHMARK(BM_SgdMomentumUpdate) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_Memcpy, traffic_of_7_arrays, 7) LOCKSTEP_SIZES;
BENCHMARK(BM_AdamWUpdate) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_PackHalf, bf16, HalfType::kBf16) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_PackHalf, fp16, HalfType::kFp16) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_UnpackHalf, bf16, HalfType::kBf16) LOCKSTEP_SIZES;
BENCHMARK_CAPTURE(BM_UnpackHalf, fp16, HalfType::kFp16) LOCKSTEP_SIZES;

}  // namespace
}  // namespace lockstep::kernels

BENCHMARK_MAIN();

// Effective bandwidth of the memory-bound CUDA kernels against the device's own copy bandwidth,
// measured in the same run.
//
//   kernels_cuda_bench [elements] [--only NAME]
//       elements: default 64 Mi (256 MiB per float array, far beyond L2, so every pass goes to
//       device memory); --only: just the kernels whose row name contains NAME (to profile one
//       kernel with Nsight Compute: `ncu --launch-skip 3 --launch-count 1 ... --only Softmax`)
//
// For each kernel: the bytes it must move (each input read once, each output written once), the
// median time of kRepetitions runs timed with CUDA events after kWarmup untimed runs, and the
// bandwidth that makes; next to it a cudaMemcpyAsync device-to-device of the same traffic (half
// the bytes copied: a copy reads and writes each byte), timed the same way just before the
// kernel. The goal is >= 85% of the copy. Inputs are random, never zeros. GEMM is reported in
// TFLOP/s for reference (compute-bound, not a bandwidth kernel), for a layer's three products at
// two shapes: fp32, TF32, bf16 operands held in floats (what precision bf16 runs:
// CUBLAS_COMPUTE_32F_FAST_16BF) and bf16 storage (CUDA_R_16BF operands, what autocast runs).
//
// Exit status: 0 when measured or when there is no GPU (with a message), 1 on a CUDA error.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::kernels {
namespace {

constexpr int kWarmup = 3;
constexpr int kRepetitions = 20;

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "kernels_cuda_bench: %s: %s: %s\n", what, cudaGetErrorName(error),
                 cudaGetErrorString(error));
    std::exit(1);
  }
}
#define BENCH_CUDA(call) Check((call), #call)

void CheckBlas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "kernels_cuda_bench: %s: cuBLAS status %d\n", what,
                 static_cast<int>(status));
    std::exit(1);
  }
}
#define BENCH_CUBLAS(call) CheckBlas((call), #call)

// Device memory filled with values in [low, high) from a simple generator (cheap for 256 MiB).
float* RandomDeviceFloats(int64_t n, uint32_t seed, float low, float high) {
  std::vector<float> host(n);
  uint32_t state = seed * 2654435761u + 1;
  for (float& v : host) {
    state = state * 1664525u + 1013904223u;
    v = low + (high - low) * static_cast<float>(state >> 8) * 0x1p-24f;
  }
  float* device = nullptr;
  BENCH_CUDA(cudaMalloc(&device, n * sizeof(float)));
  BENCH_CUDA(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return device;
}

// Median milliseconds of `run` over kRepetitions, each bracketed by events on `stream`;
// `prepare` (untimed) runs before each.
double MedianMs(
    cudaStream_t stream, const std::function<void()>& run,
    const std::function<void()>& prepare = [] {}) {
  for (int i = 0; i < kWarmup; ++i) {
    prepare();
    run();
  }
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < kRepetitions; ++i) {
    prepare();
    BENCH_CUDA(cudaEventRecord(start, stream));
    run();
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string kernel;
  double traffic_bytes;
  double kernel_ms;
  double copy_ms;
};

void PrintTable(const std::vector<Row>& rows) {
  std::printf("\n%-34s %10s %10s %10s %10s %8s\n", "kernel", "MiB moved", "time us", "GB/s",
              "copy GB/s", "of copy");
  for (const Row& row : rows) {
    const double kernel_gbps = row.traffic_bytes / (row.kernel_ms * 1e-3) / 1e9;
    const double copy_gbps = row.traffic_bytes / (row.copy_ms * 1e-3) / 1e9;
    std::printf("%-34s %10.1f %10.1f %10.1f %10.1f %7.1f%%\n", row.kernel.c_str(),
                row.traffic_bytes / (1 << 20), row.kernel_ms * 1e3, kernel_gbps, copy_gbps,
                100.0 * kernel_gbps / copy_gbps);
  }
}

int Run(int64_t n, const std::string& only) {
  const auto wanted = [&](const std::string& name) {
    return only.empty() || name.find(only) != std::string::npos;
  };
  int device = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  cudaDeviceProp props;
  BENCH_CUDA(cudaGetDeviceProperties(&props, device));
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB), %lld elements per array\n", props.name,
              props.major, props.minor, props.multiProcessorCount,
              props.totalGlobalMem / double(1 << 30), static_cast<long long>(n));

  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "kernels_cuda_bench: cublasCreate failed\n");
    return 1;
  }
  ExecutionContext ctx;
  ctx.device = DeviceType::kCuda;
  ctx.cuda_stream = stream;
  ctx.blas_handle = blas;

  // Positive values keep AdamW's second moment and every repeated in-place update finite.
  float* a = RandomDeviceFloats(n, 1, 0.5f, 1.0f);
  float* b = RandomDeviceFloats(n, 2, 0.5f, 1.0f);
  float* c = RandomDeviceFloats(n, 3, 0.5f, 1.0f);
  float* d = RandomDeviceFloats(n, 4, 0.5f, 1.0f);
  uint16_t* halves = nullptr;
  BENCH_CUDA(cudaMalloc(&halves, n * sizeof(uint16_t)));
  PackHalf(ctx, HalfType::kBf16, n, 1.0f, a, halves);
  // The copy baseline: up to 28 bytes per element of traffic, so 14 bytes per element copied.
  const size_t max_copy_bytes = static_cast<size_t>(n) * 14;
  void* copy_from = nullptr;
  void* copy_to = nullptr;
  BENCH_CUDA(cudaMalloc(&copy_from, max_copy_bytes));
  BENCH_CUDA(cudaMalloc(&copy_to, max_copy_bytes));
  BENCH_CUDA(cudaMemset(copy_from, 0x3c, max_copy_bytes));

  const int64_t cols = 1024, rows = n / cols;
  float* bias = RandomDeviceFloats(cols, 5, -0.01f, 0.01f);
  float* dbias = nullptr;
  BENCH_CUDA(cudaMalloc(&dbias, cols * sizeof(float)));
  const int64_t classes = 1000, logit_rows = n / classes;
  int32_t* labels = nullptr;
  {
    std::vector<int32_t> host(logit_rows);
    for (int64_t r = 0; r < logit_rows; ++r) host[r] = static_cast<int32_t>((r * 7919) % classes);
    BENCH_CUDA(cudaMalloc(&labels, logit_rows * sizeof(int32_t)));
    BENCH_CUDA(
        cudaMemcpy(labels, host.data(), logit_rows * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  BENCH_CUDA(cudaDeviceSynchronize());

  std::vector<Row> rows_out;
  auto measure = [&](
                     const std::string& name, double bytes_per_element, int64_t elements,
                     const std::function<void()>& run,
                     const std::function<void()>& prepare = [] {}) {
    if (!wanted(name)) return;
    const double traffic = bytes_per_element * elements;
    const size_t copy_bytes = static_cast<size_t>(traffic / 2);
    const double copy_ms = MedianMs(stream, [&] {
      BENCH_CUDA(cudaMemcpyAsync(copy_to, copy_from, copy_bytes, cudaMemcpyDeviceToDevice, stream));
    });
    const double kernel_ms = MedianMs(stream, run, prepare);
    rows_out.push_back({name, traffic, kernel_ms, copy_ms});
  };

  measure("Scale", 8, n, [&] { Scale(ctx, n, 1.0f, a); });
  measure("PackHalf bf16", 6, n, [&] { PackHalf(ctx, HalfType::kBf16, n, 0.5f, a, halves); });
  measure("PackHalf fp16", 6, n, [&] { PackHalf(ctx, HalfType::kFp16, n, 0.5f, a, halves); });
  measure("UnpackHalf bf16", 6, n, [&] { UnpackHalf(ctx, HalfType::kBf16, n, 2.0f, halves, b); });
  measure("UnpackHalf fp16", 6, n, [&] { UnpackHalf(ctx, HalfType::kFp16, n, 2.0f, halves, b); });
  measure("SgdMomentumUpdate first step", 16, n,
          [&] { SgdMomentumUpdate(ctx, n, 1e-6f, 0.9f, 0.0f, true, a, b, c); });
  measure("SgdMomentumUpdate", 20, n,
          [&] { SgdMomentumUpdate(ctx, n, 1e-6f, 0.9f, 1e-4f, false, a, b, c); });
  measure("AdamWUpdate", 28, n,
          [&] { AdamWUpdate(ctx, n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, 10, a, b, c, d); });
  const struct {
    const char* name;
    ActivationType act;
  } activations[] = {{"relu", ActivationType::kRelu},
                     {"gelu", ActivationType::kGelu},
                     {"tanh", ActivationType::kTanh},
                     {"identity", ActivationType::kIdentity}};
  // The in-place kernels start each timed run from the same random values (an untimed copy),
  // so repeated activations never drift towards zero.
  const size_t array_bytes = static_cast<size_t>(n) * sizeof(float);
  const auto reset_b = [&] {
    BENCH_CUDA(cudaMemcpyAsync(b, a, array_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  const auto reset_d = [&] {
    BENCH_CUDA(cudaMemcpyAsync(d, a, array_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  for (const auto& activation : activations) {
    measure(
        std::string("BiasActivationForward ") + activation.name + " +pre", 12, rows * cols,
        [&] { BiasActivationForward(ctx, activation.act, rows, cols, bias, b, c); }, reset_b);
  }
  measure(
      "BiasActivationForward relu", 8, rows * cols,
      [&] { BiasActivationForward(ctx, ActivationType::kRelu, rows, cols, bias, b, nullptr); },
      reset_b);
  for (const auto& activation : activations) {
    // Reads dy and the saved tensor (none for identity), writes dx: the partial sums are
    // 1/kMinChunkRows of that and not counted.
    const double bytes = activation.act == ActivationType::kIdentity ? 8 : 12;
    measure(
        std::string("BiasActivationBackward ") + activation.name, bytes, rows * cols,
        [&] { BiasActivationBackward(ctx, activation.act, rows, cols, c, c, d, dbias); }, reset_d);
  }
  // Reads the logits and writes the gradient; the logits are read twice, the second time mostly
  // from L1/L2 (one 4 KB row per warp).
  measure("SoftmaxCrossEntropy (1000 classes)", 8, logit_rows * classes, [&] {
    SoftmaxCrossEntropy(ctx, logit_rows, classes, a, labels, 1.0f / logit_rows, b, nullptr,
                        nullptr);
  });
  PrintTable(rows_out);

  // GEMM for reference (compute-bound), as a layer's three products call it (model.cc): forward
  // y = x W^T, weight gradient dW = dy^T x, input gradient dx = dy W, for the 4096-wide layer at
  // batch 512 and a 4096-in, 8192-out layer at batch 4096, in fp32, TF32, bf16 operands held in
  // floats (what precision bf16 runs) and bf16 storage (what autocast runs: A and B as bf16, C in
  // fp32).
  uint16_t* halves_b = nullptr;
  BENCH_CUDA(cudaMalloc(&halves_b, n * sizeof(uint16_t)));
  PackHalf(ctx, HalfType::kBf16, n, 1.0f, a, halves);
  PackHalf(ctx, HalfType::kBf16, n, 1.0f, b, halves_b);
  const struct { int64_t rows, in, out; } layers[] = {{512, 4096, 4096}, {4096, 4096, 8192}};
  const struct {
    const char* name;
    bool transpose_a, transpose_b;
  } products[] = {{"forward", false, true}, {"wgrad", true, false}, {"dgrad", false, false}};
  const char* variants[] = {"fp32", "tf32", "bf16 operands", "bf16 storage"};
  if (wanted("Gemm")) {
    std::printf("\n%-50s %10s %10s\n", "Gemm variant product rows x in x out", "time us",
                "TFLOP/s");
  }
  for (const auto& layer : layers) {
    if (!wanted("Gemm") || layer.in * layer.out > n ||
        layer.rows * std::max(layer.in, layer.out) > n) {
      continue;
    }
    for (const auto& product : products) {
      // C[m, n] = op(A) op(B) with the layer's shapes (kernels.h's Gemm convention).
      int64_t m = layer.rows, cols = layer.out, k = layer.in;  // forward
      if (std::string(product.name) == "wgrad") m = layer.out, cols = layer.in, k = layer.rows;
      if (std::string(product.name) == "dgrad") m = layer.rows, cols = layer.in, k = layer.out;
      for (const char* variant : variants) {
        const std::string name = std::string(variant);
        ExecutionContext gemm_ctx = ctx;
        gemm_ctx.allow_tf32 = name == "tf32";
        gemm_ctx.bf16_operands = name == "bf16 operands";
        const double ms = MedianMs(stream, [&] {
          if (name != "bf16 storage") {
            Gemm(gemm_ctx, product.transpose_a, product.transpose_b, m, cols, k, 1.0f, a, b, 0.0f,
                 c);
            return;
          }
          // Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (kernels/cuda/gemm.cc).
          const float alpha = 1.0f, beta = 0.0f;
          const int lda = static_cast<int>(product.transpose_a ? m : k);
          const int ldb = static_cast<int>(product.transpose_b ? k : cols);
          BENCH_CUBLAS(cublasSetStream(blas, stream));
          BENCH_CUBLAS(cublasGemmEx(blas, product.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    product.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    static_cast<int>(cols), static_cast<int>(m),
                                    static_cast<int>(k), &alpha, halves_b, CUDA_R_16BF, ldb, halves,
                                    CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, static_cast<int>(cols),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        char label[96];
        std::snprintf(label, sizeof(label), "Gemm %s %s %lldx%lldx%lld", variant, product.name,
                      static_cast<long long>(layer.rows), static_cast<long long>(layer.in),
                      static_cast<long long>(layer.out));
        std::printf("%-50s %10.1f %10.1f\n", label, ms * 1e3,
                    2.0 * m * cols * k / (ms * 1e-3) / 1e12);
      }
    }
  }
  BENCH_CUDA(cudaFree(halves_b));

  BENCH_CUDA(cudaStreamSynchronize(stream));
  for (void* p :
       {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(d),
        static_cast<void*>(halves), copy_from, copy_to, static_cast<void*>(bias),
        static_cast<void*>(dbias), static_cast<void*>(labels)}) {
    BENCH_CUDA(cudaFree(p));
  }
  cublasDestroy(blas);
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace lockstep::kernels

int main(int argc, char** argv) {
  if (!lockstep::kernels::CudaAvailable()) {
    std::printf("kernels_cuda_bench: no CUDA device in this process; nothing to measure\n");
    return 0;
  }
  int64_t n = int64_t{64} << 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
      continue;
    }
    char* end = nullptr;
    n = std::strtoll(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || n < (1 << 20)) {
      std::fprintf(stderr,
                   "kernels_cuda_bench: usage: kernels_cuda_bench [elements >= 1048576] "
                   "[--only NAME] (got %s)\n",
                   argv[i]);
      return 1;
    }
  }
  n = n / 1024 * 1024;  // whole rows for the activation and softmax shapes
  return lockstep::kernels::Run(n, only);
}

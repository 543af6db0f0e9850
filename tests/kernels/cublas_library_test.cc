// cuBLAS is opened when a CUDA device is made, not linked (kernels/cuda/cublas_library.h): a
// process that computes on the CPU never pays for loading it, and a process that needs it finds
// the installed library and every function it calls. No GPU is needed for either.
#include "kernels/cuda/cublas_library.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::kernels::cuda {
namespace {

bool ProcessHasLoaded(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(library) != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLibraryTest, AProcessComputingOnTheCpuNeverLoadsCublas) {
  ExecutionContext ctx;  // the CPU
  std::vector<float> a(4, 1.0f), b(4, 2.0f), c(4, 0.0f);
  Gemm(ctx, false, false, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  EXPECT_EQ(c[0], 4.0f);
  EXPECT_FALSE(ProcessHasLoaded("libcublas")) << "a linked cuBLAS costs every process its start-up";
}

TEST(CublasLibraryTest, TheInstalledCublasOpensWithEveryFunctionTheKernelsCall) {
  StatusOr<const CublasLibrary*> library = LoadCublas();
  // Skipped only where there is no cuBLAS to open; one without a function fails.
  if (library.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << library.status().ToString();
  }
  ASSERT_TRUE(library.ok()) << library.status().ToString();
  EXPECT_TRUE(ProcessHasLoaded(CublasFileName()));
  EXPECT_NE((*library)->create, nullptr);
  EXPECT_NE((*library)->destroy, nullptr);
  EXPECT_NE((*library)->set_stream, nullptr);
  EXPECT_NE((*library)->gemm_ex, nullptr);
  EXPECT_NE((*library)->status_string, nullptr);
  EXPECT_STREQ(Cublas().status_name(CUBLAS_STATUS_NOT_INITIALIZED),
               "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(LoadCublas().value(), *library) << "opened once per process";
}

}  // namespace
}  // namespace lockstep::kernels::cuda

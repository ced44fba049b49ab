// Row-major f32 GEMMs as a plan's steps run them: through cuBLAS, or on the host (emulated plans).
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <string>

#include "graphfuse/status.h"

namespace graphfuse::cuda {

// C[M,N] (row stride ldc) = A[M,K] (lda) * B[K,N] (ldb); with trans_b, B is stored [N,K] (ldb)
// and C = A B^T. `batch` > 1 steps each operand by its stride. Through cuBLAS on `blas`, or on
// the host accumulating in double when `blas` is null. `where` names the call in errors.
struct Sgemm {
  cublasHandle_t blas = nullptr;

  Status operator()(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b,
                    int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c, int64_t batch,
                    const std::string& where, bool trans_b = false) const;
};

}  // namespace graphfuse::cuda

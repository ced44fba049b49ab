// Row-major GEMMs as a plan's steps run them: through cuBLAS, or on the host (emulated plans).
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <string>

#include "graphfuse/dtype.h"
#include "graphfuse/status.h"

namespace graphfuse::cuda {

// C[M,N] (row stride ldc) = A[M,K] (lda) * B[K,N] (ldb); with trans_b, B is stored [N,K] (ldb)
// and C = A B^T. `batch` > 1 steps each operand by its stride (strides and leading dims count
// elements). A and B are `ab` (f32, f16 or bf16), C is `c` (the same, or f32); products are
// summed in f32 (cuBLAS's CUBLAS_COMPUTE_32F; f32 operands through cublasSgemm, without TF32)
// and C is rounded once when stored. Through cuBLAS on `blas`, or on the host accumulating in
// double when `blas` is null. `where` names the call in errors.
struct Gemm {
  cublasHandle_t blas = nullptr;
  DType ab = DType::kF32;
  DType c = DType::kF32;

  Status operator()(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                    int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
                    const std::string& where, bool trans_b = false) const;
};

// Whether Gemm takes operands of `ab` with a result of `c`.
bool GemmTakes(DType ab, DType c);

}  // namespace graphfuse::cuda

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
// summed in f32 (cuBLAS's CUBLAS_COMPUTE_32F; f32 operands through cublasSgemm, without TF32
// unless `tf32`) and C is rounded once when stored. Through cuBLAS on `blas`, or on the host
// accumulating in double when `blas` is null. `where` names the call in errors.
struct Gemm {
  cublasHandle_t blas = nullptr;
  DType ab = DType::kF32;
  DType c = DType::kF32;
  // f32 operands only: CUBLAS_COMPUTE_32F_FAST_TF32 (the tensor cores round A and B to TF32's
  // 10-bit mantissa); on the host, A and B are rounded so (RoundToTf32) before the sum.
  bool tf32 = false;

  Status operator()(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                    int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
                    const std::string& where, bool trans_b = false) const;
};

// The host's emulation of one cuBLASLt call with C = D's shape and beta = 1 (cuda_gemm_plan.cc):
// row-major D[M,N] = A[M,K] W[K,N] + bias[N] + C[M,N], every matrix contiguous; A, W, C and D
// of g.ab (== g.c), bias (optional) of the same dtype, C optional. Products and the additions
// summed in double (A and W rounded to TF32 first with g.tf32), D rounded once.
void HostGemmAddend(const Gemm& g, int64_t m, int64_t n, int64_t k, const void* a, const void* w, const void* bias,
                    const void* c, void* d);

// `x` rounded to TF32 (8-bit exponent, 10-bit mantissa; to nearest, ties to even), kept in a
// float. NaN and infinities pass through.
float RoundToTf32(float x);

// Whether Gemm takes operands of `ab` with a result of `c`.
bool GemmTakes(DType ab, DType c);

}  // namespace graphfuse::cuda

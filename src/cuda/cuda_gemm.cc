#include "cuda/cuda_gemm.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "cuda/cuda_status.h"

namespace graphfuse::cuda {
namespace {

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// cuBLAS is column-major: row-major C = A B is computed as C^T = B^T A^T; with trans_b,
// C^T = op_T(B's storage) A^T.
Status RowMajorGemm(cublasHandle_t h, const Gemm& g, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c, int64_t ldc,
                    int64_t stride_c, int64_t batch, const std::string& where, bool trans_b) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int in = static_cast<int>(n), im = static_cast<int>(m), ik = static_cast<int>(k);
  if (g.ab == DType::kF32 && g.c == DType::kF32 && !g.tf32) {
    const auto* fa = static_cast<const float*>(a);
    const auto* fb = static_cast<const float*>(b);
    auto* fc = static_cast<float*>(c);
    if (batch == 1) {
      GF_BLAS(cublasSgemm(h, op_b, CUBLAS_OP_N, in, im, ik, &one, fb, static_cast<int>(ldb), fa, static_cast<int>(lda),
                          &zero, fc, static_cast<int>(ldc)),
              where);
      return Status::Ok();
    }
    GF_BLAS(cublasSgemmStridedBatched(h, op_b, CUBLAS_OP_N, in, im, ik, &one, fb, static_cast<int>(ldb), stride_b, fa,
                                      static_cast<int>(lda), stride_a, &zero, fc, static_cast<int>(ldc), stride_c,
                                      static_cast<int>(batch)),
            where);
    return Status::Ok();
  }
  const cudaDataType_t tab = CudaType(g.ab), tc = CudaType(g.c);
  const cublasComputeType_t compute =
      g.ab == DType::kF32 && g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (batch == 1) {
    GF_BLAS(cublasGemmEx(h, op_b, CUBLAS_OP_N, in, im, ik, &one, b, tab, static_cast<int>(ldb), a, tab,
                         static_cast<int>(lda), &zero, c, tc, static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
            where);
    return Status::Ok();
  }
  GF_BLAS(cublasGemmStridedBatchedEx(h, op_b, CUBLAS_OP_N, in, im, ik, &one, b, tab, static_cast<int>(ldb), stride_b, a,
                                     tab, static_cast<int>(lda), stride_a, &zero, c, tc, static_cast<int>(ldc),
                                     stride_c, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
          where);
  return Status::Ok();
}

float Load(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::kF16: return F16BitsToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return BF16BitsToF32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void Store(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kF16: static_cast<uint16_t*>(p)[i] = F32ToF16Bits(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = F32ToBF16Bits(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// An operand of g as the GEMM multiplies it: TF32-rounded f32 with g.tf32.
float LoadOperand(const Gemm& g, const void* p, int64_t i) {
  const float v = Load(p, i, g.ab);
  return g.tf32 && g.ab == DType::kF32 ? RoundToTf32(v) : v;
}

// The same arithmetic on the host, accumulating in double, C rounded once.
void HostGemm(const Gemm& g, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, int64_t stride_a,
              const void* b, int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
              bool trans_b) {
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q)
          acc += static_cast<double>(LoadOperand(g, a, t * stride_a + i * lda + q)) *
                 LoadOperand(g, b, t * stride_b + (trans_b ? j * ldb + q : q * ldb + j));
        Store(c, t * stride_c + i * ldc + j, g.c, static_cast<float>(acc));
      }
}

}  // namespace

float RoundToTf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0xFFFu + ((u >> 13) & 1u);  // to nearest, ties to even, on the 13 bits dropped
  return std::bit_cast<float>(u & ~0x1FFFu);
}

void HostGemmAddend(const Gemm& g, int64_t m, int64_t n, int64_t k, const void* a, const void* w, const void* bias,
                    const void* c, void* d) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < k; ++q)
        acc += static_cast<double>(LoadOperand(g, a, i * k + q)) * LoadOperand(g, w, q * n + j);
      if (bias) acc += Load(bias, j, g.c);
      if (c) acc += Load(c, i * n + j, g.c);
      Store(d, i * n + j, g.c, static_cast<float>(acc));
    }
}

bool GemmTakes(DType ab, DType c) { return IsFloat(ab) && (c == ab || c == DType::kF32); }

Status Gemm::operator()(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                        int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
                        const std::string& where, bool trans_b) const {
  if (!GemmTakes(ab, this->c))
    return Unimplemented(where, ": a GEMM of ", DTypeName(ab), " operands into ", DTypeName(this->c));
  if (!blas) {
    HostGemm(*this, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, trans_b);
    return Status::Ok();
  }
  return RowMajorGemm(blas, *this, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, where,
                      trans_b);
}

}  // namespace graphfuse::cuda

#include "cuda_gemm.h"

#include "cuda_status.h"

namespace graphfuse::cuda {
namespace {

// cuBLAS is column-major: row-major C = A B is computed as C^T = B^T A^T; with trans_b,
// C^T = op_T(B's storage) A^T.
Status RowMajorSgemm(cublasHandle_t h, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a,
                     const float* b, int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c,
                     int64_t batch, const std::string& where, bool trans_b) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    GF_BLAS(cublasSgemm(h, op_b, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b,
                        static_cast<int>(ldb), a, static_cast<int>(lda), &zero, c, static_cast<int>(ldc)),
            where);
    return Status::Ok();
  }
  GF_BLAS(cublasSgemmStridedBatched(h, op_b, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                    &one, b, static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a, &zero,
                                    c, static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
          where);
  return Status::Ok();
}

// The same arithmetic on the host, accumulating in double.
void HostSgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b,
               int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c, int64_t batch, bool trans_b) {
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q)
          acc += static_cast<double>(a[t * stride_a + i * lda + q]) *
                 b[t * stride_b + (trans_b ? j * ldb + q : q * ldb + j)];
        c[t * stride_c + i * ldc + j] = static_cast<float>(acc);
      }
}

}  // namespace

Status Sgemm::operator()(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b,
                         int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c, int64_t batch,
                         const std::string& where, bool trans_b) const {
  if (!blas) {
    HostSgemm(m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, trans_b);
    return Status::Ok();
  }
  return RowMajorSgemm(blas, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, where, trans_b);
}

}  // namespace graphfuse::cuda

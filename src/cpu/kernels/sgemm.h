// The GEMMs whose operands are both computed (attention's products, a MatMul or Gemm of two
// activations, a FusedGemm whose weights are not constant): oneDNN's sgemm, whose JIT kernels
// are chosen from the CPU's instruction sets (AVX2, AVX-512, AMX), so no CPU model has to be
// known to it and nothing is set for the process. Each call runs on the calling thread; the
// kernels spread their calls over graphfuse's pool.
#pragma once

#include <cstdint>

namespace graphfuse::kernels {

// oneDNN runs a primitive inline on the calling thread when that thread's OpenMP setting is one
// thread (the pool already spreads the work). The setting is the thread's, and the calling
// thread may be the program's: it is put back as it was.
class OneOmpThread {
 public:
  OneOmpThread();
  ~OneOmpThread();
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int previous_;
};

// C[m, n] = alpha * op(A) @ op(B) + beta * C, row-major (op: transposed when ta / tb), with
// leading dimensions lda, ldb, ldc, on the calling thread. beta = 0 ignores C's old values.
void Sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace graphfuse::kernels

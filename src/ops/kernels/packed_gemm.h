// GEMMs against constant weights packed once (oneDNN's matmul with weights in the layout it
// prefers, reordered when the plan is compiled), so no call repacks the weights: OpenBLAS
// spends about half of a LLaMA-7B block at M=32 packing them on every call (perf), and
// oneDNN with packed weights measured 3.1x faster than OpenBLAS at M=1 and 1.1-1.2x at
// M=32..512 on these machines (bench/RESULTS.md).
//
// The columns are cut into fixed blocks; RunBlock computes one block on the calling thread
// (oneDNN's own OpenMP threading is held to one thread there), so the caller spreads blocks
// over graphfuse's pool: one thread pool, as everywhere else.
#pragma once

#include <cstdint>
#include <memory>

#include "graphfuse/status.h"

namespace graphfuse::kernels {

class PackedGemm {
 public:
  // What the GEMM does with a second operand R[m, n], laid out as C (leading dimension ldc) and
  // given to RunBlock, as it stores each block: C = A @ B + R or C = (A @ B) * R (oneDNN's
  // binary post-ops). The product is rounded to f32 first and the result once more, so C has
  // the bits of MatMul then Add / Mul.
  enum class Store { kPlain, kAdd, kMul };
  // C[m, n] = A[m, k] @ B[k, n]; B read with leading dimension ldb (copied: B may go away),
  // A with lda = k, C written with leading dimension ldc.
  // block_cols > 0 sets the width of the column blocks (else BlockCols in packed_gemm.cc).
  static Result<std::shared_ptr<const PackedGemm>> Create(int64_t m, int64_t k, int64_t n, const float* b, int64_t ldb,
                                                          int64_t ldc, Store store = Store::kPlain,
                                                          int64_t block_cols = 0);
  ~PackedGemm();
  int64_t blocks() const;
  int64_t block_cols() const;  // every block but the last one
  // Columns [block * block_cols(), ...) of C (and of r, which kAdd and kMul need and kPlain
  // ignores; r may be C itself).
  void RunBlock(int64_t block, const float* a, float* c, const float* r = nullptr) const;

 private:
  PackedGemm();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The per-core L2 size in bytes (glibc reads it from CPUID); 2 MiB where it is not known. The
// packed blocks' widths and the attention's head groups scale with it.
int64_t L2Bytes();

}  // namespace graphfuse::kernels

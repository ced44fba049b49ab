// FusedGemm's geometry (the attributes are documented in src/cpu/kernels/fused_gemm.cc),
// shared by its inference (fused_gemm.cc), the CPU kernel and the passes that read FusedGemm
// nodes.
#pragma once

#include <cstdint>
#include <string>

#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse::schemas {

// A [M, K] x [K, S*N] GEMM split into S projections of N columns each.
struct GemmGeometry {
  int64_t m = 0, k = 0, n = 0, splits = 1;
  Shape out_shape;  // A.shape[:-1] + [N]
};

// The geometry of A (rank >= 2, its rows flattened into M) times 2-D weights W split into
// `splits` equal projections; errors name `where`, and dimensions over the BLAS int range
// are refused.
Result<GemmGeometry> Geometry(const std::string& where, const Shape& a, const Shape& w, int64_t splits);

}  // namespace graphfuse::schemas

// FusedGemm's attributes and geometry (the attributes are documented in
// src/cpu/kernels/fused_gemm.cc), shared by its inference (fused_gemm.cc), the CPU kernel, the
// CUDA backend and the passes that form or read FusedGemm nodes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse::schemas {

// The attributes that are FusedGemm's own, typed; Read and WriteTo are the only code that names
// their keys. (kernel_name and reference, which every fused op carries, stay with the code
// that writes them for all fused ops.)
struct FusedGemmAttrs {
  int64_t splits = 1;             // S: the weights' columns are S projections of N each
  std::vector<int64_t> out_proj;  // per output: projection s >= 0, or -1 for the epilogue's next output
  std::shared_ptr<const Graph> epilogue;  // the elementwise epilogue, or null
  int64_t row_scale = -1;                 // the input of each row's scale (a folded RMSNorm's 1/rms), or -1
  std::optional<float> rms_epsilon;       // set: a last output holds each row's 1/rms of output 0

  // Absent attributes read as the defaults above (an rms_epsilon present but not a number as 1e-6).
  static FusedGemmAttrs Read(const AttributeMap& attrs);
  static FusedGemmAttrs Read(const Node& node) { return Read(node.attrs()); }
  // Sets splits and out_proj; sets epilogue, row_scale and rms_epsilon when present here and
  // erases them otherwise. Other keys of `attrs` are kept.
  void WriteTo(AttributeMap& attrs) const;
};

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

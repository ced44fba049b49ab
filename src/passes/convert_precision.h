// A model computing in f16 or bf16: the graph rebuilt with its float values in that dtype.
#pragma once

#include <memory>

#include "graphfuse/dtype.h"
#include "graphfuse/graph.h"
#include "graphfuse/status.h"

namespace graphfuse {

// `src` (not yet through the pass pipeline) with every f32 value in `dt` (f16 or bf16):
//   - f32 constants are converted once (rounded to nearest even), as weights load;
//   - f32 inputs keep their type and are cast to dt where read; f32 outputs are cast back from
//     dt, keeping their names, so callers give and get what the model declares;
//   - each node is rebuilt on its converted inputs; a Cast to f32 of a float becomes a Cast to dt.
// Kernels then load dt, compute in f32 and round what they store. dt == f32 gives a copy.
//
// With `narrow_io`, f32 inputs and outputs take dt themselves instead (no casts at the edges):
// the form a serving stack runs, whose activations arrive and leave in the narrow dtype.
struct PrecisionOptions {
  bool narrow_io = false;
};
Result<std::unique_ptr<Graph>> ConvertPrecision(const Graph& src, DType dt, const PrecisionOptions& options = {});

}  // namespace graphfuse

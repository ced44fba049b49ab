// The float64 reference of a whole elementwise graph at chosen output elements: every op-table
// node evaluated in double (int64 for integer data) with broadcasting, as ReferenceOp does for
// one op. Benchmarks and tests check fused plans against it.
#pragma once

#include <span>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse {

// Values of every graph output at flat element `index` of that output. Graph outputs must all
// have the same shape. Errors for nodes outside the op table.
Result<std::vector<double>> ReferenceEvalAt(const Graph& g, std::span<const TensorView> inputs, int64_t index);

}  // namespace graphfuse

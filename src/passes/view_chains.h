// SimplifyViewChains (view_chains.cc): chains of views, Transposes and one-index Gathers become
// at most a Slice of columns, a Reshape and a Transpose. Part of Canonicalize.
#pragma once

#include "graphfuse/graph.h"
#include "graphfuse/status.h"

namespace graphfuse {

// Returns the number of chains rewritten.
Result<int> SimplifyViewChains(Graph& g);

}  // namespace graphfuse

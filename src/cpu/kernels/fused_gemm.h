// FusedGemm's CPU kernel (fused_gemm.cc), as the planner and `graphfuse explain` see it.
#pragma once

#include <string>

#include "graphfuse/graph.h"

namespace graphfuse::kernels {

// How a FusedGemm node's epilogue runs on the CPU, in words: added as the GEMM stores (a store
// chain of biases and residuals), finished per block while the block is in L2 (the gated and
// bias-activation forms), or a pass over whole rows after the GEMMs. The forms that need packed
// weights apply when the weights are constant; the words describe the plan, and a packing oneDNN
// refuses at run time falls back to the pass. Empty for a node without an epilogue.
std::string FusedGemmEpilogueForm(const Node& node);

}  // namespace graphfuse::kernels

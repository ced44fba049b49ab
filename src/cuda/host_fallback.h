// A node with no GPU path runs its CPU kernel between a download of its inputs and an upload of
// its outputs, on the plan's stream (reported; refused under CUDA-graph capture).
#pragma once

#include "cuda/plan_builder.h"

namespace graphfuse::cuda {

// Appends the host step for `n`; `why` (the reason it has no GPU path) goes into its line.
Status PlanHostFallback(PlanBuilder& pb, const Node& n, const Status& why);

}  // namespace graphfuse::cuda

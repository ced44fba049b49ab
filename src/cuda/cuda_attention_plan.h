// FusedAttention with many query rows per head, as GEMMs (codegen.h, GenerateAttentionGemmKernels):
// the generated prep kernel copies q / k / v per head into pooled scratch (roped), cuBLAS
// computes q k^T over every head, the generated softmax runs in place on the scores, and cuBLAS
// p v stores each head's rows into the output's layout. FusedCachedAttention at decode: the
// split and combine kernels (codegen.h, GenerateDecodeAttentionKernels) around pooled scratch
// for the partials.
#pragma once

#include "cuda/plan_builder.h"

namespace graphfuse::cuda {

// Appends the steps of `n` as `plan` (CudaPath::kAttentionGemms) lays them out.
Status PlanAttentionGemms(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan);

// Appends the steps of a FusedCachedAttention planned as CudaPath::kDecodeAttention: the split
// kernel (writing the present rows and the partials to pooled scratch), then the combine kernel.
Status PlanDecodeAttention(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan);

}  // namespace graphfuse::cuda

// GEMM nodes on the GPU (CudaPath::kCublas, kCublasThenKernel): MatMul through cuBLAS; a
// FusedGemm through one cuBLASLt call where its epilogue enum and C operand compute the group
// exactly (bias / activation; a residual as C with beta = 1, the residual read in place), else
// cuBLAS then the generated epilogue kernel. A FusedGemm's projections (q/k/v) that are
// node outputs of their own go into one [S, M, N] block written by one strided-batched call
// (few rows) or one call each (many rows); the others go to a pooled workspace the epilogue
// reads.
#pragma once

#include "cuda/plan_builder.h"

namespace graphfuse::cuda {

// Appends the steps of MatMul / FusedGemm node `n` (any other op runs on the host).
Status PlanGemm(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan);

}  // namespace graphfuse::cuda

// The CPU kernel list of each op family, one file each under src/cpu/kernels/;
// src/cpu/kernel_registry.cc concatenates them.
#pragma once

#include <vector>

#include "cpu/kernel_registry.h"

namespace graphfuse::kernels {

std::vector<CpuKernel> ElementwiseKernels();   // elementwise.cc (the op table's rows, FusedElementwise)
std::vector<CpuKernel> GemmKernels();          // gemm.cc
std::vector<CpuKernel> NormKernels();          // norm.cc
std::vector<CpuKernel> SoftmaxKernels();       // softmax.cc
std::vector<CpuKernel> ReduceKernels();        // reduce.cc
std::vector<CpuKernel> DataMovementKernels();  // data_movement.cc
std::vector<CpuKernel> ShapeOpKernels();       // shape_ops.cc (the ops that are not views)
std::vector<CpuKernel> RopeKernels();          // rope.cc
std::vector<CpuKernel> AttentionKernels();     // attention.cc (FusedAttention)
std::vector<CpuKernel> AttentionCacheKernels();  // attention_cache.cc (FusedCachedAttention)
std::vector<CpuKernel> FusedRowwiseKernels();  // fused_rowwise.cc (FusedNorm, FusedSoftmax)
std::vector<CpuKernel> FusedGemmKernels();     // fused_gemm.cc (FusedGemm)

}  // namespace graphfuse::kernels

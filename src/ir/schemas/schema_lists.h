// The schema list of each non-elementwise op family, one file each under src/ir/schemas/;
// op_registry.cc concatenates them in this order.
#pragma once

#include <vector>

#include "ir/op_registry.h"

namespace graphfuse::schemas {

std::vector<OpSchema> GemmSchemas();          // gemm.cc (MatMul, Gemm)
std::vector<OpSchema> NormSchemas();          // norm.cc (LayerNormalization, RMSNorm)
std::vector<OpSchema> SoftmaxSchemas();       // softmax.cc (Softmax, LogSoftmax)
std::vector<OpSchema> ReduceSchemas();        // reduce.cc (ReduceSum, ReduceMean, ReduceMax, ..., ArgMax)
std::vector<OpSchema> DataMovementSchemas();  // data_movement.cc (Transpose, Concat, Split, ...)
std::vector<OpSchema> ShapeOpSchemas();       // shape_ops.cc (Reshape, Shape, Constant, Range, ...)
std::vector<OpSchema> RopeSchemas();          // rope.cc (Rope)
std::vector<OpSchema> AttentionSchemas();     // attention.cc (FusedAttention)
std::vector<OpSchema> AttentionCacheSchemas();  // attention_cache.cc (FusedCachedAttention)
std::vector<OpSchema> FusedRowwiseSchemas();  // fused_rowwise.cc (FusedNorm, FusedSoftmax)
std::vector<OpSchema> FusedGemmSchemas();     // fused_gemm.cc (FusedGemm)

}  // namespace graphfuse::schemas

// MatMul's and Gemm's shape rules, shared by their inference (gemm.cc) and the CPU kernels.
#pragma once

#include <cstdint>
#include <string>

#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse::schemas {

// Operand shapes with 1-D operands promoted as numpy does: A [K] -> [1,K], B [K] -> [K,1].
struct MatMulDims {
  Shape a, b;       // promoted, rank >= 2
  Shape batch;      // broadcast of the batch dims
  int64_t m = 0, k = 0, n = 0;
  Shape out;
};

// MatMul's dims (numpy matmul semantics); errors name `where`.
Result<MatMulDims> MatMulShapes(const Shape& a_in, const Shape& b_in, const std::string& where);

// Gemm's op(A) [m, k] and op(B) [k, n].
struct GemmDims {
  int64_t m, k, n;
};

// Gemm's dims with transA / transB applied; C (when given) must broadcast to [m, n].
Result<GemmDims> GemmShapes(const Shape& a, const Shape& b, const Shape* c, bool ta, bool tb,
                            const std::string& where);

}  // namespace graphfuse::schemas

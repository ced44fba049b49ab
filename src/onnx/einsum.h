// ONNX Einsum lowered to existing ops at import (Transpose, ReduceSum, Reshape, MatMul, Mul), so
// that the GEMM path and the fusion passes see an ordinary MatMul or elementwise product.
//
// Supported: one or two operands, explicit ("bhqd,bhkd->bhqk") or implicit ("ij,jk") output,
// an ellipsis ("...ij,...jk->...ik", broadcast like numpy). One operand: sums over the labels
// the output drops, then a transpose ("ij->ji", "ij->i", "ij->"). Two operands: each operand's
// own dropped labels are summed first; the labels both keep in the output are batch dims, the
// ones both drop are contracted by one MatMul (a Mul when none is contracted: outer and
// elementwise products), and a final Reshape / Transpose puts the output in order. Refused
// (Unimplemented, naming the equation): three or more operands, a label repeated within one
// operand (a diagonal), and a contracted ellipsis dim of size 1 against a larger one.
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse::onnx_import {

// One op of the lowering. Operand i < n (n = the number of Einsum inputs) is Einsum input i;
// operand n + k is the output of step k.
struct EinsumStep {
  std::string op;              // Transpose, ReduceSum, Reshape, MatMul or Mul
  std::vector<int> inputs;
  AttributeMap attrs;          // Transpose: perm; ReduceSum: axes, keepdims = 0
  std::vector<int64_t> shape;  // Reshape: the target shape (its second input, a constant)
};

// The steps that compute `equation` over inputs of `shapes`; the last step's output is the
// result, and no steps means the result is input 0 as it is. InvalidArgument for a malformed
// equation or shapes that do not fit it.
Result<std::vector<EinsumStep>> LowerEinsum(const std::string& equation, const std::vector<Shape>& shapes);

}  // namespace graphfuse::onnx_import

// A model's input signature (dims fixed or symbolic, inputs whose values become shapes) and the
// binding of one call's inputs to it: the key a plan is specialized and cached for.
//
//   declared   input_ids i64[batch, seq], attention_mask i64[batch, seq], shape i64[3] (values)
//   a call     input_ids i64[2,7], attention_mask i64[2,7], shape = {2,7,64}
//   binding    shapes {[2,7], [2,7], [3]}, values {shape: {2,7,64}}, symbols {batch: 2, seq: 7}
//   key        "i64[2,7];i64[2,7];i64[3]={2,7,64}"
//
// Every contradiction is an InvalidArgument naming the input and the dim: a wrong input count,
// dtype or rank, a fixed dim given another size, two inputs disagreeing on one symbolic dim,
// values that cannot become shapes, and inputs larger than the machine's memory. Nothing is
// planned for a binding that fails.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graphfuse/dtype.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

// A declared dim: fixed (value >= 0), or symbolic: named by `param` (every dim of that name
// takes one size in a call), or unnamed (param empty; any size).
struct DeclDim {
  int64_t value = -1;
  std::string param;
  bool fixed() const { return value >= 0; }
};

// A declared graph input or output.
struct TensorDecl {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<DeclDim> dims;
  // Inputs only: its values become a shape, axes, repeats, bounds or a count somewhere in the
  // graph (`value_use` names the first such operand): a plan is made for each set of values.
  bool values_shape_plan = false;
  std::string value_use;
};

// Integer inputs whose values become shapes are read at each call; larger ones are refused
// (they would make a plan per call).
inline constexpr int64_t kMaxShapeValueElements = 1024;

struct InputBinding {
  std::vector<Shape> shapes;                            // one per declared input
  std::vector<std::shared_ptr<const Tensor>> values;   // one per declared input; set where
                                                        // values_shape_plan
  std::map<std::string, int64_t> symbols;              // each named dim's size
  std::string key;                                     // the plan cache key
};

// "i64[batch,seq]" for messages and listings.
std::string DeclString(const TensorDecl& d);

// Whether every dim is fixed and no input's values become shapes: one plan serves every call.
bool IsStaticSignature(std::span<const TensorDecl> decls);

// Binds one call's inputs (one per declared input, in order).
Result<InputBinding> BindInputs(std::span<const TensorDecl> decls, std::span<const TensorView> inputs);

// Binds shapes given on a command line: `flags` maps an input name to its full shape, or a
// dim name to its size (--shape input_ids=1x16, --shape seq=16). Fixed dims need not be given;
// every symbolic one must be. Inputs whose values become shapes cannot be bound this way.
Result<InputBinding> BindShapes(std::span<const TensorDecl> decls, const std::map<std::string, Shape>& flags);

// Parses "NAME=D0xD1x..." (a scalar: "NAME=" or "NAME=[]") into `flags`; errors name the flag.
Status ParseShapeFlag(const std::string& text, std::map<std::string, Shape>* flags);

// Refuses a tensor of `shape` and `dtype` larger than this machine's physical memory;
// `what` names it ("input 'x'", "value 'y' of node 'n' (Expand)").
Status CheckFitsInMemory(const std::string& what, DType dtype, const Shape& shape);

}  // namespace graphfuse

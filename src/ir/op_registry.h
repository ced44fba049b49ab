// The op registry: for every op the IR knows, its arity and type/shape inference (the op's
// semantics; no backend). Elementwise ops come from the op table (include/graphfuse/ops.def);
// the others (GEMM, norms, softmax, reductions, data movement, shape ops, the fused ops) are
// registered by src/ir/schemas/*.cc and src/ir/fused_schema.cc. Each backend keeps its own
// kernel registry (the CPU's: src/cpu/kernel_registry.h).
//
// The registry is an immutable table built once; nothing registers at run time.
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/ops.h"

namespace graphfuse {

// What inference sees of a node that may not exist yet.
struct InferContext {
  const std::string& op;
  const std::vector<Value*>& inputs;  // nullptr = omitted optional input
  const AttributeMap& attrs;

  Value* input(size_t i) const { return i < inputs.size() ? inputs[i] : nullptr; }
  // Constant data of input i, or nullptr if it is absent or not a constant.
  const Tensor* ConstInput(size_t i) const;
  // Constant input i read as int64 values (for shape-like inputs: Reshape's shape, Slice's
  // starts, ...); an error naming the op and input when it is absent or not constant.
  Result<std::vector<int64_t>> ConstInts(size_t i, const char* what) const;
  int64_t GetInt(const std::string& k, int64_t def) const;
  float GetFloat(const std::string& k, float def) const;
  std::vector<int64_t> GetInts(const std::string& k, const std::vector<int64_t>& def = {}) const;
  bool HasAttr(const std::string& k) const { return attrs.count(k) != 0; }
  // "op Reshape (inputs f32[2,3], i64[2])": prefix for error messages.
  std::string Describe() const;
};

using InferFn = Result<std::vector<ValueType>> (*)(const InferContext& ctx);

struct OpSchema {
  const char* name;
  int min_inputs;
  int max_inputs;
  int num_outputs;      // -1: as many as the node asks for (Split)
  InferFn infer;
  bool view = false;    // output 0 is input 0's buffer reinterpreted (Reshape, Squeeze, ...): no launch
  bool elementwise = false;  // a row of the op table
};

const OpSchema* FindSchema(const std::string& op);
// The schema of a known op (nullptr for op::kUnknown): an array lookup.
const OpSchema* FindSchema(op::Id op);
std::vector<const OpSchema*> AllSchemas();

// Schemas of the op table's rows and of FusedElementwise; the other families' lists are
// declared in src/ir/schemas/schema_lists.h.
std::vector<OpSchema> ElementwiseSchemas();  // src/ir/elementwise_schema.cc
std::vector<OpSchema> FusedSchemas();        // src/ir/fused_schema.cc

// OpAttrs of an elementwise node from its attribute map (alpha, beta, to, seed, training).
OpAttrs ElementwiseAttrs(OpKind kind, const AttributeMap& attrs);

}  // namespace graphfuse

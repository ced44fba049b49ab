// The op registry: for every op the IR knows, its arity, type/shape inference and CPU kernel.
// Elementwise ops come from the op table (include/graphfuse/ops.def); the others (GEMM, norms, softmax,
// reductions, data movement, shape ops) are registered by src/cpu/kernels/*.cc.
//
// The registry is an immutable table built once; nothing registers at run time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/graph.h"

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

// What a kernel sees: the node and views of its input and output buffers (data of omitted
// optional inputs is null; outputs are preallocated with the inferred types).
struct KernelContext {
  const Node& node;
  std::span<const TensorView> inputs;
  std::span<const TensorView> outputs;
  const CpuContext& cpu;
  const void* state = nullptr;  // what the schema's `prepare` made for this node (null if none)
};

using InferFn = Result<std::vector<ValueType>> (*)(const InferContext& ctx);
using KernelFn = Status (*)(const KernelContext& ctx);
// Work done once per node when a plan is compiled (weights packed for the GEMM, ...). The
// kernel must also run without it (nullptr state: constant folding, one-off runs).
using PrepareFn = Result<std::shared_ptr<const void>> (*)(const Node& node);

struct OpSchema {
  const char* name;
  int min_inputs;
  int max_inputs;
  int num_outputs;      // -1: as many as the node asks for (Split)
  InferFn infer;
  KernelFn kernel;      // nullptr for ops that are only views (see `view`) or compile-time only
  bool view = false;    // output 0 is input 0's buffer reinterpreted (Reshape, Squeeze, ...): no launch
  bool elementwise = false;
  PrepareFn prepare = nullptr;
};

const OpSchema* FindSchema(const std::string& op);
std::vector<const OpSchema*> AllSchemas();

// Schemas contributed by each family (one file each under src/cpu/kernels/ and src/ir/).
std::vector<OpSchema> ElementwiseSchemas();   // src/ir/elementwise_schema.cc
std::vector<OpSchema> NonElementwiseSchemas();  // src/cpu/kernels/registry_list.cc
std::vector<OpSchema> FusedSchemas();           // src/ir/fused_schema.cc

// OpAttrs of an elementwise node from its attribute map (alpha, beta, to, seed, training).
OpAttrs ElementwiseAttrs(OpKind kind, const AttributeMap& attrs);

}  // namespace graphfuse

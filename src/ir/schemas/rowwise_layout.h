// How FusedNorm and FusedSoftmax nodes map their inputs and outputs onto their bodies (the
// attributes documented in src/cpu/kernels/fused_rowwise.cc). Read by the nodes' inference
// (fused_rowwise.cc), the CPU kernels and the CUDA code generator, so that both backends agree
// on one layout.
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse::schemas {

// A graph-valued attribute, or null.
const Graph* GraphAttr(const AttributeMap& attrs, const char* key);

// The dtypes a layout accepts for the row op's rows (the norm / softmax input, and the
// softmax epilogue's probabilities and output 0): f32 for the nodes' inference and the CPU
// kernels; any float dtype for the CUDA code generator, whose row kernels load f16 / bf16 rows
// into f32 and round what they store.
enum class RowDTypes { kF32, kAnyFloat };

struct NormLayout {
  const Graph* body = nullptr;
  bool layer_norm = false;
  int64_t norm_input = 0, prologue_outputs = 0;
  size_t body_inputs = 0, params = 0;
  const Value* x = nullptr;  // the body output the norm reads
};

Result<NormLayout> ReadNormLayout(const std::string& where, const AttributeMap& attrs, size_t num_inputs,
                                  RowDTypes rows = RowDTypes::kF32);

struct SoftmaxLayout {
  const Graph* prologue = nullptr;
  const Graph* epilogue = nullptr;
  int64_t softmax_input = 0, prologue_outputs = 0, epilogue_input = 0;
  size_t prologue_inputs = 1;  // node inputs read by the prologue (X alone without one)
  size_t main_outputs = 1;     // node outputs before the prologue's
  ValueType x;                 // the softmax input's type
};

Result<SoftmaxLayout> ReadSoftmaxLayout(const std::string& where, const AttributeMap& attrs,
                                        const std::vector<const Value*>& inputs, RowDTypes rows = RowDTypes::kF32);

}  // namespace graphfuse::schemas

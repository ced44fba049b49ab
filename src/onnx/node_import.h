// ONNX node -> graphfuse IR nodes: the 1:1 mapping for registry ops and the conversions for
// ops whose ONNX form differs from the IR's (see the table at the top of node_import.cc).
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/status.h"

namespace onnx {
class NodeProto;
class AttributeProto;
}  // namespace onnx

namespace graphfuse::onnx_import {

// One ONNX node on its way into the graph. Errors returned by the converters need not name
// the node: ImportNode's caller adds the file, node name and op_type.
// What a row of the importer's conversion table (node_import.cc) tells the conversion it
// names: ONNX's defaults for an activation's attributes, and the IR op a variadic or
// or-equal op is built from.
struct ConversionArgs {
  float alpha = 0.f, beta = 0.f;  // LeakyRelu, HardSigmoid, Elu, Selu: ONNX's defaults
  const char* beta_attr = nullptr;  // the ONNX attribute read as beta ("beta"; Selu: "gamma"), if any
  const char* binary = nullptr;   // Max, Min, Sum, Mean: the pairwise op; LessOrEqual: the strict one
  bool mean = false;              // Mean: the sum divided by the count
};

struct NodeImport {
  Graph& g;
  const onnx::NodeProto& proto;
  std::string name;             // the ONNX node name, or "OpType_<index>" when it has none
  std::vector<Value*> inputs;   // nullptr for omitted optional inputs ("" in ONNX)
  AttributeMap attrs;           // converted ONNX attributes
  int64_t opset;                // the model's default-domain opset
  // The IR op of the ONNX op's name (op::kUnknown for an ONNX op the IR builds from others),
  // and the conversion table row's arguments: set by ImportNode.
  op::Id id = op::kUnknown;
  ConversionArgs args;

  const std::string& op() const;
  // "node 'name' (OpType)"
  std::string Describe() const;
};

// Converts one ONNX attribute. `what` names it in errors.
Result<Attribute> ConvertAttribute(const onnx::AttributeProto& a, const std::string& what);

// Adds the IR node(s) that compute `n` to the graph; the node's ONNX outputs become values
// with their ONNX names.
Status ImportNode(NodeImport& n);

// ---- for the conversions (node_import.cc, opset23_import.cc) ----

// Output k's ONNX name, or "" when the node does not have it (or left it unnamed).
std::string OnnxOutput(const NodeImport& n, int k);
// Fails when the node asks for outputs beyond the first `supported`.
Status CheckOutputs(const NodeImport& n, int supported);
// Fails unless inputs [0, lo) are given and there are at most `hi`.
Status RequireInputs(const NodeImport& n, size_t lo, size_t hi);
// Adds one IR node, folded at once when its inputs are constants. The final node of a
// conversion carries the ONNX node's name and output 0's name; the others fresh names.
Result<Value*> Emit(NodeImport& n, const std::string& op, const std::vector<Value*>& ins, AttributeMap attrs,
                    bool final);
// Adds one IR node whose output is the ONNX node's output `k` (a second or third output).
Result<Value*> EmitOutput(NodeImport& n, int k, const std::string& op, const std::vector<Value*>& ins,
                          AttributeMap attrs);
// A scalar constant of `dtype`; a constant i64 vector named after `what`.
Result<Value*> ScalarConstant(NodeImport& n, DType dtype, double v);
Result<Value*> Int64sConstant(NodeImport& n, const std::string& what, const std::vector<int64_t>& v);

// The conversions of the ops opsets 22-24 add (opset23_import.cc): Attention, RotaryEmbedding,
// RMSNormalization, Swish.
Status ImportAttention(NodeImport& n);
Status ImportRotaryEmbedding(NodeImport& n);
Status ImportRmsNormalization(NodeImport& n);
Status ImportSwish(NodeImport& n);

}  // namespace graphfuse::onnx_import

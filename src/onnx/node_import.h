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
struct NodeImport {
  Graph& g;
  const onnx::NodeProto& proto;
  std::string name;             // the ONNX node name, or "OpType_<index>" when it has none
  std::vector<Value*> inputs;   // nullptr for omitted optional inputs ("" in ONNX)
  AttributeMap attrs;           // converted ONNX attributes
  int64_t opset;                // the model's default-domain opset

  const std::string& op() const;
  // "node 'name' (OpType)"
  std::string Describe() const;
};

// Converts one ONNX attribute. `what` names it in errors.
Result<Attribute> ConvertAttribute(const onnx::AttributeProto& a, const std::string& what);

// Adds the IR node(s) that compute `n` to the graph; the node's ONNX outputs become values
// with their ONNX names.
Status ImportNode(NodeImport& n);

}  // namespace graphfuse::onnx_import

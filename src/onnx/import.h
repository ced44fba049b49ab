// ONNX import: a ModelProto (opset 13-17, default domain) becomes a graphfuse Graph.
//
//   graph inputs that are not initializers -> Graph::AddInput (static shapes only)
//   initializers, Constant nodes            -> Graph::AddConstant
//   nodes                                   -> Graph::AddNode, 1:1 by op_type where the op
//                                              registry has the op with ONNX conventions; the
//                                              ops whose ONNX form differs are converted
//                                              (node_import.cc: Clip, Cast, Dropout, Sum, ...)
//   graph outputs                           -> Graph::MarkOutput (declared types checked)
//
// Values and nodes keep their ONNX names (a node without one becomes "OpType_<index>").
// Every error names the file (or label), and for node errors the node name and op_type:
// InvalidArgument for a malformed model, Unimplemented for a valid one graphfuse cannot run
// (unsupported op, element type, opset, dynamic dim, subgraph, external data). Malformed input
// never crashes the importer nor makes it allocate beyond the size of the input.
#pragma once

#include <memory>
#include <string>

#include "graphfuse/graph.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

// The default-domain opsets the importer accepts. The IR holds ops in their opset 13-17 form;
// nodes of other opsets whose form differs are rewritten to it as they are imported
// (node_import.cc, UpgradeForm).
inline constexpr int64_t kMinOnnxOpset = 7;
inline constexpr int64_t kMaxOnnxOpset = 21;

// Reads and imports an .onnx file (files over 2 GiB are refused).
Result<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path);

// Imports a serialized ModelProto; `label` stands for the file name in error messages.
Result<std::unique_ptr<Graph>> ImportOnnxBytes(const std::string& bytes, const std::string& label);

// Reads a serialized TensorProto (the input_*.pb / output_*.pb files of ONNX test data).
// `name`, when given, receives the tensor's name ("" when it has none).
Result<Tensor> ReadTensorProtoFile(const std::string& path, std::string* name = nullptr);

// Writes `t` as a serialized TensorProto (raw_data), named `name` when not empty.
Status WriteTensorProtoFile(const std::string& path, const Tensor& t, const std::string& name = "");

}  // namespace graphfuse

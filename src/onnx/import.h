// ONNX import: a ModelProto (opset 13-17, default domain) becomes a graphfuse Graph.
//
//   graph inputs that are not initializers -> Graph::AddInput with the shape bound for them
//                                              (OnnxModel::Instantiate), or a constant where
//                                              their values become shapes
//   initializers, Constant nodes            -> Graph::AddConstant
//   nodes                                   -> Graph::AddNode, 1:1 by op_type where the op
//                                              registry has the op with ONNX conventions; the
//                                              ops whose ONNX form differs are converted
//                                              (node_import.cc: Clip, Cast, Dropout, Sum, ...)
//   graph outputs                           -> Graph::MarkOutput (declared types checked)
//
// Values and nodes keep their ONNX names (a node without one becomes "OpType_<index>").
// Every error names the file (or label), and for node errors the node name and op_type:
// InvalidArgument for a malformed model (a bad external data reference among them),
// Unimplemented for a valid one graphfuse cannot run (unsupported op, element type, opset,
// dynamic dim, subgraph). Malformed input never crashes the importer nor makes it allocate
// beyond the size of the input.
#pragma once

#include <memory>
#include <string>

#include "graphfuse/graph.h"
#include "graphfuse/model.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"
#include "runtime/signature.h"

namespace onnx {
class ModelProto;
}

namespace graphfuse {

class PreparedStore;

// The default-domain opsets the importer accepts. The IR holds ops in their opset 13-17 form;
// nodes of other opsets whose form differs are rewritten to it as they are imported
// (node_import.cc, UpgradeForm).
inline constexpr int64_t kMinOnnxOpset = 1;
inline constexpr int64_t kMaxOnnxOpset = 24;

// A parsed model and its input signature, imported once per binding of its inputs: symbolic
// dims take the sizes of one call, and inputs whose values become shapes (a Reshape's shape, a
// Slice's starts, a Range's limit, ... reached through any computation that does not stop at
// a Shape or Size) become constants holding that call's values. The importer folds as it
// builds, so the shape arithmetic exporters write (Shape -> Gather -> Concat -> Reshape)
// becomes constants of the bound sizes, and the passes see a static graph.
class OnnxModel {
 public:
  // Parses and checks the signature (opset, input types and dims); nodes are imported per
  // binding by Instantiate. Initializers kept in external files (ONNX external data) are read
  // from `folder` (onnx_import::ExternalData): a file's own folder for FromFile; none given, a
  // model as bytes refuses them.
  static Result<std::shared_ptr<const OnnxModel>> FromBytes(const std::string& bytes, const std::string& label,
                                                            const std::string& folder = "");
  static Result<std::shared_ptr<const OnnxModel>> FromFile(const std::string& path);
  static Result<std::shared_ptr<const OnnxModel>> FromArray(const char* data, size_t size, const std::string& label,
                                                            const std::string& folder = "");
  ~OnnxModel();

  const std::string& label() const { return label_; }
  // The graph inputs that are not initializers, in order.
  const std::vector<TensorDecl>& inputs() const { return inputs_; }
  // The graph outputs as declared (dims may be symbolic or unnamed).
  const std::vector<TensorDecl>& outputs() const { return outputs_; }
  bool is_static() const { return IsStaticSignature(inputs_); }
  const ModelMetadata& metadata() const { return metadata_; }

  // The graph for one binding (BindInputs / BindShapes over inputs()).
  Result<std::unique_ptr<Graph>> Instantiate(const InputBinding& binding) const;
  // What plans derive from the weights, shared by every graph instantiated (each graph's
  // prepared_store()).
  const std::shared_ptr<PreparedStore>& prepared_store() const { return store_; }
  // The graph of a static model (every dim fixed, no input's values become shapes); for
  // another model, Unimplemented naming its first symbolic dim or value input.
  Result<std::unique_ptr<Graph>> InstantiateStatic() const;

 private:
  OnnxModel() = default;
  std::string label_;
  std::unique_ptr<onnx::ModelProto> proto_;
  int64_t opset_ = 0;
  std::vector<TensorDecl> inputs_, outputs_;
  ModelMetadata metadata_;
  // Converted once at load and shared by every graph instantiated.
  std::vector<std::pair<std::string, std::shared_ptr<const Tensor>>> initializers_;
  std::shared_ptr<PreparedStore> store_;
};

// Reads and imports an .onnx file of static shapes (files over 2 GiB are refused).
Result<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path);

// Imports a serialized ModelProto of static shapes; `label` stands for the file name in error
// messages.
Result<std::unique_ptr<Graph>> ImportOnnxBytes(const std::string& bytes, const std::string& label);

// Imports an .onnx file with its symbolic dims bound by command-line flags (BindShapes:
// "input=2x16" or "seq=16"); a static model needs none. `binding`, when given, receives the
// binding made.
Result<std::unique_ptr<Graph>> ImportOnnxFileWithShapes(const std::string& path,
                                                        const std::map<std::string, Shape>& shape_flags,
                                                        InputBinding* binding = nullptr);

// Reads a serialized TensorProto (the input_*.pb / output_*.pb files of ONNX test data).
// `name`, when given, receives the tensor's name ("" when it has none).
Result<Tensor> ReadTensorProtoFile(const std::string& path, std::string* name = nullptr);

// Writes `t` as a serialized TensorProto (raw_data), named `name` when not empty.
Status WriteTensorProtoFile(const std::string& path, const Tensor& t, const std::string& name = "");

}  // namespace graphfuse

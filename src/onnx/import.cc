#include "onnx/import.h"

#include <onnx/onnx_pb.h>

#include <cstdio>
#include <set>

#include "onnx/node_import.h"
#include "onnx/tensor_proto.h"

namespace graphfuse {
namespace {

using onnx_import::DTypeFromOnnx;
using onnx_import::kMaxImportDim;
using onnx_import::kMaxImportRank;
using onnx_import::kMaxProtoFileBytes;

// Adds "<label>: node 'n' (Op)" in front of a node's error unless the message already names it.
Status NodeContext(const Status& s, const std::string& label, const std::string& node_desc) {
  const std::string& m = s.message();
  const std::string prefix = m.find(node_desc.substr(0, node_desc.find(" ("))) != std::string::npos
                                 ? label
                                 : StrCat(label, ": ", node_desc);
  return s.WithContext(prefix);
}

Result<int64_t> DefaultOpset(const onnx::ModelProto& m) {
  int64_t opset = -1;
  std::string others;
  for (const auto& o : m.opset_import()) {
    if (!o.domain().empty() && o.domain() != "ai.onnx") {
      others += StrCat(others.empty() ? "" : ", ", "'", o.domain(), "'");
      continue;
    }
    if (opset >= 0) return InvalidArgument("the model imports the default ONNX domain twice");
    opset = o.version();
  }
  if (opset < 0 && others.empty()) return InvalidArgument("the model imports no opset (opset_import is empty)");
  if (opset < 0)
    return Unimplemented("the model imports only the op domains ", others,
                         ", not the default ONNX domain, which is all graphfuse supports");
  if (opset < kMinOnnxOpset || opset > kMaxOnnxOpset)
    return Unimplemented("opset ", opset, " is not supported (graphfuse imports opsets ", kMinOnnxOpset, "..",
                         kMaxOnnxOpset, "; convert the model with onnx.version_converter)");
  return opset;
}

// dtype and static shape of a graph input.
Result<ValueType> InputType(const onnx::ValueInfoProto& vi) {
  const std::string what = StrCat("input '", vi.name(), "'");
  if (!vi.type().has_tensor_type())
    return Unimplemented(what, " is not a tensor (sequences, maps and optionals are not supported)");
  const auto& tt = vi.type().tensor_type();
  auto dtype = DTypeFromOnnx(tt.elem_type());
  if (!dtype.ok()) return dtype.status().WithContext(what);
  if (!tt.has_shape()) return Unimplemented(what, " has no shape (graphfuse needs static shapes)");
  if (tt.shape().dim_size() > kMaxImportRank)
    return Unimplemented(what, " has rank ", tt.shape().dim_size(), ", more than the supported ", kMaxImportRank);
  Shape shape;
  for (int k = 0; k < tt.shape().dim_size(); ++k) {
    const auto& d = tt.shape().dim(k);
    if (d.has_dim_value()) {
      if (d.dim_value() < 0) return InvalidArgument(what, " has negative dim ", k, " (", d.dim_value(), ")");
      if (d.dim_value() > kMaxImportDim)
        return InvalidArgument(what, ": dim ", k, " is ", d.dim_value(), ", more than graphfuse accepts (2^40)");
      shape.push_back(d.dim_value());
    } else if (d.has_dim_param()) {
      return Unimplemented("dynamic dim '", d.dim_param(), "' of ", what, " (graphfuse needs static shapes)");
    } else {
      return Unimplemented("dim ", k, " of ", what, " is unknown (graphfuse needs static shapes)");
    }
  }
  auto n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext(what);
  return ValueType{*dtype, shape};
}

// A graph output's declared type must agree with what the graph computes (where declared).
Status CheckDeclaredOutput(const onnx::ValueInfoProto& vi, const Value& v) {
  if (!vi.has_type()) return Status::Ok();  // nothing declared
  if (!vi.type().has_tensor_type()) return Unimplemented("output '", vi.name(), "' is not a tensor");
  const auto& tt = vi.type().tensor_type();
  auto mismatch = [&]() {
    std::string declared = tt.elem_type() ? onnx_import::OnnxDTypeName(tt.elem_type()) : "?";
    declared += "[";
    for (int k = 0; tt.has_shape() && k < tt.shape().dim_size(); ++k) {
      const auto& d = tt.shape().dim(k);
      declared += (k ? "," : "") + (d.has_dim_value() ? std::to_string(d.dim_value()) : d.dim_param());
    }
    declared += "]";
    return InvalidArgument("output '", vi.name(), "' is declared ", declared, " but the graph computes ",
                           v.TypeString());
  };
  if (tt.elem_type() != 0) {
    auto dt = DTypeFromOnnx(tt.elem_type());
    if (!dt.ok()) return dt.status().WithContext(StrCat("output '", vi.name(), "'"));
    if (*dt != v.dtype()) return mismatch();
  }
  if (tt.has_shape()) {
    if (tt.shape().dim_size() != static_cast<int>(v.shape().size())) return mismatch();
    for (int k = 0; k < tt.shape().dim_size(); ++k)
      if (tt.shape().dim(k).has_dim_value() && tt.shape().dim(k).dim_value() != v.shape()[k]) return mismatch();
  }
  return Status::Ok();
}

Status ImportNodes(const onnx::GraphProto& gp, int64_t opset, const std::string& label, Graph& g) {
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& np = gp.node(i);
    onnx_import::NodeImport n{g, np, np.name().empty() ? StrCat(np.op_type(), "_", i) : np.name(), {}, {}, opset};
    auto fail = [&](const Status& s) { return NodeContext(s, label, n.Describe()); };
    for (const std::string& in : np.input()) {
      if (in.empty()) {
        n.inputs.push_back(nullptr);
        continue;
      }
      Value* v = g.FindValue(in);
      if (!v)
        return fail(InvalidArgument("input '", in, "' is not defined by a graph input, initializer or earlier node"));
      n.inputs.push_back(v);
    }
    std::set<std::string> outs;
    for (const std::string& out : np.output()) {
      if (out.empty()) continue;
      if (g.FindValue(out) || !outs.insert(out).second)
        return fail(InvalidArgument("output '", out, "' is already defined (ONNX values have one definition)"));
    }
    Status s = onnx_import::ImportNode(n);
    if (!s.ok()) return fail(s);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Graph>> ImportModel(const onnx::ModelProto& m, const std::string& label) {
  auto opset = DefaultOpset(m);
  if (!opset.ok()) return opset.status().WithContext(label);
  const onnx::GraphProto& gp = m.graph();
  if (gp.sparse_initializer_size() > 0) return Unimplemented(label, ": sparse initializers are not supported");
  auto g = std::make_unique<Graph>(gp.name().empty() ? "main" : gp.name());

  std::set<std::string> initializers;
  for (int i = 0; i < gp.initializer_size(); ++i) {
    const onnx::TensorProto& t = gp.initializer(i);
    if (t.name().empty()) return InvalidArgument(label, ": initializer #", i, " has no name");
    if (!initializers.insert(t.name()).second)
      return InvalidArgument(label, ": initializer '", t.name(), "' is defined twice");
    auto data = onnx_import::TensorFromProto(t, StrCat("initializer '", t.name(), "'"));
    if (!data.ok()) return data.status().WithContext(label);
    auto c = g->AddConstant(t.name(), std::make_shared<const Tensor>(std::move(data).value()));
    if (!c.ok()) return c.status().WithContext(label);
  }
  for (const onnx::ValueInfoProto& vi : gp.input()) {
    if (initializers.count(vi.name())) continue;  // an input with a default: a constant here
    if (vi.name().empty()) return InvalidArgument(label, ": a graph input has no name");
    if (g->FindValue(vi.name())) return InvalidArgument(label, ": graph input '", vi.name(), "' is defined twice");
    auto type = InputType(vi);
    if (!type.ok()) return type.status().WithContext(label);
    auto in = g->AddInput(vi.name(), type->dtype, type->shape);
    if (!in.ok()) return in.status().WithContext(label);
  }
  GF_RETURN_IF_ERROR(ImportNodes(gp, *opset, label, *g));
  if (gp.output_size() == 0) return InvalidArgument(label, ": the graph has no outputs");
  for (const onnx::ValueInfoProto& vo : gp.output()) {
    Value* v = g->FindValue(vo.name());
    if (!v) return InvalidArgument(label, ": graph output '", vo.name(), "' is not computed by any node");
    GF_RETURN_IF_ERROR(CheckDeclaredOutput(vo, *v).WithContext(label));
    GF_RETURN_IF_ERROR(g->MarkOutput(v).WithContext(label));
  }
  // No Graph::Verify here: every node went through AddNode's inference, so the graph is
  // consistent by construction, and the pipeline verifies between passes anyway.
  return g;
}

}  // namespace

Result<std::unique_ptr<Graph>> ImportOnnxBytes(const std::string& bytes, const std::string& label) {
  if (static_cast<int64_t>(bytes.size()) > kMaxProtoFileBytes)
    return InvalidArgument(label, ": model is ", bytes.size(), " bytes; ONNX protobuf models are limited to 2 GiB");
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes)) return InvalidArgument(label, ": not a valid ONNX model (protobuf parse failed)");
  return ImportModel(m, label);
}

Result<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path) {
  std::string bytes;
  GF_RETURN_IF_ERROR(onnx_import::ReadFileBytes(path, kMaxProtoFileBytes, &bytes));
  return ImportOnnxBytes(bytes, path);
}

Result<Tensor> ReadTensorProtoFile(const std::string& path, std::string* name) {
  std::string bytes;
  GF_RETURN_IF_ERROR(onnx_import::ReadFileBytes(path, kMaxProtoFileBytes, &bytes));
  if (bytes.empty()) return InvalidArgument(path, ": the file is empty (a TensorProto was expected)");
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes)) return InvalidArgument(path, ": not a valid ONNX TensorProto (protobuf parse failed)");
  // Bytes that parse but set no element type: a truncated file, or not a tensor at all.
  if (p.data_type() == onnx::TensorProto::UNDEFINED)
    return InvalidArgument(path, ": holds no tensor (no element type; ", bytes.size(), " bytes: truncated, or not a TensorProto)");
  if (name) *name = p.name();
  return onnx_import::TensorFromProto(p, StrCat(path, ": tensor '", p.name(), "'"));
}

Status WriteTensorProtoFile(const std::string& path, const Tensor& t, const std::string& name) {
  if (static_cast<int64_t>(t.nbytes()) > kMaxProtoFileBytes - 4096)
    return InvalidArgument(path, ": tensor ", DTypeName(t.dtype()), ShapeToString(t.shape()),
                           " is too large for a TensorProto (2 GiB)");
  onnx::TensorProto p;
  onnx_import::TensorToProto(t, name, &p);
  std::string bytes;
  if (!p.SerializeToString(&bytes)) return Internal(path, ": cannot serialize the tensor");
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return NotFound(path, ": cannot open for writing");
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) return InvalidArgument(path, ": write error");
  return Status::Ok();
}

}  // namespace graphfuse

#include "onnx/import.h"

#include <fcntl.h>
#include <onnx/onnx_pb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/prepared_store.h"
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

// The declared type of a graph input: dtype, and each dim fixed or symbolic.
Result<TensorDecl> TensorDeclOf(const onnx::ValueInfoProto& vi) {
  const std::string what = StrCat("input '", vi.name(), "'");
  if (!vi.type().has_tensor_type())
    return Unimplemented(what, " is not a tensor (sequences, maps and optionals are not supported)");
  const auto& tt = vi.type().tensor_type();
  auto dtype = DTypeFromOnnx(tt.elem_type());
  if (!dtype.ok()) return dtype.status().WithContext(what);
  if (!tt.has_shape()) return Unimplemented(what, " has no shape (graphfuse needs each input's rank)");
  if (tt.shape().dim_size() > kMaxImportRank)
    return Unimplemented(what, " has rank ", tt.shape().dim_size(), ", more than the supported ", kMaxImportRank);
  TensorDecl decl{vi.name(), *dtype, {}, false, ""};
  Shape fixed;
  for (int k = 0; k < tt.shape().dim_size(); ++k) {
    const auto& d = tt.shape().dim(k);
    if (d.has_dim_value()) {
      if (d.dim_value() < 0) return InvalidArgument(what, " has negative dim ", k, " (", d.dim_value(), ")");
      if (d.dim_value() > kMaxImportDim)
        return InvalidArgument(what, ": dim ", k, " is ", d.dim_value(), ", more than graphfuse accepts (2^40)");
      decl.dims.push_back({d.dim_value(), ""});
      fixed.push_back(d.dim_value());
    } else {
      decl.dims.push_back({-1, d.dim_param()});  // dim_param empty: unnamed, any size
    }
  }
  if (fixed.size() == decl.dims.size()) {
    auto n = NumElements(fixed);
    if (!n.ok()) return n.status().WithContext(what);
  }
  return decl;
}

// The operands whose values become a shape, axes, repeats, bounds or a count: the node's
// kernel (or its import) needs them constant. Index lists per op type.
const std::map<std::string, std::vector<int>>& ShapeValueOperands() {
  static const std::map<std::string, std::vector<int>> m = {
      {"Reshape", {1}},        {"Expand", {1}},          {"Tile", {1}},
      {"ConstantOfShape", {0}}, {"Range", {0, 1, 2}},    {"Slice", {1, 2, 3, 4}},
      {"Squeeze", {1}},        {"Unsqueeze", {1}},       {"Split", {1}},
      {"Pad", {1, 2, 3}},      {"TopK", {1}},            {"CumSum", {1}},
      {"OneHot", {1}},         {"Dropout", {1, 2}},      {"Resize", {1, 2, 3}},
      {"ReduceSum", {1}},      {"ReduceMean", {1}},      {"ReduceMax", {1}},
      {"ReduceMin", {1}},      {"ReduceProd", {1}},      {"ReduceSumSquare", {1}},
      {"ReduceL1", {1}},       {"ReduceL2", {1}},        {"ReduceLogSum", {1}},
      {"ReduceLogSumExp", {1}},
  };
  return m;
}

// Marks the inputs whose values reach a shape operand through any chain of nodes. The walk
// goes from each such operand to the producers of its value, and stops at Shape and Size
// (they read only their input's shape, which the binding fixes) and at initializers.
void MarkShapeValueInputs(const onnx::GraphProto& gp, std::vector<TensorDecl>* decls) {
  std::map<std::string, const onnx::NodeProto*> producer;
  for (const onnx::NodeProto& n : gp.node())
    for (const std::string& o : n.output()) producer.emplace(o, &n);
  std::map<std::string, size_t> input_index;
  for (size_t i = 0; i < decls->size(); ++i) input_index[(*decls)[i].name] = i;
  std::set<std::string> seen;
  std::vector<std::pair<std::string, std::string>> work;  // value, the operand it reaches
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& n = gp.node(i);
    auto it = ShapeValueOperands().find(n.op_type());
    if (it == ShapeValueOperands().end() || !n.domain().empty()) continue;
    const std::string name = n.name().empty() ? StrCat(n.op_type(), "_", i) : n.name();
    for (int k : it->second)
      if (k < n.input_size() && !n.input(k).empty())
        work.emplace_back(n.input(k), StrCat("input ", k, " of node '", name, "' (", n.op_type(), ")"));
  }
  while (!work.empty()) {
    auto [value, use] = work.back();
    work.pop_back();
    if (!seen.insert(value).second) continue;
    if (auto in = input_index.find(value); in != input_index.end()) {
      TensorDecl& d = (*decls)[in->second];
      if (!d.values_shape_plan) d.value_use = use;
      d.values_shape_plan = true;
      continue;
    }
    auto p = producer.find(value);
    if (p == producer.end()) continue;  // an initializer, or undefined (the import names it)
    const onnx::NodeProto& n = *p->second;
    if (const op::Id id = op::FromName(n.op_type()); id == op::Shape || id == op::Size) continue;
    for (const std::string& in : n.input())
      if (!in.empty()) work.emplace_back(in, use);
  }
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

Result<std::unique_ptr<Graph>> ImportModel(const onnx::ModelProto& m, int64_t opset, const std::string& label,
                                          std::span<const std::pair<std::string, std::shared_ptr<const Tensor>>> initializers,
                                          std::span<const TensorDecl> decls, const InputBinding& binding,
                                          std::shared_ptr<PreparedStore> store) {
  const onnx::GraphProto& gp = m.graph();
  auto g = std::make_unique<Graph>(gp.name().empty() ? "main" : gp.name());
  g->set_prepared_store(std::move(store));
  for (const auto& [name, data] : initializers) {
    auto c = g->AddConstant(name, data);  // shared by every plan: weights are converted once
    if (!c.ok()) return c.status().WithContext(label);
  }
  if (binding.shapes.size() != decls.size())
    return Internal(label, ": a binding of ", binding.shapes.size(), " inputs for ", decls.size());
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorDecl& d = decls[i];
    auto in = binding.values[i] ? g->AddConstant(d.name, binding.values[i])
                                : g->AddInput(d.name, d.dtype, binding.shapes[i]);
    if (!in.ok()) return in.status().WithContext(label);
  }
  GF_RETURN_IF_ERROR(ImportNodes(gp, opset, label, *g));
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

OnnxModel::~OnnxModel() = default;

Result<std::shared_ptr<const OnnxModel>> OnnxModel::FromBytes(const std::string& bytes, const std::string& label,
                                                               const std::string& folder) {
  return FromArray(bytes.data(), bytes.size(), label, folder);
}

Result<std::shared_ptr<const OnnxModel>> OnnxModel::FromArray(const char* data, size_t size, const std::string& label,
                                                               const std::string& folder) {
  if (static_cast<int64_t>(size) > kMaxProtoFileBytes)
    return InvalidArgument(label, ": model is ", size, " bytes; ONNX protobuf models are limited to 2 GiB");
  std::shared_ptr<OnnxModel> m(new OnnxModel());
  m->label_ = label;
  m->store_ = std::make_shared<PreparedStore>();
  m->proto_ = std::make_unique<onnx::ModelProto>();
  if (!m->proto_->ParseFromArray(data, static_cast<int>(size)))
    return InvalidArgument(label, ": not a valid ONNX model (protobuf parse failed)");
  auto opset = DefaultOpset(*m->proto_);
  if (!opset.ok()) return opset.status().WithContext(label);
  m->opset_ = *opset;
  const onnx::GraphProto& gp = m->proto_->graph();
  ModelMetadata& meta = m->metadata_;
  meta.producer_name = m->proto_->producer_name();
  meta.producer_version = m->proto_->producer_version();
  meta.domain = m->proto_->domain();
  meta.description = m->proto_->doc_string();
  meta.version = m->proto_->model_version();
  meta.graph_name = gp.name();
  meta.graph_description = gp.doc_string();
  for (const onnx::StringStringEntryProto& e : m->proto_->metadata_props()) meta.custom.emplace_back(e.key(), e.value());
  if (gp.sparse_initializer_size() > 0) return Unimplemented(label, ": sparse initializers are not supported");
  std::set<std::string> initializers;
  onnx_import::ExternalData external(folder);  // its mappings live as long as the tensors over them
  for (int i = 0; i < gp.initializer_size(); ++i) {
    const onnx::TensorProto& t = gp.initializer(i);
    if (t.name().empty()) return InvalidArgument(label, ": initializer #", i, " has no name");
    if (!initializers.insert(t.name()).second)
      return InvalidArgument(label, ": initializer '", t.name(), "' is defined twice");
    auto data = onnx_import::TensorFromProto(t, StrCat("initializer '", t.name(), "'"), &external);
    if (!data.ok()) return data.status().WithContext(label);
    m->initializers_.emplace_back(t.name(), std::make_shared<const Tensor>(std::move(data).value()));
    m->store_->AddRoot(m->initializers_.back().second);
    // The proto's bytes go as soon as they are converted: the weights are held once, not twice.
    std::string().swap(*m->proto_->mutable_graph()->mutable_initializer(i)->mutable_raw_data());
  }
  std::set<std::string> names;
  for (const onnx::ValueInfoProto& vi : gp.input()) {
    if (initializers.count(vi.name())) continue;  // an input with a default: a constant here
    if (vi.name().empty()) return InvalidArgument(label, ": a graph input has no name");
    if (!names.insert(vi.name()).second) return InvalidArgument(label, ": graph input '", vi.name(), "' is defined twice");
    auto decl = TensorDeclOf(vi);
    if (!decl.ok()) return decl.status().WithContext(label);
    m->inputs_.push_back(std::move(*decl));
  }
  if (gp.output_size() == 0) return InvalidArgument(label, ": the graph has no outputs");
  for (const onnx::ValueInfoProto& vo : gp.output()) {
    TensorDecl d{vo.name(), DType::kF32, {}, false, ""};
    const auto& tt = vo.type().tensor_type();
    if (tt.elem_type() != 0) {
      auto dtype = DTypeFromOnnx(tt.elem_type());
      if (!dtype.ok()) return dtype.status().WithContext(StrCat(label, ": output '", vo.name(), "'"));
      d.dtype = *dtype;
    }
    for (int k = 0; tt.has_shape() && k < tt.shape().dim_size(); ++k) {
      const auto& dim = tt.shape().dim(k);
      d.dims.push_back(dim.has_dim_value() ? DeclDim{dim.dim_value(), ""} : DeclDim{-1, dim.dim_param()});
    }
    m->outputs_.push_back(std::move(d));
  }
  MarkShapeValueInputs(gp, &m->inputs_);
  // Plans of a model with symbolic dims serve different shapes: its prepared weights take the
  // forms that serve all of them (PreparedStore::shapes_vary).
  for (const TensorDecl& d : m->inputs_)
    for (const DeclDim& dim : d.dims)
      if (!dim.fixed()) m->store_->set_shapes_vary(true);
  // The converted tensors are what every import uses: drop the proto's copy, and give the
  // heap it freed back to the system (glibc keeps freed blocks below its mmap threshold).
  m->proto_->mutable_graph()->clear_initializer();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  return std::shared_ptr<const OnnxModel>(std::move(m));
}

namespace {
// The folder a model file's external data locations are relative to.
std::string FolderOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}
}  // namespace

Result<std::shared_ptr<const OnnxModel>> OnnxModel::FromFile(const std::string& path) {
  // Mapped, not read: the file's pages are the page cache's, not a copy on the heap, and they
  // leave the process when it is parsed.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0 ||
      st.st_size > kMaxProtoFileBytes) {
    if (fd >= 0) ::close(fd);
    // Not a regular file (a pipe, /dev/stdin), empty, or too large: read it (ReadFileBytes names
    // what is wrong, and refuses a file over 2 GiB before reading it).
    std::string bytes;
    GF_RETURN_IF_ERROR(onnx_import::ReadFileBytes(path, kMaxProtoFileBytes, &bytes));
    return FromBytes(bytes, path, FolderOf(path));
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return InvalidArgument(path, ": cannot map (", std::strerror(errno), ")");
  ::madvise(map, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);
  auto m = FromArray(static_cast<const char*>(map), static_cast<size_t>(st.st_size), path, FolderOf(path));
  ::munmap(map, static_cast<size_t>(st.st_size));
  return m;
}

Result<std::unique_ptr<Graph>> OnnxModel::Instantiate(const InputBinding& binding) const {
  return ImportModel(*proto_, opset_, label_, initializers_, inputs_, binding, store_);
}

Result<std::unique_ptr<Graph>> OnnxModel::InstantiateStatic() const {
  InputBinding b;
  for (const TensorDecl& d : inputs_) {
    const std::string what = StrCat("input '", d.name, "'");
    if (d.values_shape_plan)
      return Unimplemented(label_, ": the values of ", what, " become a shape (", d.value_use,
                           "): run it through graphfuse::CompiledModel, which plans per call, or give them with --data");
    Shape shape;
    for (size_t k = 0; k < d.dims.size(); ++k) {
      if (!d.dims[k].fixed())
        return Unimplemented(label_, ": ", d.dims[k].param.empty() ? StrCat("dim ", k, " of ", what, " is unknown")
                                                                     : StrCat("dynamic dim '", d.dims[k].param, "' of ", what),
                             " (", DeclString(d), "): bind it with --shape, or run through graphfuse::CompiledModel");
      shape.push_back(d.dims[k].value);
    }
    b.shapes.push_back(std::move(shape));
    b.values.push_back(nullptr);
  }
  return Instantiate(b);
}

Result<std::unique_ptr<Graph>> ImportOnnxBytes(const std::string& bytes, const std::string& label) {
  GF_ASSIGN_OR_RETURN(auto m, OnnxModel::FromBytes(bytes, label));
  return m->InstantiateStatic();
}

Result<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path) {
  GF_ASSIGN_OR_RETURN(auto m, OnnxModel::FromFile(path));
  return m->InstantiateStatic();
}

Result<std::unique_ptr<Graph>> ImportOnnxFileWithShapes(const std::string& path,
                                                        const std::map<std::string, Shape>& shape_flags,
                                                        InputBinding* binding) {
  GF_ASSIGN_OR_RETURN(auto m, OnnxModel::FromFile(path));
  GF_ASSIGN_OR_RETURN(InputBinding b, BindShapes(m->inputs(), shape_flags));
  auto g = m->Instantiate(b);
  if (g.ok() && binding) *binding = std::move(b);
  return g;
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

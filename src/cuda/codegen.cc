// Algorithm. (1) The group's compute domain is its first node's (float, or long long for
// integer data), as in src/cpu/lower_group.cc. (2) The iteration space (the outputs' shape)
// is collapsed: size-1 dims dropped, neighbours merged when every input's strides allow, so
// that a dense operand indexes with `i` and [N,C] + [C] with `i % C`. (3) Registers are
// numbered like the CPU tile program's: inputs first, then one per node; each node is a call
// of its row's device function, followed by a rounding to f16/bf16 when the unfused op
// would store that type. (4) The kernel wraps the body in a float4 loop (when every operand
// allows it) and a scalar grid-stride loop.
#include "core/hash.h"
#include "cuda/codegen.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>

#include "ir/op_registry.h"
#include "ops/reference.h"
#include "cuda/codegen_internal.h"
#include "cuda/device_prelude.h"
#include "graphfuse/ops.h"

namespace graphfuse::cuda {
namespace internal {
namespace {

// The op table as CUDA source: each row's expression stringized, in OpKind order.
struct RowSource {
  const char* name;
  int arity;
  const char* expr;
};
constexpr RowSource kRowSources[] = {
#define OP(name, arity, cls, ints, cost, ulp, alpha, beta, expr) {#name, arity, #expr},
#include "graphfuse/ops.def"
#undef OP
};

}  // namespace

// `template <class T> __device__ T op_Add(T x, T y, T z, const Attrs& a, long long idx) {...}`
std::string RowFunction(OpKind kind) {
  const RowSource& row = kRowSources[static_cast<size_t>(kind)];
  return StrCat("template <class T> __forceinline__ T op_", row.name,
                "(T x, T y, T z, const Attrs& a, long long idx) { return ", row.expr, "; }\n");
}

// A float literal that reads back to the same float: shortest round trip, or the bit pattern
// for infinities and NaN.
std::string FloatLiteral(float f) {
  if (!std::isfinite(f)) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    char buf[32];
    std::snprintf(buf, sizeof buf, "__int_as_float(0x%08x)", bits);
    return buf;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

const char* StorageType(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kF16: return "gf::f16";
    case DType::kBF16: return "gf::bf16";
    case DType::kI32: return "int";
    case DType::kI64: return "long long";
    case DType::kBool: return "unsigned char";
  }
  return "float";
}

// Comment text that cannot end or continue the line it is on.
std::string CommentSafe(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!std::isprint(static_cast<unsigned char>(c)) || c == '\\') c = '?';
  return out;
}

std::string KernelSizes::Use(const std::string& name, int64_t value, const char* type) {
  for (const Entry& e : entries_)
    if (e.name == name) {
      GF_CHECK(e.value == value && e.type == type, "kernel size '", name, "' used as ", e.value, " and ", value);
      return name;
    }
  entries_.push_back({name, type, value});
  return name;
}

std::string KernelSizes::Parameter() const {
  return entries_.empty() ? "" : StrCat(", const gf::Sizes<", entries_.size(), "> z");
}

std::string KernelSizes::Declarations(const std::string& indent) const {
  std::string t;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    t += e.type == std::string("long long") ? StrCat(indent, "const long long ", e.name, " = z.v[", k, "];\n")
                                            : StrCat(indent, "const ", e.type, " ", e.name, " = static_cast<", e.type,
                                                     ">(z.v[", k, "]);\n");
  }
  return t;
}

std::vector<int64_t> KernelSizes::values() const {
  std::vector<int64_t> v;
  for (const Entry& e : entries_) v.push_back(e.value);
  return v;
}

Space Collapse(const Shape& out, const std::vector<Shape>& ins, const std::vector<int64_t>& row_strides) {
  Space full;
  for (int64_t d : out) full.dims.push_back(d);
  for (size_t k = 0; k < ins.size(); ++k) {
    const Shape& in = ins[k];
    std::vector<int64_t> st(out.size(), 0);
    const int64_t ld = k < row_strides.size() ? row_strides[k] : 0;
    int64_t inner = 1;
    for (size_t j = 0; j < in.size(); ++j) {
      const size_t din = in.size() - 1 - j, dout = out.size() - 1 - j;
      st[dout] = in[din] == 1 ? 0 : inner;
      inner *= j == 0 && ld > 0 ? ld : in[din];  // rows of ld elements: the last dim is dense
    }
    full.strides.push_back(st);
  }
  Space s;
  s.strides.resize(ins.size());
  for (size_t d = 0; d < full.dims.size(); ++d) {
    s.numel *= full.dims[d];
    if (full.dims[d] == 1) continue;
    bool merge = !s.dims.empty();
    for (size_t k = 0; k < ins.size() && merge; ++k)
      merge = s.strides[k].back() == full.strides[k][d] * full.dims[d];
    if (merge) {
      s.dims.back() *= full.dims[d];
      for (size_t k = 0; k < ins.size(); ++k) s.strides[k].back() = full.strides[k][d];
    } else {
      s.dims.push_back(full.dims[d]);
      for (size_t k = 0; k < ins.size(); ++k) s.strides[k].push_back(full.strides[k][d]);
    }
  }
  return s;
}

std::string OpsPart(const Graph& body) {
  std::string ops;
  size_t k = 0;
  for (const auto& n : body.nodes()) {
    if (k == 6) break;
    std::string op = n->op();
    for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    ops += (k++ ? "_" : "") + op;
  }
  if (body.num_nodes() > 6) ops += StrCat("_and", body.num_nodes() - 6);
  return ops;
}

std::string RowFunctions(const std::vector<bool>& used) {
  std::string src = "// The op-table rows this kernel uses (graphfuse/ops.def, stringized).\n";
  for (size_t k = 0; k < used.size(); ++k)
    if (used[k]) src += RowFunction(static_cast<OpKind>(k));
  return src;
}

size_t NumRows() { return std::size(kRowSources); }

Result<BodyFunction> EmitBodyFunction(const Graph& body, const std::string& fn, const std::string& where,
                                      std::vector<bool>& used) {
  if (body.outputs().empty()) return InvalidArgument(where, ": no outputs");
  if (body.nodes().empty()) return InvalidArgument(where, ": no nodes");
  if (!body.constants().empty()) return InvalidArgument(where, ": holds constants; they must be inputs");
  const Shape& space_shape = body.outputs()[0]->shape();

  // The compute domain, and every node's op.
  std::vector<std::pair<const Node*, OpKind>> nodes;
  bool ints = false;
  for (const auto& n : body.nodes()) {
    auto kind = OpFromName(n->op());
    if (!kind.ok()) return InvalidArgument(where, ": ", n->Describe(), " is not an elementwise op-table op");
    std::vector<DType> dtypes;
    for (const Value* in : n->inputs()) dtypes.push_back(in ? in->dtype() : DType::kF32);
    const bool node_ints = ComputesInIntegers(*kind, dtypes);
    if (nodes.empty()) ints = node_ints;
    if (node_ints != ints) return InvalidArgument(where, ": ", n->Describe(), " computes in another domain");
    if (n->output()->shape() != space_shape)
      return InvalidArgument(where, ": ", n->Describe(), " computes ", n->output()->TypeString(),
                             ", the group iterates over ", ShapeToString(space_shape));
    nodes.push_back({n.get(), *kind});
  }
  for (const Value* in : body.inputs())
    if (in->shape().size() > space_shape.size())
      return InvalidArgument(where, ": input '", in->name(), "' has a larger rank than the group");
  for (const Value* o : body.outputs())
    if (o->shape() != space_shape)
      return InvalidArgument(where, ": output '", o->name(), "' is not over the group's space");
  const char* T = ints ? "gf::i64" : "float";
  for (const auto& [n, kind] : nodes) used[static_cast<size_t>(kind)] = true;

  BodyFunction out;
  out.ints = ints;
  std::map<const Value*, int> reg;
  std::string params;
  for (size_t k = 0; k < body.inputs().size(); ++k) {
    reg[body.inputs()[k]] = static_cast<int>(k);
    params += StrCat(k ? ", " : "", T, " r", k);
  }
  for (size_t k = 0; k < body.outputs().size(); ++k) params += StrCat(params.empty() ? "" : ", ", T, "& o", k);
  std::string& src = out.code;
  src += StrCat("// One element of group '", CommentSafe(body.name()),
                "': registers r0.. are the inputs in body order, then one per node.\n");
  src += StrCat("__forceinline__ void ", fn, "(long long idx, ", params, ") {\n");
  int next = static_cast<int>(body.inputs().size());
  for (const auto& [n, kind] : nodes) {
    const OpAttrs a = ElementwiseAttrs(kind, n->attrs());
    const int arity = kRowSources[static_cast<size_t>(kind)].arity;
    std::string args;
    for (int j = 0; j < 3; ++j) {
      const Value* in = j < arity ? n->input(static_cast<size_t>(j)) : nullptr;
      if (j < arity && (!in || !reg.count(in)))
        return InvalidArgument(where, ": ", n->Describe(), " reads a value defined after it");
      args += j < arity ? StrCat("r", reg.at(in)) : StrCat(T, "(0)");
      args += ", ";
    }
    const int r = next++;
    src += StrCat("  const gf::Attrs a", r, "{", FloatLiteral(a.alpha), ", ", FloatLiteral(a.beta), ", ",
                  static_cast<int>(a.to), ", ", a.seed, "ull, ", a.training ? "true" : "false", "};\n");
    src += StrCat("  ", T, " r", r, " = gf::op_", OpName(kind), "<", T, ">(", args, "a", r, ", idx);  // ",
                  CommentSafe(n->name()), "\n");
    const DType dt = n->output()->dtype();
    if (NeedsRoundingStep(kind, dt, ints))
      src += ints ? StrCat("  r", r, " = static_cast<int>(r", r, ");  // the unfused op stores i32: wraps\n")
                  : StrCat("  r", r, " = gf::round_", DTypeName(dt), "(r", r, ");  // the unfused op stores ",
                           DTypeName(dt), "\n");
    reg[n->output()] = r;
  }
  for (size_t k = 0; k < body.outputs().size(); ++k) src += StrCat("  o", k, " = r", reg.at(body.outputs()[k]), ";\n");
  src += "}\n\n";
  return out;
}

namespace {

// How the float4 loop reads one input.
enum class VecRead { kFloat4, kBroadcast };

}  // namespace
}  // namespace internal

using namespace internal;

Result<CudaKernelSource> GenerateElementwiseKernel(const Graph& body, const std::string& kernel_name,
                                                   const std::vector<int64_t>& row_strides, const std::string& prefix) {
  const std::string where = StrCat("CUDA codegen for fused group '", body.name(), "'");
  // (1) The compute domain and (3) the body function (errors name the node at fault).
  std::vector<bool> used(NumRows(), false);
  GF_ASSIGN_OR_RETURN(BodyFunction fn, EmitBodyFunction(body, "gf_body", where, used));
  const bool ints = fn.ints;
  const char* T = ints ? "gf::i64" : "float";
  const char* load = ints ? "gf::i64_of" : "gf::f32_of";
  const Shape& space_shape = body.outputs()[0]->shape();

  // (2) The iteration space.
  std::vector<Shape> in_shapes;
  for (size_t k = 0; k < body.inputs().size(); ++k) {
    const Value* in = body.inputs()[k];
    if (k < row_strides.size() && row_strides[k] > 0 &&
        (in->shape() != space_shape || space_shape.empty() || row_strides[k] < space_shape.back()))
      return InvalidArgument(where, ": input '", in->name(), "' ", in->TypeString(), " cannot be read as rows of ",
                             row_strides[k], " elements over ", ShapeToString(space_shape));
    in_shapes.push_back(in->shape());
  }
  const Space space = Collapse(space_shape, in_shapes, row_strides);

  CudaKernelSource out;
  out.num_elements = space.numel;
  for (const Value* in : body.inputs()) out.input_dtypes.push_back(in->dtype());
  for (const Value* o : body.outputs()) out.output_dtypes.push_back(o->dtype());

  std::string src = kDevicePrelude;
  src += RowFunctions(used);
  src += "\n}  // namespace gf\n\n";
  src += fn.code;

  // (4) The kernel. Its name goes between `head` and `tail`; the hash covers both.
  const std::string head = src + StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  std::string sig = "(";
  for (size_t k = 0; k < body.inputs().size(); ++k)
    sig += StrCat(k ? ", " : "", "const ", StorageType(body.inputs()[k]->dtype()), "* __restrict__ in", k);
  for (size_t k = 0; k < body.outputs().size(); ++k)
    sig += StrCat(sig.size() > 1 ? ", " : "", StorageType(body.outputs()[k]->dtype()), "* __restrict__ out", k);
  // The body, then the signature and the sizes it named (KernelSizes).
  KernelSizes z;
  const std::string n = z.Use("n", space.numel);
  std::string code = "  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
  code += "  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";

  // The float4 loop: every operand f32, and each input either read as a float4 (4 consecutive
  // elements of one row) or one value shared by the 4 lanes. Whether these sizes allow it (n,
  // the rows and the strides multiples of 4) is the size `vec`; the pointers' 16-byte alignment
  // is checked in the kernel.
  bool vec = !ints;
  bool vec_sizes = space.numel > 0 && space.numel % 4 == 0;
  for (DType t : out.input_dtypes) vec = vec && t == DType::kF32;
  for (DType t : out.output_dtypes) vec = vec && t == DType::kF32;
  std::vector<VecRead> reads;
  for (size_t k = 0; vec && k < body.inputs().size(); ++k) {
    if (space.IsScalar(k)) {
      reads.push_back(VecRead::kBroadcast);
      continue;
    }
    if (space.IsDense(k)) {
      reads.push_back(VecRead::kFloat4);
      continue;
    }
    const int64_t inner = space.dims.back(), s = space.strides[k].back();
    const bool strides4 = std::all_of(space.strides[k].begin(), space.strides[k].end() - 1,
                                      [](int64_t x) { return x % 4 == 0; });
    if (s == 1) reads.push_back(VecRead::kFloat4);
    else if (s == 0) reads.push_back(VecRead::kBroadcast);
    else vec = false;
    vec_sizes = vec_sizes && inner % 4 == 0 && (s == 0 || strides4);
  }
  out.has_vector_path = vec && vec_sizes;
  out.scalar_work_items = space.numel;
  out.vector_work_items = out.has_vector_path ? space.numel / 4 : 0;
  if (vec) {
    std::string cond = z.Use("vec", vec_sizes ? 1 : 0);
    for (size_t k = 0; k < reads.size(); ++k)
      if (reads[k] == VecRead::kFloat4) cond += StrCat(" && gf::aligned16(in", k, ")");
    for (size_t k = 0; k < body.outputs().size(); ++k) cond += StrCat(" && gf::aligned16(out", k, ")");
    code += StrCat("  if (", cond, ") {\n");
    code += StrCat("    for (long long q = first; q < ", n, " / 4; q += step) {\n");
    code += "      const long long i = q * 4;\n";
    for (size_t k = 0; k < reads.size(); ++k) {
      if (reads[k] == VecRead::kFloat4)
        code += StrCat("      const float4 v", k, " = *reinterpret_cast<const float4*>(in", k, " + ", space.Offset(k, "i", z), ");\n");
      else
        code += StrCat("      const float v", k, " = in", k, "[", space.Offset(k, "i", z), "];\n");
    }
    for (size_t k = 0; k < body.outputs().size(); ++k) code += StrCat("      float4 w", k, ";\n");
    static constexpr const char* kLane[] = {"x", "y", "z", "w"};
    for (int lane = 0; lane < 4; ++lane) {
      std::string call = StrCat("      gf_body(i + ", lane);
      for (size_t k = 0; k < reads.size(); ++k)
        call += reads[k] == VecRead::kFloat4 ? StrCat(", v", k, ".", kLane[lane]) : StrCat(", v", k);
      for (size_t k = 0; k < body.outputs().size(); ++k) call += StrCat(", w", k, ".", kLane[lane]);
      code += call + ");\n";
    }
    for (size_t k = 0; k < body.outputs().size(); ++k)
      code += StrCat("      *reinterpret_cast<float4*>(out", k, " + i) = w", k, ";\n");
    code += "    }\n    return;\n  }\n";
  }
  code += StrCat("  for (long long i = first; i < ", n, "; i += step) {\n");
  std::string decl;
  for (size_t k = 0; k < body.outputs().size(); ++k) decl += StrCat(k ? ", " : "", "o", k);
  code += StrCat("    ", T, " ", decl, ";\n");
  std::string call = "    gf_body(i";
  for (size_t k = 0; k < body.inputs().size(); ++k)
    call += StrCat(", ", load, "(in", k, "[", space.Offset(k, "i", z), "])");
  for (size_t k = 0; k < body.outputs().size(); ++k) call += StrCat(", o", k);
  code += call + ");\n";
  for (size_t k = 0; k < body.outputs().size(); ++k) code += StrCat("    gf::store(out", k, " + i, o", k, ");\n");
  code += "  }\n}\n";
  const std::string tail = sig + z.Parameter() + ") {\n" + z.Declarations("  ") + code;
  out.sizes = z.values();

  out.name = kernel_name;
  const bool ident = !kernel_name.empty() && !std::isdigit(static_cast<unsigned char>(kernel_name[0])) &&
                     std::all_of(kernel_name.begin(), kernel_name.end(),
                                 [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!kernel_name.empty() && !ident)
    return InvalidArgument(where, ": kernel name '", CommentSafe(kernel_name), "' is not a C identifier");
  if (out.name.empty()) {
    const std::string hash = Hash8(head + tail);
    out.name = StrCat(!prefix.empty() ? prefix : body.num_nodes() > 1 ? "fused_" : "", OpsPart(body), "_", DTypeName(out.output_dtypes.front()), "_",
                      hash);
  }
  out.source = head + out.name + tail;
  return out;
}

Result<std::unique_ptr<Graph>> WrapSingleOpBody(const Node& node) {
  if (!OpFromName(node.op()).ok())
    return InvalidArgument("CUDA codegen: ", node.Describe(), " is not an elementwise op-table op");
  auto body = std::make_unique<Graph>(node.name());
  std::vector<Value*> ins;
  for (size_t k = 0; k < node.inputs().size(); ++k) {
    const Value* in = node.input(k);
    if (!in) return InvalidArgument("CUDA codegen: ", node.Describe(), ": input ", k, " is missing");
    GF_ASSIGN_OR_RETURN(Value * v, body->AddInput(StrCat("in", k), in->dtype(), in->shape()));
    ins.push_back(v);
  }
  auto n = body->AddNode(node.op(), ins, node.attrs(), node.name());
  if (!n.ok()) return n.status().WithContext("CUDA codegen");
  GF_RETURN_IF_ERROR((*n)->output() ? body->MarkOutput((*n)->output()) : Internal("no output"));
  return body;
}

Result<CudaKernelSource> GenerateKernelForNode(const Node& node) {
  switch (node.op_id()) {
    case op::FusedGemm: return GenerateGemmEpilogueKernel(node);
    case op::Rope: return GenerateRopeKernel(node);
    case op::Transpose: return GenerateTransposeKernel(node);
    case op::FusedAttention: return GenerateAttentionKernel(node);
    case op::RMSNorm:
    case op::LayerNormalization:
    case op::Softmax:
    case op::FusedNorm:
    case op::FusedSoftmax: return GenerateRowKernel(node);
    default: break;
  }
  if (node.is(op::FusedElementwise)) {
    const Graph* body = node.GetGraph("body");
    if (!body) return InvalidArgument("CUDA codegen: ", node.Describe(), " has no 'body' graph");
    return GenerateElementwiseKernel(*body);  // not its "kernel_name": that one hashes the sizes
  }
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> body, WrapSingleOpBody(node));
  return GenerateElementwiseKernel(*body);
}

}  // namespace graphfuse::cuda

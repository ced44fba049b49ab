// CUDA C for the kernels around the GEMMs: row kernels (RMSNorm, LayerNormalization, Softmax,
// and FusedNorm / FusedSoftmax with their elementwise bodies), RoPE, transposes and the epilogue
// of a FusedGemm; FusedAttention's forms are in codegen_attention.cc. (How each node of a plan runs on the GPU, PlanNodeForCuda, is in
// kernel_registry.cc.)
//
// Row kernels: one thread block of kCudaBlockSize threads per row (grid-stride over rows). A
// row's values stay in registers (kPer per thread), so a prologue is computed once, its extra
// outputs stored on the way, and the statistics follow the CPU kernels' recipes
// (src/cpu/kernels/norm_rows.h, softmax.cc): sums in double, reduced per warp by shuffles, then
// the warps' partials added in a fixed order, so every thread holds the same value and a
// launch is deterministic. Rows longer than kMaxRowPerThread * kCudaBlockSize are refused.
//
// Every kernel here takes f32, f16 and bf16 tensors through one path: operands are loaded into
// f32, all accumulation (sums of squares, means, softmax max / sum, attention's dot products and
// weighted sums) is in f32 or double, and a store rounds once to the tensor's dtype -- where the
// unfused CPU kernels round (prologue / epilogue ops as their outputs are stored, a fused
// softmax's probabilities as Softmax stores them). For f32 the text is the plain C of before.
#include <algorithm>
#include <cctype>
#include <string_view>

#include "core/hash.h"
#include "ir/schemas/fused_gemm.h"
#include "ir/schemas/rowwise_layout.h"
#include "cuda/codegen.h"
#include "cuda/codegen_internal.h"
#include "cuda/device_prelude.h"

namespace graphfuse::cuda {
namespace internal {

extern const char* const kRowPrelude = R"(
// Block reductions for row kernels (blockDim.x == 256: eight warps). Warp partials by
// shuffles, then the eight partials summed in a fixed order: every thread gets the same value.
__forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = gf::max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__noinline__ double block_sum(double v) {
  __shared__ double part[8];
  v = warp_sum(v);
  __syncthreads();  // the previous reduction's readers are done with part
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < 8; ++w) t += part[w];
  return t;
}
__noinline__ float block_max(float v) {
  __shared__ float part[8];
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = part[0];
  for (int w = 1; w < 8; ++w) t = gf::max(t, part[w]);
  return t;
}
)";

std::string LoadF32(DType dt, const std::string& ref) {
  return dt == DType::kF32 ? ref : StrCat("gf::f32_of(", ref, ")");
}
std::string StoreTo(DType dt, const std::string& base, const std::string& off, const std::string& value) {
  return dt == DType::kF32 ? StrCat(base, "[", off, "] = ", value, ";") : StrCat("gf::store(", base, " + ", off, ", ", value, ");");
}
std::string RoundedTo(DType dt, const std::string& value) {
  return dt == DType::kF32 ? value : StrCat("gf::round_", DTypeName(dt), "(", value, ")");
}

CudaKernelSource Finish(const std::string& head, const std::string& tail, const std::string& base, DType dt,
                        CudaKernelSource k) {
  const std::string hash = Hash8(head + tail);
  k.name = StrCat(base, "_", DTypeName(dt), "_", hash);
  k.source = head + k.name + tail;
  return k;
}

}  // namespace internal

namespace {

using namespace internal;

constexpr int kMaxRowPerThread = 32;

// One input of a row kernel's body: which kernel parameter, read at which offset.
struct BodyArg {
  std::string expr;  // e.g. "gf::f32_of(in2[(i % 64LL)])", or "p" for the probabilities
};

// The argument expressions for a body whose inputs are node inputs `first..` (skipping body
// input `special`, which reads `special_expr`), over the row space `x_shape`; its sizes named
// with `tag` first.
std::vector<BodyArg> BodyArgs(const Graph& body, const Shape& x_shape, size_t first, int64_t special,
                              const std::string& special_expr, KernelSizes& z, const std::string& tag) {
  std::vector<Shape> shapes;
  for (const Value* in : body.inputs()) shapes.push_back(in->shape());
  const Space sp = Collapse(x_shape, shapes);
  std::vector<BodyArg> args;
  size_t param = first;
  for (size_t k = 0; k < body.inputs().size(); ++k) {
    if (static_cast<int64_t>(k) == special) {
      args.push_back({special_expr});
      continue;
    }
    args.push_back({StrCat("gf::f32_of(in", param++, "[", sp.Offset(k, "i", z, tag), "])")});
  }
  return args;
}

std::string Call(const std::string& fn, const std::vector<BodyArg>& args, size_t outputs, const char* out_prefix) {
  std::string c = StrCat(fn, "(i");
  for (const BodyArg& a : args) c += ", " + a.expr;
  for (size_t k = 0; k < outputs; ++k) c += StrCat(", ", out_prefix, k);
  return c + ");";
}

// The offset of a norm parameter ([D], [1] or a scalar; numel D or 1) at row column c.
Result<std::string> ParamOffset(const Node& node, size_t input, int64_t d) {
  const Value* p = node.input(input);
  if (!p) return std::string();
  if (p->numel() == d) return std::string("c");
  if (p->numel() == 1) return std::string("0");
  return Unimplemented("CUDA codegen: ", node.Describe(), ": parameter ", p->TypeString(),
                       " is neither one value nor one per row element (", d, ")");
}

enum class RowOp { kRms, kLayer, kSoftmax };

struct RowSpec {
  RowOp op;
  const Node* node;
  Shape x_shape;        // the rows: [..., D] (leading dims flattened)
  int64_t d = 0;        // row length
  DType x_dtype = DType::kF32;  // the rows' dtype (the norm / softmax input)
  // Prologue (FusedNorm body / FusedSoftmax prologue): node inputs [0, prologue_inputs).
  const Graph* prologue = nullptr;
  int64_t x_output = 0, prologue_outputs = 0;
  size_t prologue_inputs = 1;
  size_t prologue_first_out = 1;  // node output of prologue output 0
  // Softmax epilogue: node inputs from prologue_inputs on, body input epilogue_input = P.
  const Graph* epilogue = nullptr;
  int64_t epilogue_input = 0;
  // Norm parameters: node input indices (-1: none), epsilon; LayerNormalization's optional
  // mean / inv_std outputs.
  int64_t scale = -1, bias = -1;
  double eps = 0;
  bool mean_out = false, inv_out = false;
};

// RMSNorm, LayerNormalization, Softmax: rows along the last axis of input 0.
template <RowOp kOp>
Status ReadUnfusedRow(const Node& node, const std::string& where, RowSpec& s) {
  const Value* x = node.input(0);
  if (!x || x->shape().empty()) return InvalidArgument(where, ": needs an input of rank >= 1");
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (axis != rank - 1)
    return Unimplemented(where, ": rows along axis ", node.GetInt("axis", -1), " of ", x->TypeString(),
                         " (only the last axis is generated)");
  s.op = kOp;
  s.x_shape = x->shape();
  s.x_dtype = x->dtype();
  if (s.op != RowOp::kSoftmax) {
    s.scale = node.input(1) ? 1 : -1;
    s.bias = node.inputs().size() > 2 && node.input(2) ? 2 : -1;
    s.eps = node.GetFloat("epsilon", s.op == RowOp::kRms ? 1e-6f : 1e-5f);
    s.mean_out = s.op == RowOp::kLayer && node.outputs().size() > 1;
    s.inv_out = s.op == RowOp::kLayer && node.outputs().size() > 2;
  }
  return Status::Ok();
}

Status ReadFusedNorm(const Node& node, const std::string& where, RowSpec& s) {
  GF_ASSIGN_OR_RETURN(schemas::NormLayout l, schemas::ReadNormLayout(where, node.attrs(), node.inputs().size(),
                                                                     schemas::RowDTypes::kAnyFloat));
  s.op = l.layer_norm ? RowOp::kLayer : RowOp::kRms;
  s.x_shape = l.x->shape();
  s.x_dtype = l.x->dtype();
  s.prologue = l.body;
  s.x_output = l.norm_input;
  s.prologue_outputs = l.prologue_outputs;
  s.prologue_inputs = l.body_inputs;
  s.scale = l.params >= 1 ? static_cast<int64_t>(l.body_inputs) : -1;
  s.bias = l.params >= 2 ? static_cast<int64_t>(l.body_inputs) + 1 : -1;
  s.eps = node.GetFloat("epsilon", l.layer_norm ? 1e-5f : 1e-6f);
  return Status::Ok();
}

Status ReadFusedSoftmax(const Node& node, const std::string& where, RowSpec& s) {
  const std::vector<const Value*> inputs(node.inputs().begin(), node.inputs().end());
  GF_ASSIGN_OR_RETURN(schemas::SoftmaxLayout l,
                      schemas::ReadSoftmaxLayout(where, node.attrs(), inputs, schemas::RowDTypes::kAnyFloat));
  s.op = RowOp::kSoftmax;
  s.x_shape = l.x.shape;
  s.x_dtype = l.x.dtype;
  s.prologue = l.prologue;
  s.x_output = l.softmax_input;
  s.prologue_outputs = l.prologue_outputs;
  s.prologue_inputs = l.prologue_inputs;
  s.prologue_first_out = l.main_outputs;
  s.epilogue = l.epilogue;
  s.epilogue_input = l.epilogue_input;
  return Status::Ok();
}

// The ops with a row kernel: how each one's node reads as a RowSpec.
struct RowOpReader {
  std::string_view op;
  Status (*read)(const Node& node, const std::string& where, RowSpec& s);
};
constexpr RowOpReader kRowOps[] = {
    {"RMSNorm", ReadUnfusedRow<RowOp::kRms>},
    {"LayerNormalization", ReadUnfusedRow<RowOp::kLayer>},
    {"Softmax", ReadUnfusedRow<RowOp::kSoftmax>},
    {"FusedNorm", ReadFusedNorm},
    {"FusedSoftmax", ReadFusedSoftmax},
};

Result<RowSpec> ReadRowSpec(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  const RowOpReader* row = nullptr;
  for (const RowOpReader& r : kRowOps)
    if (r.op == node.op()) row = &r;
  if (!row) return InvalidArgument(where, " has no row kernel");
  RowSpec s;
  s.node = &node;
  GF_RETURN_IF_ERROR(row->read(node, where, s));
  s.d = s.x_shape.back();
  return s;
}

}  // namespace

Result<CudaKernelSource> GenerateRowKernel(const Node& node) {
  GF_ASSIGN_OR_RETURN(RowSpec s, ReadRowSpec(node));
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < s.x_shape.size(); ++k) rows *= s.x_shape[k];
  const int64_t per = (s.d + kCudaBlockSize - 1) / kCudaBlockSize;
  if (per > kMaxRowPerThread)
    return Unimplemented(where, ": rows of ", s.d, " elements exceed the register path (at most ",
                         kMaxRowPerThread * kCudaBlockSize, ")");

  std::vector<bool> used(NumRows(), false);
  std::string bodies;
  if (s.prologue) {
    GF_ASSIGN_OR_RETURN(BodyFunction f, EmitBodyFunction(*s.prologue, "gf_prologue", where + " (prologue)", used));
    if (f.ints) return Unimplemented(where, ": an integer prologue");
    bodies += f.code;
  }
  if (s.epilogue) {
    GF_ASSIGN_OR_RETURN(BodyFunction f, EmitBodyFunction(*s.epilogue, "gf_epilogue", where + " (epilogue)", used));
    if (f.ints) return Unimplemented(where, ": an integer epilogue");
    bodies += f.code;
  }
  std::string scale_off, bias_off;
  if (s.scale >= 0) {
    GF_ASSIGN_OR_RETURN(scale_off, ParamOffset(node, static_cast<size_t>(s.scale), s.d));
  }
  if (s.bias >= 0) {
    GF_ASSIGN_OR_RETURN(bias_off, ParamOffset(node, static_cast<size_t>(s.bias), s.d));
  }

  CudaKernelSource k;
  k.num_elements = rows * s.d;
  k.row_kernel = true;
  k.scalar_work_items = rows;  // one block per row
  std::string sig = "(";
  for (size_t i = 0; i < node.inputs().size(); ++i) {
    const Value* in = node.input(i);
    if (!in) return Unimplemented(where, ": omitted input ", i);
    k.input_dtypes.push_back(in->dtype());
    sig += StrCat(i ? ", " : "", "const ", StorageType(in->dtype()), "* __restrict__ in", i);
  }
  for (size_t o = 0; o < node.outputs().size(); ++o) {
    k.output_dtypes.push_back(node.output(o)->dtype());
    sig += StrCat(", ", StorageType(node.output(o)->dtype()), "* __restrict__ out", o);
  }

  std::string head = kDevicePrelude;
  head += RowFunctions(used);
  head += kRowPrelude;
  head += "\n}  // namespace gf\n\n" + bodies;
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");

  // The rows' count and length are sizes; the register lanes per thread (kPer) are fixed by
  // the length's multiple of kCudaBlockSize (a norm's rows: the hidden size, fixed by weights).
  KernelSizes z;
  z.Use("kRows", rows);
  z.Use("kD", s.d);
  std::string t = StrCat("  constexpr int kPer = ", per, ";\n");
  t += "  for (long long row = blockIdx.x; row < kRows; row += gridDim.x) {\n";
  t += "    float x[kPer];\n";
  t += "#pragma unroll\n    for (int j = 0; j < kPer; ++j) {\n";
  t += StrCat("      const long long c = threadIdx.x + j * ", kCudaBlockSize, "LL, i = row * kD + c;\n");
  t += "      x[j] = 0.f;\n      if (c >= kD) continue;\n";
  if (s.prologue) {
    const size_t nout = s.prologue->outputs().size();
    std::string decl;
    for (size_t o = 0; o < nout; ++o) decl += StrCat(o ? ", " : "", "q", o);
    t += StrCat("      float ", decl, ";\n");
    t += "      " + Call("gf_prologue", BodyArgs(*s.prologue, s.x_shape, 0, -1, "", z, "pro_"), nout, "q") + "\n";
    for (int64_t o = 0; o < s.prologue_outputs; ++o)
      t += StrCat("      gf::store(out", s.prologue_first_out + static_cast<size_t>(o), " + i, q", o, ");\n");
    t += StrCat("      x[j] = q", s.x_output, ";\n");
  } else {
    t += "      x[j] = gf::f32_of(in0[i]);\n";
  }
  t += "    }\n";

  auto for_each = [&](const std::string& body) {
    return StrCat("#pragma unroll\n    for (int j = 0; j < kPer; ++j) {\n", "      const long long c = threadIdx.x + j * ",
                  kCudaBlockSize, "LL, i = row * kD + c;\n      if (c >= kD) continue;\n", body, "    }\n");
  };
  // `stmt` for each of the thread's lanes inside the row (no index variables).
  auto for_valid = [&](const std::string& stmt) {
    return StrCat("#pragma unroll\n    for (int j = 0; j < kPer; ++j)\n      if (threadIdx.x + j * ", kCudaBlockSize,
                  "LL < kD)", stmt);
  };
  auto param = [&](int64_t input, const std::string& off) { return StrCat("gf::f32_of(in", input, "[", off, "])"); };
  const std::string eps = FloatLiteral(static_cast<float>(s.eps));
  if (s.op == RowOp::kRms) {
    t += "    double ss = 0;\n";
    t += "    for (int j = 0; j < kPer; ++j) ss += static_cast<double>(x[j]) * x[j];  // padding lanes hold 0\n";
    t += "    ss = gf::block_sum(ss);\n";
    t += StrCat("    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(kD) + static_cast<double>(",
                eps, ")));\n");
    t += for_each(StrCat("      gf::store(out0 + i, x[j] * inv", s.scale >= 0 ? " * " + param(s.scale, scale_off) : "",
                         ");\n"));
  } else if (s.op == RowOp::kLayer) {
    t += "    double sum = 0;\n";
    t += "    for (int j = 0; j < kPer; ++j) sum += x[j];\n";
    t += "    const double mean = gf::block_sum(sum) / static_cast<double>(kD);\n";
    t += "    double sq = 0;\n";
    t += for_valid(" sq += (x[j] - mean) * (x[j] - mean);\n");
    t += "    const double var = gf::block_sum(sq) / static_cast<double>(kD);\n";
    t += StrCat("    const float mf = static_cast<float>(mean), inv = static_cast<float>(1.0 / sqrt(var + static_cast<double>(",
                eps, ")));\n");
    if (s.mean_out) t += "    if (threadIdx.x == 0) gf::store(out1 + row, mf);\n";
    if (s.inv_out) t += "    if (threadIdx.x == 0) gf::store(out2 + row, inv);\n";
    t += for_each(StrCat("      gf::store(out0 + i, (x[j] - mf) * inv * ", param(s.scale, scale_off),
                         s.bias >= 0 ? " + " + param(s.bias, bias_off) : "", ");\n"));
  } else {
    t += "    float m = -__int_as_float(0x7f800000);\n";
    t += for_valid(" m = gf::max(m, x[j]);\n");
    t += "    m = gf::block_max(m);\n";
    t += "    double sum = 0;\n";
    t += for_valid(" {\n        x[j] = expf(x[j] - m);\n        sum += x[j];\n      }\n");
    t += "    const float inv = static_cast<float>(1.0 / gf::block_sum(sum));\n";
    if (s.epilogue) {
      const size_t nout = s.epilogue->outputs().size();
      std::string decl;
      for (size_t o = 0; o < nout; ++o) decl += StrCat(o ? ", " : "", "w", o);
      // The epilogue reads the probabilities as the unfused Softmax stores them: rounded to the rows' dtype.
      std::string body = StrCat("      const float p = ", RoundedTo(s.x_dtype, "x[j] * inv"), ";\n");
      body += StrCat("      float ", decl, ";\n");
      body += "      " + Call("gf_epilogue",
                           BodyArgs(*s.epilogue, s.x_shape, s.prologue_inputs, s.epilogue_input, "p", z, "epi_"), nout, "w") + "\n";
      for (size_t o = 0; o < nout; ++o) body += StrCat("      gf::store(out", o, " + i, w", o, ");\n");
      t += for_each(body);
    } else {
      t += for_each("      gf::store(out0 + i, x[j] * inv);\n");
    }
  }
  t += "  }\n}\n";
  t = sig + z.Parameter() + ") {\n" + z.Declarations("  ") + t;
  k.sizes = z.values();

  std::string base = s.op == RowOp::kRms ? "rmsnorm" : s.op == RowOp::kLayer ? "layernorm" : "softmax";
  if (s.prologue) base = OpsPart(*s.prologue) + "_" + base;
  if (s.epilogue) base += "_" + OpsPart(*s.epilogue);
  if (s.prologue || s.epilogue) base = "fused_" + base;
  return Finish(head, t, base, node.output()->dtype(), std::move(k));
}

// Rope: y = x * cos + rotate_half(x) * sin over the last dim (src/cpu/kernels/rope.cc), each
// product rounded, then the add (--fmad=false), as on the CPU.
Result<CudaKernelSource> GenerateRopeKernel(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  const Value* x = node.input(0);
  const Value* cs = node.input(1);
  const Value* sn = node.input(2);
  if (!x || !cs || !sn || x->shape().empty() || x->shape().back() % 2 != 0)
    return InvalidArgument(where, ": Rope needs x (last dim even), cos and sin");
  if ((node.GetInt("rotary_dim", 0) > 0 && node.GetInt("rotary_dim", 0) != x->shape().back()) ||
      node.GetInt("interleaved", 0) != 0)
    return Unimplemented(where, ": no generated kernel rotates part of the last dim (rotary_dim) or interleaved pairs");
  const Space sp = Collapse(x->shape(), {x->shape(), cs->shape(), sn->shape()});
  const int64_t d = x->shape().back();
  CudaKernelSource k;
  k.num_elements = x->numel();
  k.scalar_work_items = k.num_elements;
  k.input_dtypes = {x->dtype(), cs->dtype(), sn->dtype()};
  k.output_dtypes = {node.output()->dtype()};
  std::string head = kDevicePrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  KernelSizes z;
  z.Use("n", k.num_elements);
  z.Use("kD", d);
  z.Use("kHalf", d / 2);
  std::string t = "  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
  t += "  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";
  t += "  for (long long i = first; i < n; i += step) {\n";
  t += "    const long long c = i % kD;\n";
  t += "    const float x2 = c < kHalf ? -gf::f32_of(in0[i + kHalf]) : gf::f32_of(in0[i - kHalf]);\n";
  t += StrCat("    const float a = gf::f32_of(in0[i]) * gf::f32_of(in1[", sp.Offset(1, "i", z), "]);\n");
  t += StrCat("    const float b = x2 * gf::f32_of(in2[", sp.Offset(2, "i", z), "]);\n");
  t += "    gf::store(out0 + i, a + b);\n  }\n}\n";
  t = StrCat("(const ", StorageType(x->dtype()), "* __restrict__ in0, const ", StorageType(cs->dtype()),
             "* __restrict__ in1, const ", StorageType(sn->dtype()), "* __restrict__ in2, ",
             StorageType(node.output()->dtype()), "* __restrict__ out0", z.Parameter(), ") {\n", z.Declarations("  "), t);
  k.sizes = z.values();
  return Finish(head, t, "rope", node.output()->dtype(), std::move(k));
}

// Transpose: out[i] = in[offset of i's permuted coordinates]; the dims and strides are sizes,
// the permutation is in the source. Any dtype (a byte copy of the element).
Result<CudaKernelSource> GenerateTransposeKernel(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  const Value* x = node.input(0);
  const Value* y = node.output();
  if (!x || !y) return InvalidArgument(where, ": needs one input and one output");
  const Shape& xs = x->shape();
  const size_t rank = xs.size();
  std::vector<int64_t> perm = node.GetInts("perm");
  if (!node.has_attr("perm")) {
    perm.resize(rank);
    for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(rank - 1 - i);
  }
  if (perm.size() != rank) return InvalidArgument(where, ": perm has ", perm.size(), " entries for rank ", rank);
  std::vector<int64_t> in_stride(rank, 1);
  for (size_t d = rank; d-- > 1;) in_stride[d - 1] = in_stride[d] * xs[d];
  CudaKernelSource k;
  k.num_elements = x->numel();
  k.scalar_work_items = k.num_elements;
  k.input_dtypes = {x->dtype()};
  k.output_dtypes = {y->dtype()};
  std::string head = kDevicePrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  const char* T = StorageType(x->dtype());
  KernelSizes z;
  z.Use("n", k.num_elements);
  std::string t = "  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
  t += "  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";
  t += "  for (long long i = first; i < n; i += step) {\n    long long rest = i, src = 0;\n";
  for (size_t d = rank; d-- > 0;) {
    const size_t from = static_cast<size_t>(perm[d]);
    const std::string dim = z.Use(StrCat("dim", from), xs[from]);
    t += StrCat("    src += (rest % ", dim, ") * ", z.Use(StrCat("stride", from), in_stride[from]), ";\n");
    if (d > 0) t += StrCat("    rest /= ", dim, ";\n");
  }
  t += "    out0[i] = in0[src];\n  }\n}\n";
  t = StrCat("(const ", T, "* __restrict__ in0, ", T, "* __restrict__ out0", z.Parameter(), ") {\n", z.Declarations("  "),
             t);
  k.sizes = z.values();
  return Finish(head, t, "transpose", x->dtype(), std::move(k));
}

namespace {

// Where a FusedGemm's projection s is read by its epilogue: the node output that IS it (rows
// of N), else the GEMM workspace (rows of S*N), as in src/cpu/kernels/fused_gemm.cc.
std::vector<int64_t> EpilogueRowStrides(const std::vector<int64_t>& out_proj, int64_t splits, int64_t n) {
  std::vector<int64_t> ld(static_cast<size_t>(splits), splits * n);
  for (int64_t s : out_proj)
    if (s >= 0 && s < splits) ld[static_cast<size_t>(s)] = n;
  return ld;
}

}  // namespace

Result<CudaKernelSource> GenerateGemmEpilogueKernel(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  const Graph* epi = attrs.epilogue.get();
  if (!epi) return InvalidArgument(where, " has no epilogue: the GEMM alone runs in cuBLAS");
  const Value* w = node.input(1);
  const int64_t splits = attrs.splits;
  if (!w || w->shape().size() != 2 || splits < 1 || w->shape()[1] % splits != 0)
    return InvalidArgument(where, ": weights do not split into ", splits, " projections");
  const int64_t n = w->shape()[1] / splits;
  // "epilogue_<ops>_<dtype>_<hash8>": named by its source, not by the node's kernel_name (which
  // hashes the GEMM's sizes).
  return GenerateElementwiseKernel(*epi, "", EpilogueRowStrides(attrs.out_proj, splits, n), "epilogue_");
}

}  // namespace graphfuse::cuda

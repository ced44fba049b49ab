// FusedNorm and FusedSoftmax: a row kernel (RMSNorm / LayerNormalization / Softmax over the
// last axis) with the elementwise groups around it run inside the same launch. The pass that
// makes these nodes is src/passes/fuse_rowwise.cc.
//
// Per block of rows (about kBlockElements values, so the block stays in L1/L2):
//
//   prologue program over the block's elements  -> stores the values still needed outside, and
//                                                  the row op's input (into the output buffer
//                                                  when nothing else reads it)
//   row op on each row of the block, in place    -> statistics in double (norms); max-shifted
//                                                  f32 exp with double lane sums (softmax)
//   epilogue program over the block (softmax)    -> in place on the probabilities
//
// Rows are split over the pool's threads; each task gets the pool's per-thread scratch for the
// tile programs' registers. The row math follows the unfused kernels' recipes (norm.cc,
// softmax.cc) so that fused and unfused results agree to rounding.
//
// FusedNorm   inputs:  prologue body inputs..., scale (optional for RMSNorm), bias (LayerNorm)
//             attrs:   body, norm ("RMSNorm" | "LayerNormalization"), epsilon, norm_input (the body
//                      output the norm reads), prologue_outputs (body outputs 0..k-1 are node
//                      outputs 1..k; a body output past them is the norm input kept internal)
//             outputs: Y, body outputs 0..prologue_outputs-1
// FusedSoftmax inputs: prologue body inputs... (or X alone), epilogue inputs except the one that
//                      reads the probabilities
//             attrs:   prologue / epilogue (optional bodies), softmax_input, prologue_outputs,
//                      epilogue_input (the epilogue body input holding the probabilities)
//             outputs: epilogue outputs... (or the probabilities), prologue outputs 0..k-1
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "cpu/lower_group.h"
#include "cpu/simd.h"
#include "cpu/tile_program.h"
#include "kernel_util.h"
#include "softmax_row.h"
#include "norm_rows.h"
#include "rowwise_layout.h"

namespace graphfuse::kernels {
namespace {

// Elements per block of rows: the prologue's outputs for the block are still in cache when
// the row op reads them back (32 KiB of f32 per stream).
constexpr int64_t kBlockElements = 8 * 1024;

}  // namespace

const Graph* GraphAttr(const AttributeMap& attrs, const char* key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return nullptr;
  const auto* g = std::get_if<std::shared_ptr<const Graph>>(&it->second);
  return g ? g->get() : nullptr;
}

// ---- layouts: how a node's inputs and outputs map onto its bodies (shared by inference and
// the kernels, so that a kernel never indexes past what inference accepted) ----

Result<NormLayout> ReadNormLayout(const std::string& where, const AttributeMap& attrs, size_t num_inputs) {
  NormLayout l;
  l.body = GraphAttr(attrs, "body");
  if (!l.body) return InvalidArgument(where, ": needs a 'body' graph attribute");
  const std::string norm = AttrString(attrs, "norm", "");
  if (norm != "RMSNorm" && norm != "LayerNormalization")
    return InvalidArgument(where, ": attribute norm is '", norm, "', expected RMSNorm or LayerNormalization");
  l.layer_norm = norm == "LayerNormalization";
  l.body_inputs = l.body->inputs().size();
  if (num_inputs < l.body_inputs)
    return InvalidArgument(where, ": has ", num_inputs, " inputs, its body takes ", l.body_inputs);
  l.params = num_inputs - l.body_inputs;
  if (l.params > (l.layer_norm ? 2u : 1u) || (l.layer_norm && l.params < 1))
    return InvalidArgument(where, ": ", norm, " takes ", l.layer_norm ? "scale and an optional bias" : "an optional scale",
                           " after the body's ", l.body_inputs, " inputs, got ", l.params, " more inputs");
  const int64_t nout = static_cast<int64_t>(l.body->outputs().size());
  l.norm_input = AttrInt(attrs, "norm_input", -1);
  l.prologue_outputs = AttrInt(attrs, "prologue_outputs", -1);
  if (l.prologue_outputs < 0 || l.prologue_outputs > nout || nout > l.prologue_outputs + 1 || l.norm_input < 0 ||
      l.norm_input >= nout || (nout == l.prologue_outputs + 1 && l.norm_input != l.prologue_outputs))
    return InvalidArgument(where, ": norm_input ", l.norm_input, " / prologue_outputs ", l.prologue_outputs,
                           " do not fit a body with ", nout, " outputs");
  l.x = l.body->outputs()[static_cast<size_t>(l.norm_input)];
  if (l.x->dtype() != DType::kF32 || l.x->shape().empty())
    return InvalidArgument(where, ": the norm input ", l.x->TypeString(), " must be f32 of rank >= 1");
  return l;
}

Result<SoftmaxLayout> ReadSoftmaxLayout(const std::string& where, const AttributeMap& attrs,
                                        const std::vector<const Value*>& inputs) {
  SoftmaxLayout l;
  l.prologue = GraphAttr(attrs, "prologue");
  l.epilogue = GraphAttr(attrs, "epilogue");
  if (!l.prologue && !l.epilogue) return InvalidArgument(where, ": needs a 'prologue' or an 'epilogue' graph attribute");
  if (l.prologue) {
    const int64_t nout = static_cast<int64_t>(l.prologue->outputs().size());
    l.prologue_inputs = l.prologue->inputs().size();
    l.softmax_input = AttrInt(attrs, "softmax_input", -1);
    l.prologue_outputs = AttrInt(attrs, "prologue_outputs", -1);
    if (l.prologue_outputs < 0 || l.prologue_outputs > nout || nout > l.prologue_outputs + 1 || l.softmax_input < 0 ||
        l.softmax_input >= nout || (nout == l.prologue_outputs + 1 && l.softmax_input != l.prologue_outputs))
      return InvalidArgument(where, ": softmax_input ", l.softmax_input, " / prologue_outputs ", l.prologue_outputs,
                             " do not fit a prologue with ", nout, " outputs");
    const Value* x = l.prologue->outputs()[static_cast<size_t>(l.softmax_input)];
    l.x = {x->dtype(), x->shape()};
  }
  if (inputs.size() < l.prologue_inputs)
    return InvalidArgument(where, ": has ", inputs.size(), " inputs, the prologue reads ", l.prologue_inputs);
  if (!l.prologue) {
    if (!inputs[0]) return InvalidArgument(where, ": input 0 is missing");
    l.x = {inputs[0]->dtype(), inputs[0]->shape()};
  }
  if (l.x.dtype != DType::kF32 || l.x.shape.empty())
    return InvalidArgument(where, ": the softmax input ", TypeStr(l.x.dtype, l.x.shape), " must be f32 of rank >= 1");
  const size_t rest = inputs.size() - l.prologue_inputs;
  if (l.epilogue) {
    const size_t nin = l.epilogue->inputs().size();
    l.epilogue_input = AttrInt(attrs, "epilogue_input", -1);
    if (l.epilogue_input < 0 || l.epilogue_input >= static_cast<int64_t>(nin) || rest + 1 != nin)
      return InvalidArgument(where, ": epilogue_input ", l.epilogue_input, " does not fit an epilogue with ", nin,
                             " inputs and ", rest, " node inputs after the prologue's");
    const Value* p = l.epilogue->inputs()[static_cast<size_t>(l.epilogue_input)];
    const Value* out0 = l.epilogue->outputs().empty() ? nullptr : l.epilogue->outputs()[0];
    if (p->dtype() != l.x.dtype || p->shape() != l.x.shape || !out0 || out0->dtype() != DType::kF32 ||
        out0->shape() != l.x.shape)
      return InvalidArgument(where, ": the epilogue must read and write f32", ShapeToString(l.x.shape),
                             " (the softmax's rows)");
    l.main_outputs = l.epilogue->outputs().size();
  } else if (rest != 0) {
    return InvalidArgument(where, ": ", rest, " inputs beyond the prologue's, but no epilogue");
  }
  return l;
}

namespace {

// Checks node inputs [offset, offset + n) against a body's inputs, skipping body input `skip`.
Status CheckBodyInputs(const std::string& where, const char* what, const Graph& body,
                       const std::vector<const Value*>& inputs, size_t offset, int64_t skip = -1) {
  size_t k = offset;
  for (size_t i = 0; i < body.inputs().size(); ++i) {
    if (static_cast<int64_t>(i) == skip) continue;
    const Value* b = body.inputs()[i];
    const Value* in = k < inputs.size() ? inputs[k] : nullptr;
    if (!in || in->dtype() != b->dtype() || in->shape() != b->shape())
      return InvalidArgument(where, ": input ", k, " is ", TypeStr(in), ", the ", what, " reads ", b->TypeString());
    ++k;
  }
  return Status::Ok();
}

std::vector<const Value*> ConstInputs(const InferContext& ctx) { return {ctx.inputs.begin(), ctx.inputs.end()}; }

Result<std::vector<ValueType>> InferFusedNorm(const InferContext& ctx) {
  const std::string where = ctx.Describe();
  GF_ASSIGN_OR_RETURN(NormLayout l, ReadNormLayout(where, ctx.attrs, ctx.inputs.size()));
  GF_RETURN_IF_ERROR(CheckBodyInputs(where, "body", *l.body, ConstInputs(ctx), 0));
  const int64_t d = l.x->shape().back();
  for (size_t i = 0; i < l.params; ++i) {
    const Value* p = ctx.input(l.body_inputs + i);
    if (!p) return InvalidArgument(where, ": input ", l.body_inputs + i, " (norm parameter) is missing");
    const Shape& s = p->shape();
    if (p->dtype() != DType::kF32 || s.size() > 1 || (s.size() == 1 && s[0] != 1 && s[0] != d))
      return InvalidArgument(where, ": norm parameter ", p->TypeString(), " must be f32[", d,
                             "], f32[1] or a scalar (the rows are ", l.x->TypeString(), ")");
  }
  std::vector<ValueType> out{{DType::kF32, l.x->shape()}};
  for (int64_t k = 0; k < l.prologue_outputs; ++k) {
    const Value* o = l.body->outputs()[static_cast<size_t>(k)];
    out.push_back({o->dtype(), o->shape()});
  }
  return out;
}

Result<std::vector<ValueType>> InferFusedSoftmax(const InferContext& ctx) {
  const std::string where = ctx.Describe();
  const std::vector<const Value*> inputs = ConstInputs(ctx);
  GF_ASSIGN_OR_RETURN(SoftmaxLayout l, ReadSoftmaxLayout(where, ctx.attrs, inputs));
  if (l.prologue) GF_RETURN_IF_ERROR(CheckBodyInputs(where, "prologue", *l.prologue, inputs, 0));
  if (l.epilogue)
    GF_RETURN_IF_ERROR(CheckBodyInputs(where, "epilogue", *l.epilogue, inputs, l.prologue_inputs, l.epilogue_input));
  std::vector<ValueType> out;
  if (l.epilogue) {
    for (const Value* o : l.epilogue->outputs()) out.push_back({o->dtype(), o->shape()});
  } else {
    out.push_back(l.x);
  }
  for (int64_t k = 0; k < l.prologue_outputs; ++k) {
    const Value* o = l.prologue->outputs()[static_cast<size_t>(k)];
    out.push_back({o->dtype(), o->shape()});
  }
  return out;
}

// ---- running ----

// Runs fn(row_begin, row_end, scratch) over [0, rows) in blocks of about kBlockElements values,
// the rows split over the pool's threads; `scratch` (scratch_bytes, per task) holds the tile
// programs' registers.
template <class F>
void ForRowBlocks(const CpuContext& cpu, int64_t rows, int64_t d, int64_t cost, size_t scratch_bytes, F&& fn) {
  if (rows <= 0) return;
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(d, 1));
  auto run = [&](int64_t r0, int64_t r1, void* scratch) {
    for (int64_t b = r0; b < r1; b += block) fn(b, std::min(r1, b + block), scratch);
  };
  const int64_t per_row = d * cost;
  const int64_t work = per_row > 0 && rows > INT64_MAX / per_row ? INT64_MAX : rows * per_row;
  const int n = static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(work), rows));
  if (cpu.pool == nullptr) {
    auto local = std::make_unique<int64_t[]>(scratch_bytes / 8 + 1);
    run(0, rows, local.get());
    return;
  }
  if (n <= 1) {
    run(0, rows, cpu.pool->Scratch(0, scratch_bytes));
    return;
  }
  cpu.pool->Parallel(n, [&](int tid, int nt) {
    const int64_t b = rows * tid / nt, e = rows * (tid + 1) / nt;
    if (b < e) run(b, e, cpu.pool->Scratch(tid, scratch_bytes));
  });
}

// A lowered body with its data pointers bound, ready to run over element ranges.
Result<cpu::TileRunner> BindProgram(const Graph& body, const std::vector<const void*>& in,
                                    const std::vector<void*>& out, int64_t* cost, CpuCodegen* codegen) {
  GF_ASSIGN_OR_RETURN(cpu::TileProgram p, cpu::LowerElementwiseGroup(body));
  GF_CHECK(p.inputs.size() == in.size() && p.outputs.size() == out.size(), "body '", body.name(), "' binding");
  for (size_t k = 0; k < in.size(); ++k) p.inputs[k].data = in[k];
  for (size_t k = 0; k < out.size(); ++k) p.outputs[k].data = out[k];
  *cost += p.CostPerElement();
  return cpu::TileRunner(p, codegen);
}

Status FusedNormKernel(const KernelContext& ctx) {
  GF_ASSIGN_OR_RETURN(NormLayout l, ReadNormLayout(KernelWhere(ctx), ctx.node.attrs(), ctx.inputs.size()));
  const TensorView& Y = ctx.outputs[0];
  const int64_t d = Y.shape.back();
  const int64_t rows = d == 0 ? 0 : Y.numel() / d;
  if (rows == 0) return Status::Ok();
  // Body outputs past the node's go to Y's buffer: the norm then runs in place.
  std::vector<const void*> in;
  std::vector<void*> out;
  for (size_t k = 0; k < l.body_inputs; ++k) in.push_back(ctx.inputs[k].data);
  for (size_t k = 0; k < l.body->outputs().size(); ++k)
    out.push_back(static_cast<int64_t>(k) < l.prologue_outputs ? ctx.outputs[k + 1].data : Y.data);
  int64_t cost = 4;
  GF_ASSIGN_OR_RETURN(cpu::TileRunner prologue, BindProgram(*l.body, in, out, &cost, ctx.cpu.codegen));
  const float* xs = static_cast<const float*>(out[static_cast<size_t>(l.norm_input)]);
  float* ys = Y.as<float>();

  const bool has_scale = l.params >= 1, has_bias = l.params >= 2;
  const std::vector<float> scale = has_scale ? ParamRow(ctx.inputs[l.body_inputs], Shape{d}) : std::vector<float>();
  const std::vector<float> bias = has_bias ? ParamRow(ctx.inputs[l.body_inputs + 1], Shape{d}) : std::vector<float>();
  const double eps = ctx.node.GetFloat("epsilon", l.layer_norm ? 1e-5f : 1e-6f);
  auto norm_row = [&](const float* x, float* y) {
    if (l.layer_norm) LayerNormRow(x, y, d, scale.data(), has_bias ? bias.data() : nullptr, eps);
    else RmsNormRow(x, y, d, has_scale ? scale.data() : nullptr, eps);
  };
  ForRowBlocks(ctx.cpu, rows, d, cost, prologue.scratch_bytes(), [&](int64_t r0, int64_t r1, void* scratch) {
    prologue.Run(r0 * d, r1 * d, scratch);
    for (int64_t r = r0; r < r1; ++r) norm_row(xs + r * d, ys + r * d);
  });
  return Status::Ok();
}

// ---- softmax row (x and y may be the same row) ----

using simd::kLanes;
using simd::VF;


Status FusedSoftmaxKernel(const KernelContext& ctx) {
  std::vector<const Value*> node_inputs(ctx.node.inputs().begin(), ctx.node.inputs().end());
  GF_ASSIGN_OR_RETURN(SoftmaxLayout l, ReadSoftmaxLayout(KernelWhere(ctx), ctx.node.attrs(), node_inputs));
  const int64_t n = l.x.shape.back();
  int64_t numel = 1;
  for (int64_t s : l.x.shape) numel *= s;
  const int64_t rows = n == 0 ? 0 : numel / n;
  if (rows == 0) return Status::Ok();
  float* ys = ctx.outputs[0].as<float>();
  const float* xs = ctx.inputs[0].as<const float>();
  int64_t cost = 8;
  std::optional<cpu::TileRunner> prologue, epilogue;
  if (l.prologue) {
    std::vector<const void*> in;
    std::vector<void*> out;
    for (size_t k = 0; k < l.prologue_inputs; ++k) in.push_back(ctx.inputs[k].data);
    for (size_t k = 0; k < l.prologue->outputs().size(); ++k)
      out.push_back(static_cast<int64_t>(k) < l.prologue_outputs ? ctx.outputs[l.main_outputs + k].data
                                                                  : static_cast<void*>(ys));
    GF_ASSIGN_OR_RETURN(prologue, BindProgram(*l.prologue, in, out, &cost, ctx.cpu.codegen));
    xs = static_cast<const float*>(out[static_cast<size_t>(l.softmax_input)]);
  }
  if (l.epilogue) {
    std::vector<const void*> in;
    std::vector<void*> out;
    size_t next = l.prologue_inputs;
    for (size_t k = 0; k < l.epilogue->inputs().size(); ++k)
      in.push_back(static_cast<int64_t>(k) == l.epilogue_input ? static_cast<const void*>(ys) : ctx.inputs[next++].data);
    for (size_t k = 0; k < l.main_outputs; ++k) out.push_back(ctx.outputs[k].data);
    GF_ASSIGN_OR_RETURN(epilogue, BindProgram(*l.epilogue, in, out, &cost, ctx.cpu.codegen));
  }
  const size_t scratch = std::max(prologue ? prologue->scratch_bytes() : 0, epilogue ? epilogue->scratch_bytes() : 0);
  ForRowBlocks(ctx.cpu, rows, n, cost, scratch, [&](int64_t r0, int64_t r1, void* s) {
    if (prologue) prologue->Run(r0 * n, r1 * n, s);
    for (int64_t r = r0; r < r1; ++r) SoftmaxRow(xs + r * n, ys + r * n, n);
    if (epilogue) epilogue->Run(r0 * n, r1 * n, s);
  });
  return Status::Ok();
}

}  // namespace

std::vector<OpSchema> FusedRowwiseSchemas() {
  constexpr int kMaxIn = static_cast<int>(2 * cpu::kMaxTileInputs + 2);
  return {
      {"FusedNorm", 1, kMaxIn, -1, InferFusedNorm, FusedNormKernel},
      {"FusedSoftmax", 1, kMaxIn, -1, InferFusedSoftmax, FusedSoftmaxKernel},
  };
}

}  // namespace graphfuse::kernels

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
// The CPU kernels; the layouts and the inference are in src/ir/schemas/fused_rowwise.cc.
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "cpu/lower_group.h"
#include "cpu/simd.h"
#include "cpu/tile_program.h"
#include "ir/schemas/rowwise_layout.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/norm_rows.h"
#include "cpu/kernels/softmax_row.h"

namespace graphfuse::kernels {
namespace {

// Elements per block of rows: the prologue's outputs for the block are still in cache when
// the row op reads them back (32 KiB of f32 per stream).
constexpr int64_t kBlockElements = 8 * 1024;

using schemas::NormLayout;
using schemas::ReadNormLayout;
using schemas::ReadSoftmaxLayout;
using schemas::SoftmaxLayout;

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

std::vector<CpuKernel> FusedRowwiseKernels() {
  return {
      {"FusedNorm", FusedNormKernel},
      {"FusedSoftmax", FusedSoftmaxKernel},
  };
}

}  // namespace graphfuse::kernels

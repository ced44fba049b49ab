// Rope: rotary position embedding in rotate-half form (the LLaMA / GPT-NeoX convention),
//   Y = X * cos + rotate_half(X) * sin,
//   rotate_half(X)[..., i] = -X[..., i + d/2]  for i <  d/2,
//                             X[..., i - d/2]  for i >= d/2,
// over the last dim d of X (even). cos and sin have X's dtype and broadcast unidirectionally to
// X's shape (typically [S, d] or [1, 1, S, d] against X [B, H, S, d]). With rotary_dim = r,
// the first r values rotate (halves of r, tables of r values) and the rest are copied. With
// interleaved = 1 the rotated pairs are (x[2i], x[2i+1]) (GPT-J's rotate_every_two), the
// tables holding each angle twice.
//
// Every element is computed in f32 as (x * c) + ((-x2) * s): each product rounded on its own,
// then the add (the library builds with -ffp-contract=off), which is exactly what the decomposed
// Mul / Neg / Concat / Mul / Add graph computes, so canonicalizing that graph to Rope is bit exact
// for f32. f16/bf16 rows are converted to f32, computed, and rounded once when stored.
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/rope.cc.
#include <vector>

#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/rope_row.h"

namespace graphfuse::kernels {
namespace {

using schemas::BroadcastsTo;

// The element offset of row `r` of X (X viewed as [rows, d]) in a table read with broadcast
// strides `st` (one per dim of X).
int64_t RowOffset(int64_t r, const Shape& xshape, const std::vector<int64_t>& st) {
  int64_t off = 0;
  for (size_t k = xshape.size() - 1; k-- > 0;) {
    off += (r % xshape[k]) * st[k];
    r /= xshape[k];
  }
  return off;
}

// A row of n f32 values: the buffer itself when it is f32 and contiguous, else `scratch`.
const float* RowF32(const TensorView& t, int64_t offset, int64_t stride, int64_t n, std::vector<float>& scratch) {
  if (t.dtype == DType::kF32 && stride == 1) return t.as<const float>() + offset;
  LoadF32(t.dtype, t.data, offset, stride, n, scratch.data());
  return scratch.data();
}

Status RopeKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& C = ctx.inputs[1];
  const TensorView& S = ctx.inputs[2];
  const TensorView& Y = ctx.outputs[0];
  if (X.shape.empty()) return InvalidArgument(KernelWhere(ctx), ": Rope needs x [..., d]");
  const int64_t d = X.shape.back();
  const int64_t rot = ctx.node.GetInt("rotary_dim", 0) > 0 ? ctx.node.GetInt("rotary_dim", 0) : d;
  Shape rotated = X.shape;
  rotated.back() = rot;
  if (rot % 2 != 0 || rot > d || !BroadcastsTo(C.shape, rotated) || !BroadcastsTo(S.shape, rotated) ||
      !IsFloat(X.dtype) || C.dtype != X.dtype || S.dtype != X.dtype)
    return InvalidArgument(KernelWhere(ctx), ": Rope needs x [..., d], rotary_dim r (d by default) even and at most d, "
                                             "and cos/sin of x's dtype broadcasting to x's shape with r for d");
  if (d == 0) return Status::Ok();
  const bool interleaved = ctx.node.GetInt("interleaved", 0) != 0;
  const int64_t rows = Product(X.shape) / d;
  const std::vector<int64_t> cst = BroadcastStrides(C.shape, rotated);
  const std::vector<int64_t> sst = BroadcastStrides(S.shape, rotated);
  // Y over X (in place) goes through scratch: each half of a row reads the other half.
  const bool direct_out = Y.dtype == DType::kF32 && Y.data != X.data;
  ParallelFor(ctx.cpu, rows, d * 3, [&](int64_t begin, int64_t end) {
    std::vector<float> xs(static_cast<size_t>(d)), cs(static_cast<size_t>(d)), ss(static_cast<size_t>(d)),
        ys(static_cast<size_t>(d));
    for (int64_t r = begin; r < end; ++r) {
      const float* x = RowF32(X, r * d, 1, d, xs);
      const float* c = RowF32(C, RowOffset(r, X.shape, cst), cst.back(), rot, cs);
      const float* s = RowF32(S, RowOffset(r, X.shape, sst), sst.back(), rot, ss);
      float* y = direct_out ? Y.as<float>() + r * d : ys.data();
      RopeRowOf(interleaved, x, c, s, rot, d, y);
      if (!direct_out) StoreF32(Y.dtype, Y.data, r * d, 1, d, y);
    }
  });
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> RopeKernels() {
  return {
      {"Rope", RopeKernel},
  };
}

}  // namespace graphfuse::kernels

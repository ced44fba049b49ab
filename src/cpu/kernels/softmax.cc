// Softmax and LogSoftmax over one axis (ONNX opset 13: axis default -1, the single axis, not
// the flattened tail of opset 11). Numerically stable: each row subtracts its max before exp,
// so exp never overflows; a row holding NaN gives NaN, as numpy does.
//   softmax(x)_i    = exp(x_i - m) / sum_j exp(x_j - m)
//   logsoftmax(x)_i = (x_i - m) - log(sum_j exp(x_j - m))
// LogSoftmax subtracts in that order: x_i - m is exact wherever it matters, and log(sum) lies in
// [0, log n]; m + log(sum) would be rounded to the ulp of m first (about 5e-4 at m = 1e4).
// exp/log are SLEEF's 1-ulp vector functions through src/cpu/simd.h (the same vocabulary the
// elementwise kernels use). Rows along a non-innermost axis are gathered into f32 scratch.
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/softmax.cc.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/simd.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/softmax_row.h"

namespace graphfuse::kernels {
namespace {

using simd::kLanes;
using simd::VF;

void SoftmaxOrLogRow(const float* x, float* y, int64_t n, bool log_softmax) {
  if (n == 0) return;
  if (!log_softmax) return SoftmaxRow(x, y, n);
  const float m = RowMax(x, n);
  // The exps are only summed, so x and y may be the same row.
  const double sum = ExpShiftSum(x, nullptr, n, m);
  const float log_sum = static_cast<float>(std::log(sum));
  const VF vm(m), vl(log_sum);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) ((VF::Load(x + i) - vm) - vl).Store(y + i);
  for (; i < n; ++i) y[i] = (x[i] - m) - log_sum;
}

// Softmax over a non-innermost axis of f32 data: a block of kCols adjacent columns is
// processed together, so every pass reads contiguous memory (a per-column gather would touch
// one element per cache line). x/y point at element (o, 0, i0); rows are `stride` apart.
constexpr int64_t kCols = 64;
static_assert(kCols % kLanes == 0);

void SoftmaxColumns(const float* x, float* y, int64_t n, int64_t stride, int64_t w, bool log_softmax) {
  constexpr int kVecs = static_cast<int>(kCols / kLanes);
  const float ninf = -std::numeric_limits<float>::infinity();
  auto load = [&](const float* p, int c) {
    const int64_t rem = w - c * kLanes;
    return rem >= kLanes ? VF::Load(p + c * kLanes) : LoadTail(p + c * kLanes, rem, ninf);
  };
  auto store = [&](VF v, float* p, int c) {
    const int64_t rem = w - c * kLanes;
    if (rem >= kLanes) v.Store(p + c * kLanes);
    else StoreTail(v, p + c * kLanes, rem);
  };
  const int vecs = static_cast<int>((w + kLanes - 1) / kLanes);
  VF m[kVecs], acc[kVecs];
  for (int c = 0; c < vecs; ++c) m[c] = VF(ninf), acc[c] = VF(0.0);
  for (int64_t k = 0; k < n; ++k)
    for (int c = 0; c < vecs; ++c) m[c] = simd::max(m[c], load(x + k * stride, c));
  // Sums: f32 vectors over at most 64 rows, then double, so long columns keep their precision.
  alignas(64) float lanes[kCols];
  double sum[kCols] = {};
  auto flush = [&] {
    for (int c = 0; c < vecs; ++c) {
      acc[c].Store(lanes + c * kLanes);
      acc[c] = VF(0.0);
    }
    for (int64_t i = 0; i < w; ++i) sum[i] += lanes[i];
  };
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < vecs; ++c) {
      const VF e = simd::exp_softmax(load(x + k * stride, c) - m[c]);
      if (!log_softmax) store(e, y + k * stride, c);
      acc[c] = acc[c] + e;
    }
    if ((k & 63) == 63) flush();
  }
  flush();
  // Per column: log(sum) for LogSoftmax (subtracted after the max), 1 / sum for Softmax.
  alignas(64) float f[kCols];
  VF fv[kVecs];
  for (int64_t i = 0; i < w; ++i) f[i] = static_cast<float>(log_softmax ? std::log(sum[i]) : 1.0 / sum[i]);
  for (int c = 0; c < vecs; ++c) fv[c] = VF::Load(f + c * kLanes);
  for (int64_t k = 0; k < n; ++k)
    for (int c = 0; c < vecs; ++c) {
      if (log_softmax) store((load(x + k * stride, c) - m[c]) - fv[c], y + k * stride, c);
      else store(load(y + k * stride, c) * fv[c], y + k * stride, c);
    }
}

Status SoftmaxImpl(const KernelContext& ctx, bool log_softmax) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& Y = ctx.outputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", -1, rank));
  const int64_t n = X.shape[axis];
  const int64_t outer = Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size());
  const int64_t rows = outer * inner;
  if (rows == 0 || n == 0) return Status::Ok();
  if (inner > 1 && X.dtype == DType::kF32) {
    const int64_t blocks = (inner + kCols - 1) / kCols;
    ParallelFor(ctx.cpu, outer * blocks, n * kCols * 8, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t o = b / blocks, i0 = (b % blocks) * kCols, off = o * n * inner + i0;
        SoftmaxColumns(X.as<const float>() + off, Y.as<float>() + off, n, inner, std::min(kCols, inner - i0),
                       log_softmax);
      }
    });
    return Status::Ok();
  }
  ParallelFor(ctx.cpu, rows, n * 8, [&](int64_t begin, int64_t end) {
    if (inner == 1 && X.dtype == DType::kF32) {
      for (int64_t r = begin; r < end; ++r) SoftmaxOrLogRow(X.as<const float>() + r * n, Y.as<float>() + r * n, n, log_softmax);
      return;
    }
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      // Row r = (o, i): elements o * n * inner + k * inner + i for k in [0, n).
      const int64_t base = (r / inner) * n * inner + r % inner;
      LoadF32(X.dtype, X.data, base, inner, n, row.data());
      SoftmaxOrLogRow(row.data(), row.data(), n, log_softmax);
      StoreF32(Y.dtype, Y.data, base, inner, n, row.data());
    }
  });
  return Status::Ok();
}

Status SoftmaxKernel(const KernelContext& ctx) { return SoftmaxImpl(ctx, false); }
Status LogSoftmaxKernel(const KernelContext& ctx) { return SoftmaxImpl(ctx, true); }

}  // namespace

std::vector<CpuKernel> SoftmaxKernels() {
  return {
      {"Softmax", SoftmaxKernel},
      {"LogSoftmax", LogSoftmaxKernel},
  };
}

}  // namespace graphfuse::kernels

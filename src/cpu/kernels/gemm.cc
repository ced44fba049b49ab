// MatMul (numpy matmul semantics: batched broadcasting, 1-D operands) and Gemm (alpha, beta,
// transA, transB, C broadcast): by constant 2-D weights through PackedGemm (packed_gemm.h),
// else through oneDNN's sgemm (sgemm.h), each GEMM's columns split over graphfuse's pool.
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/gemm.cc.
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "ir/schemas/gemm.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/packed_gemm.h"
#include "cpu/kernels/sgemm.h"

namespace graphfuse::kernels {
namespace {

using schemas::GemmDims;
using schemas::GemmShapes;
using schemas::MatMulDims;
using schemas::MatMulShapes;

Status CheckBlasDims(const KernelContext& ctx, std::initializer_list<int64_t> dims) {
  for (int64_t v : dims)
    if (v > INT_MAX)
      return Unimplemented(KernelWhere(ctx), ": a GEMM dimension of ", v, " exceeds the BLAS int range");
  return Status::Ok();
}

Status RequireF32(const KernelContext& ctx) {
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (HasInput(ctx, i) && ctx.inputs[i].dtype != DType::kF32)
      return Unimplemented(KernelWhere(ctx), ": the CPU GEMM supports f32 only, not ", DTypeName(ctx.inputs[i].dtype));
  return Status::Ok();
}

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major: the columns of C split over graphfuse's
// pool, each task one sgemm on its thread.
void ParallelSgemm(const CpuContext& cpu, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  auto run = [&](int64_t j0, int64_t j1) {
    if (j1 > j0) Sgemm(ta, tb, m, j1 - j0, k, alpha, a, lda, b + (tb ? j0 * ldb : j0), ldb, beta, c + j0, ldc);
  };
  // Work in multiply-adds / 8 against the pool's per-thread grain; column blocks of 64.
  const int threads = static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(m * n * std::max<int64_t>(k, 1) / 8), n / 64));
  if (threads <= 1 || cpu.pool == nullptr) {
    run(0, n);
    return;
  }
  cpu.pool->Parallel(threads, [&](int tid, int nt) {
    const int64_t blocks = (n + 63) / 64;
    run(std::min(n, blocks * tid / nt * 64), std::min(n, blocks * (tid + 1) / nt * 64));
  });
}

// A MatMul by constant 2-D f32 weights, A's rows flattened: its m, k, n, the weights packed
// once (PrepareMatMul); nullopt for any other MatMul.
struct PackedDims {
  int64_t m, k, n;
};
std::optional<PackedDims> PackedMatMulDims(const Node& node) {
  const Value* a = node.input(0);
  const Value* b = node.input(1);
  if (!b->constant() || b->shape().size() != 2 || a->shape().size() < 2 || a->dtype() != DType::kF32 ||
      b->dtype() != DType::kF32 || a->numel() == 0 || b->numel() == 0)
    return std::nullopt;
  const int64_t k = b->shape()[0];
  return PackedDims{a->numel() / k, k, b->shape()[1]};
}

Result<std::shared_ptr<const void>> PrepareMatMul(const Node& node, const PrepareOptions& options) {
  const std::optional<PackedDims> d = PackedMatMulDims(node);
  if (!d) return std::shared_ptr<const void>();
  const Tensor& w = *node.input(1)->constant();
  GF_ASSIGN_OR_RETURN(auto packed, PackedGemm::Create(d->m, d->k, d->n, w.data_as<float>(), d->n, d->n, {},
                                                      PackOptionsFor(options, w, "all")));
  return std::shared_ptr<const void>(packed);
}

std::string DescribeMatMul(const Node& node, const PrepareOptions& options) {
  if (node.input(0)->dtype() != DType::kF32 || node.input(1)->dtype() != DType::kF32) return "";
  if (const std::optional<PackedDims> d = PackedMatMulDims(node))
    return DescribePackedGemm(d->m, d->k, d->n, options);
  return StrCat(kActivationGemms, " (the second operand is not a constant)");
}

Status MatMulKernel(const KernelContext& ctx) {
  GF_RETURN_IF_ERROR(RequireF32(ctx));
  const TensorView& A = ctx.inputs[0];
  const TensorView& B = ctx.inputs[1];
  const TensorView& Y = ctx.outputs[0];
  GF_ASSIGN_OR_RETURN(MatMulDims d, MatMulShapes(A.shape, B.shape, KernelWhere(ctx)));
  const int64_t m = d.m, k = d.k, n = d.n;
  GF_RETURN_IF_ERROR(CheckBlasDims(ctx, {m, n, k}));
  const int64_t out_numel = Y.numel();
  if (out_numel == 0) return Status::Ok();
  float* y = Y.as<float>();
  if (k == 0) {
    std::fill(y, y + out_numel, 0.f);
    return Status::Ok();
  }
  const float* a = A.as<const float>();
  const float* b = B.as<const float>();
  const Shape a_batch(d.a.begin(), d.a.end() - 2), b_batch(d.b.begin(), d.b.end() - 2);
  const int64_t nbatch = Product(d.batch), na = Product(a_batch), nb = Product(b_batch);

  // B shared by every batch and A not broadcast: one GEMM over all rows of A.
  if (nb == 1 && na == nbatch) {
    GF_RETURN_IF_ERROR(CheckBlasDims(ctx, {nbatch * m}));
    if (ctx.state) {  // weights packed when the plan was compiled
      RunPackedBlocks(ctx.cpu, *static_cast<const PackedGemm*>(ctx.state), nbatch * m * n * k / 8, a, y);
      return Status::Ok();
    }
    ParallelSgemm(ctx.cpu, false, false, nbatch * m, n, k, 1.f, a, k, b, n, 0.f, y, n);
    return Status::Ok();
  }
  // General case: one GEMM per batch, operands located through broadcast strides.
  const std::vector<int64_t> sa = BroadcastStrides(a_batch, d.batch), sb = BroadcastStrides(b_batch, d.batch);
  std::vector<int64_t> idx(d.batch.size(), 0);
  for (int64_t t = 0; t < nbatch; ++t) {
    int64_t oa = 0, ob = 0;
    for (size_t i = 0; i < idx.size(); ++i) oa += idx[i] * sa[i], ob += idx[i] * sb[i];
    ParallelSgemm(ctx.cpu, false, false, m, n, k, 1.f, a + oa * m * k, k, b + ob * k * n, n, 0.f, y + t * m * n, n);
    for (size_t i = idx.size(); i-- > 0;) {
      if (++idx[i] < d.batch[i]) break;
      idx[i] = 0;
    }
  }
  return Status::Ok();
}

// ---- Gemm: Y = alpha * op(A) op(B) + beta * C ----

Status GemmKernel(const KernelContext& ctx) {
  GF_RETURN_IF_ERROR(RequireF32(ctx));
  const Node& node = ctx.node;
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.f), beta = node.GetFloat("beta", 1.f);
  const TensorView& A = ctx.inputs[0];
  const TensorView& B = ctx.inputs[1];
  const bool has_c = HasInput(ctx, 2);
  const TensorView& Y = ctx.outputs[0];
  GF_ASSIGN_OR_RETURN(GemmDims d, GemmShapes(A.shape, B.shape, has_c ? &ctx.inputs[2].shape : nullptr, ta, tb,
                                             KernelWhere(ctx)));
  GF_RETURN_IF_ERROR(CheckBlasDims(ctx, {d.m, d.n, d.k}));
  float* y = Y.as<float>();
  if (d.m * d.n == 0) return Status::Ok();
  // Y starts as beta * C (broadcast), so sgemm adds alpha * op(A) op(B) with beta = 1. Scaling C
  // here, even when beta == 0, keeps ONNX's beta * C semantics (0 * inf = NaN).
  if (has_c) {
    const TensorView& C = ctx.inputs[2];
    const float* c = C.as<const float>();
    const std::vector<int64_t> st = BroadcastStrides(C.shape, Shape{d.m, d.n});
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) y[i * d.n + j] = beta * c[i * st[0] + j * st[1]];
  }
  if (d.k == 0) {
    if (!has_c) std::fill(y, y + d.m * d.n, 0.f);
    return Status::Ok();
  }
  ParallelSgemm(ctx.cpu, ta, tb, d.m, d.n, d.k, alpha, A.as<const float>(), ta ? d.m : d.k, B.as<const float>(),
                tb ? d.k : d.n, has_c ? 1.f : 0.f, y, d.n);
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> GemmKernels() {
  return {
      {"MatMul", MatMulKernel, PrepareMatMul, DescribeMatMul},
      {"Gemm", GemmKernel, nullptr, [](const Node&, const PrepareOptions&) { return std::string(kActivationGemms); }},
  };
}

}  // namespace graphfuse::kernels

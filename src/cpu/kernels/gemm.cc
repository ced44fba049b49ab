// MatMul (numpy matmul semantics: batched broadcasting, 1-D operands) and Gemm (alpha, beta,
// transA, transB, C broadcast) through OpenBLAS's cblas_sgemm. Never a hand-written GEMM.
//
// OpenBLAS threads each sgemm itself (its own pool, sized by OPENBLAS_NUM_THREADS), so the
// batch loop here runs on the calling thread: splitting batches over graphfuse's pool as well
// would oversubscribe the cores.
#include <cblas.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <string>
#include <cstring>
#include <vector>

#include "kernel_util.h"
#include "packed_gemm.h"

namespace graphfuse::kernels {
namespace {

// Operand shapes with 1-D operands promoted as numpy does: A [K] -> [1,K], B [K] -> [K,1].
struct MatMulDims {
  Shape a, b;       // promoted, rank >= 2
  Shape batch;      // broadcast of the batch dims
  int64_t m = 0, k = 0, n = 0;
  Shape out;
};

Result<MatMulDims> MatMulShapes(const Shape& a_in, const Shape& b_in, const std::string& where) {
  if (a_in.empty() || b_in.empty())
    return InvalidArgument(where, ": MatMul operands must have rank >= 1 (numpy matmul), got ",
                           ShapeToString(a_in), " and ", ShapeToString(b_in));
  MatMulDims d;
  d.a = a_in.size() == 1 ? Shape{1, a_in[0]} : a_in;
  d.b = b_in.size() == 1 ? Shape{b_in[0], 1} : b_in;
  d.m = d.a[d.a.size() - 2];
  d.k = d.a.back();
  d.n = d.b.back();
  const int64_t kb = d.b[d.b.size() - 2];
  if (d.k != kb)
    return InvalidArgument(where, ": inner dimensions differ: A ", ShapeToString(a_in), " has K=", d.k, " but B ",
                           ShapeToString(b_in), " has K=", kb);
  const Shape batches[2] = {Shape(d.a.begin(), d.a.end() - 2), Shape(d.b.begin(), d.b.end() - 2)};
  auto batch = BroadcastShapes(batches);
  if (!batch.ok())
    return InvalidArgument(where, ": batch dimensions of A ", ShapeToString(a_in), " and B ", ShapeToString(b_in),
                           " do not broadcast: ", batch.status().message());
  d.batch = *batch;
  d.out = d.batch;
  if (a_in.size() > 1) d.out.push_back(d.m);
  if (b_in.size() > 1) d.out.push_back(d.n);
  return d;
}

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

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS.
//
// The columns of C are split over graphfuse's pool, each task one sgemm. OpenBLAS's own
// threads on top of that compete with the pool for the cores; the program decides whether it
// has them (ProcessSettings::blas_threads, graphfuse/cpu.h: the graphfuse command sets 1).
void Sgemm(const CpuContext& cpu, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  auto run = [&](int64_t j0, int64_t j1) {
    if (j1 <= j0) return;
    const float* bj = b + (tb ? j0 * ldb : j0);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(j1 - j0), static_cast<int>(k), alpha, a, static_cast<int>(std::max<int64_t>(lda, 1)),
                bj, static_cast<int>(std::max<int64_t>(ldb, 1)), beta, c + j0, static_cast<int>(std::max<int64_t>(ldc, 1)));
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

Result<std::vector<ValueType>> InferMatMul(const InferContext& ctx) {
  const Value* a = ctx.input(0);
  const Value* b = ctx.input(1);
  if (a->dtype() != b->dtype() || a->dtype() == DType::kBool)
    return InvalidArgument(ctx.Describe(), ": MatMul needs two inputs of the same numeric dtype");
  GF_ASSIGN_OR_RETURN(MatMulDims d, MatMulShapes(a->shape(), b->shape(), ctx.Describe()));
  return std::vector<ValueType>{{a->dtype(), d.out}};
}

// A MatMul by constant 2-D weights with A's rows flattened: the weights are packed once.
Result<std::shared_ptr<const void>> PrepareMatMul(const Node& node) {
  const Value* a = node.input(0);
  const Value* b = node.input(1);
  if (!b->constant() || b->shape().size() != 2 || a->shape().size() < 2 || a->dtype() != DType::kF32 ||
      b->dtype() != DType::kF32 || a->numel() == 0 || b->numel() == 0)
    return std::shared_ptr<const void>();
  const int64_t k = b->shape()[0], n = b->shape()[1], m = a->numel() / k;
  GF_ASSIGN_OR_RETURN(auto packed, PackedGemm::Create(m, k, n, b->constant()->data_as<float>(), n, n));
  return std::shared_ptr<const void>(packed);
}

// Blocks of a packed GEMM spread over the pool, one claim at a time.
void RunPackedBlocks(const CpuContext& cpu, const PackedGemm& g, int64_t work, const float* a, float* c) {
  const int threads = cpu.pool ? static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(work), g.blocks())) : 1;
  ForEachClaimed(cpu, threads, g.blocks(), [&](int64_t blk, int) { g.RunBlock(blk, a, c); });
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
    Sgemm(ctx.cpu, false, false, nbatch * m, n, k, 1.f, a, k, b, n, 0.f, y, n);
    return Status::Ok();
  }
  // General case: one GEMM per batch, operands located through broadcast strides.
  const std::vector<int64_t> sa = BroadcastStrides(a_batch, d.batch), sb = BroadcastStrides(b_batch, d.batch);
  std::vector<int64_t> idx(d.batch.size(), 0);
  for (int64_t t = 0; t < nbatch; ++t) {
    int64_t oa = 0, ob = 0;
    for (size_t i = 0; i < idx.size(); ++i) oa += idx[i] * sa[i], ob += idx[i] * sb[i];
    Sgemm(ctx.cpu, false, false, m, n, k, 1.f, a + oa * m * k, k, b + ob * k * n, n, 0.f, y + t * m * n, n);
    for (size_t i = idx.size(); i-- > 0;) {
      if (++idx[i] < d.batch[i]) break;
      idx[i] = 0;
    }
  }
  return Status::Ok();
}

// ---- Gemm: Y = alpha * op(A) op(B) + beta * C ----

struct GemmDims {
  int64_t m, k, n;
};

Result<GemmDims> GemmShapes(const Shape& a, const Shape& b, const Shape* c, bool ta, bool tb,
                            const std::string& where) {
  if (a.size() != 2 || b.size() != 2)
    return InvalidArgument(where, ": Gemm needs 2-D A and B, got ", ShapeToString(a), " and ", ShapeToString(b));
  GemmDims d{ta ? a[1] : a[0], ta ? a[0] : a[1], tb ? b[0] : b[1]};
  const int64_t kb = tb ? b[1] : b[0];
  if (d.k != kb)
    return InvalidArgument(where, ": inner dimensions differ: op(A) of A ", ShapeToString(a), " (transA=", ta,
                           ") has K=", d.k, " but op(B) of B ", ShapeToString(b), " (transB=", tb, ") has K=", kb);
  if (c != nullptr) {
    bool ok = c->size() <= 2;
    const Shape mn = {d.m, d.n};
    for (size_t i = 0; ok && i < c->size(); ++i) {
      const int64_t cd = (*c)[c->size() - 1 - i], od = mn[1 - i];
      ok = cd == od || cd == 1;
    }
    if (!ok)
      return InvalidArgument(where, ": C ", ShapeToString(*c), " does not broadcast to the output ",
                             ShapeToString(mn));
  }
  return d;
}

Result<std::vector<ValueType>> InferGemm(const InferContext& ctx) {
  const Value* a = ctx.input(0);
  const Value* b = ctx.input(1);
  const Value* c = ctx.input(2);
  if (a->dtype() != b->dtype() || (c && c->dtype() != a->dtype()) || a->dtype() == DType::kBool)
    return InvalidArgument(ctx.Describe(), ": Gemm needs inputs of one numeric dtype");
  GF_ASSIGN_OR_RETURN(GemmDims d, GemmShapes(a->shape(), b->shape(), c ? &c->shape() : nullptr,
                                             ctx.GetInt("transA", 0) != 0, ctx.GetInt("transB", 0) != 0,
                                             ctx.Describe()));
  return std::vector<ValueType>{{a->dtype(), Shape{d.m, d.n}}};
}

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
  Sgemm(ctx.cpu, ta, tb, d.m, d.n, d.k, alpha, A.as<const float>(), ta ? d.m : d.k, B.as<const float>(), tb ? d.k : d.n,
        has_c ? 1.f : 0.f, y, d.n);
  return Status::Ok();
}

}  // namespace

std::vector<OpSchema> GemmSchemas() {
  return {
      {"MatMul", 2, 2, 1, InferMatMul, MatMulKernel, false, false, PrepareMatMul},
      {"Gemm", 2, 3, 1, InferGemm, GemmKernel},
  };
}

}  // namespace graphfuse::kernels

namespace graphfuse {

Status ApplyProcessSettings(const ProcessSettings& settings) {
  if (settings.blas_threads < 0)
    return InvalidArgument("ProcessSettings: blas_threads must be >= 0 (0: leave as is), got ", settings.blas_threads);
  if (settings.blas_threads > 0) openblas_set_num_threads(settings.blas_threads);
  return Status::Ok();
}

int BlasThreads() { return openblas_get_num_threads(); }

const char* BlasCoreName() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

const char* SuggestedBlasCoreType() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  const char* core = openblas_get_corename();
  std::string name = core ? core : "";
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool generic = name == "prescott" || name == "core2" || name == "nehalem" || name == "unknown";
  if (!generic) return nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace graphfuse

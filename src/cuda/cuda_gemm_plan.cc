#include "cuda/cuda_gemm_plan.h"

#include <algorithm>

#include "ir/schemas/fused_gemm.h"
#include "cuda/cuda_status.h"
#include "cuda/host_fallback.h"

namespace graphfuse::cuda {
namespace {

// Element `i` of a buffer of `t`.
void* At(void* p, int64_t i, DType t) { return static_cast<char*>(p) + i * static_cast<int64_t>(DTypeSize(t)); }

// MatMul: one cuBLAS call, strided-batched over the batch dims A and B share (or broadcast from a
// matrix), in f32, f16 or bf16 (f32 sums); other batch broadcasts and other dtypes run on the host.
Status PlanMatMul(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan) {
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  const Value* y = n.output();
  const Shape &as = a->shape(), &bs = b->shape();
  if (a->dtype() != b->dtype() || !GemmTakes(a->dtype(), y->dtype()) || as.size() < 2 || bs.size() < 2)
    return PlanHostFallback(pb, n,
                            Unimplemented("MatMul of ", a->TypeString(), " and ", b->TypeString(), " on the GPU"));
  const int64_t m = as[as.size() - 2], k = as.back(), nn = bs.back();
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  int64_t batch = 1, stride_a = m * k, stride_b = k * nn, rows = m;
  for (int64_t d : a_batch) batch *= d;
  if (bs.size() == 2) {  // one GEMM over all rows of A
    rows = batch * m;
    batch = 1;
    stride_b = 0;
  } else if (a_batch == b_batch) {
  } else if (as.size() == 2) {
    batch = 1;
    for (int64_t d : b_batch) batch *= d;
    stride_a = 0;
  } else {
    return PlanHostFallback(
        pb, n,
        Unimplemented("MatMul with broadcast batch dims ", a->TypeString(), " x ", b->TypeString(), " on the GPU"));
  }
  GF_ASSIGN_OR_RETURN(void* ap, pb.memory.Buffer(a));
  GF_ASSIGN_OR_RETURN(void* bp, pb.memory.Buffer(b));
  GF_ASSIGN_OR_RETURN(void* yp, pb.memory.Buffer(y));
  if (y->numel() == 0) return Status::Ok();
  const std::string where = StrCat(n.name(), " (", batch, " x ", rows, "x", nn, "x", k, ")");
  const void* A = ap;
  const void* B = bp;
  void* Y = yp;
  const Gemm gemm = pb.gemm(a->dtype(), y->dtype());
  const DeviceMemory* mem = &pb.memory;
  if (k == 0) {
    const size_t bytes = ValueBytes(y);
    pb.steps.push_back({n.name(), [=](cudaStream_t s) { return mem->Zero(Y, bytes, s, where); }});
  } else {
    pb.steps.push_back({n.name(), [=](cudaStream_t) {
                          return gemm(rows, nn, k, A, k, stride_a, B, nn, stride_b, Y, nn, rows * nn, batch, where);
                        }});
  }
  ++pb.stats.launches, ++pb.stats.cublas;
  pb.lines.push_back(StrCat(n.name(), ": ", plan.what, a->dtype() != DType::kF32 ? StrCat(" in ", DTypeName(a->dtype())) : "",
                            batch > 1 ? StrCat(" (", batch, " batched)") : ""));
  return Status::Ok();
}

cudaDataType_t LtType(DType t) {
  return t == DType::kF16 ? CUDA_R_16F : t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// A FusedGemm with one projection that one cuBLASLt call computes (CublasLtEpilogueFor): the
// bias and activation by its epilogue enum, a residual as its C operand with beta = 1 (C and D
// distinct: the residual is read in place and no copy of it is made). Emulated plans run the
// forms without an activation as the same one step on the host (HostGemmAddend). Unimplemented
// when cuBLASLt has no algorithm for it.
Status PlanCublasLt(PlanBuilder& pb, const Node& n, const CublasLtEpilogue& e, int64_t m, int64_t nn, int64_t k,
                    DType dt) {
  GF_ASSIGN_OR_RETURN(void* ap, pb.memory.Buffer(n.input(0)));
  GF_ASSIGN_OR_RETURN(void* wp, pb.memory.Buffer(n.input(1)));
  void* bp = nullptr;
  void* rp = nullptr;
  if (e.bias_input >= 0) {
    GF_ASSIGN_OR_RETURN(bp, pb.memory.Buffer(n.input(static_cast<size_t>(e.bias_input))));
  }
  if (e.residual_input >= 0) {
    GF_ASSIGN_OR_RETURN(rp, pb.memory.Buffer(n.input(static_cast<size_t>(e.residual_input))));
  }
  GF_ASSIGN_OR_RETURN(void* cp, pb.memory.Buffer(n.output(0)));
  const std::string where = StrCat(n.name(), ": cuBLASLt");
  const cublasLtEpilogue_t epi = e.kind == CublasLtEpilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                 : e.kind == CublasLtEpilogue::kReluBias ? CUBLASLT_EPILOGUE_RELU_BIAS
                                 : e.kind == CublasLtEpilogue::kGeluTanhBias ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                             : CUBLASLT_EPILOGUE_DEFAULT;
  const std::string line =
      StrCat(n.name(), ": cuBLASLt GEMM", dt == DType::kF32 ? "" : StrCat(" in ", DTypeName(dt)),
             epi == CUBLASLT_EPILOGUE_BIAS        ? " with its BIAS epilogue"
             : epi == CUBLASLT_EPILOGUE_RELU_BIAS ? " with its RELU_BIAS epilogue"
             : epi == CUBLASLT_EPILOGUE_GELU_BIAS ? " with its GELU_BIAS epilogue"
                                                  : "",
             rp ? ", residual added as C (beta = 1)" : "");
  const void* A = ap;
  const void* W = wp;
  const void* bias = bp;
  const void* R = rp;
  void* D = cp;
  if (pb.emu) {
    if (epi == CUBLASLT_EPILOGUE_RELU_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS)
      return Unimplemented(where, ": an activation epilogue is not emulated");
    const Gemm g = pb.gemm(dt, dt);
    if (m * nn > 0) {
      pb.steps.push_back({n.name(), [=](cudaStream_t) {
                            HostGemmAddend(g, m, nn, k, A, W, bias, R, D);
                            return Status::Ok();
                          }});
      ++pb.stats.launches, ++pb.stats.cublas;
    }
    pb.lines.push_back(line);
    return Status::Ok();
  }
  if (m * nn == 0 || k == 0) return Unimplemented(where, ": an empty GEMM");
  // Column-major D[N,M] = W^T-as-stored [N,K] * A^T-as-stored [K,M]: row-major C[M,N] = A W.
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t wl = nullptr, al = nullptr, cl = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasComputeType_t compute =
      dt == DType::kF32 && pb.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  GF_BLAS(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), where);
  pb.cleanups.push_back([op] { cublasLtMatmulDescDestroy(op); });
  GF_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), where);
  if (bias) {
    GF_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), where);
    // The bias is of D's type (the epilogue's matcher requires it), which is what cuBLASLt
    // takes for f32, f16 and bf16 outputs.
    const int32_t bias_type = LtType(dt);
    GF_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
            where);
  }
  const cudaDataType_t t = LtType(dt);
  GF_BLAS(cublasLtMatrixLayoutCreate(&wl, t, static_cast<uint64_t>(nn), static_cast<uint64_t>(k), nn), where);
  pb.cleanups.push_back([wl] { cublasLtMatrixLayoutDestroy(wl); });
  GF_BLAS(cublasLtMatrixLayoutCreate(&al, t, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k), where);
  pb.cleanups.push_back([al] { cublasLtMatrixLayoutDestroy(al); });
  // C (the residual) and D share one layout: D's.
  GF_BLAS(cublasLtMatrixLayoutCreate(&cl, t, static_cast<uint64_t>(nn), static_cast<uint64_t>(m), nn), where);
  pb.cleanups.push_back([cl] { cublasLtMatrixLayoutDestroy(cl); });
  GF_BLAS(cublasLtMatmulPreferenceCreate(&pref), where);
  pb.cleanups.push_back([pref] { cublasLtMatmulPreferenceDestroy(pref); });
  const uint64_t ws_bytes = pb.blas_workspace_bytes;
  GF_BLAS(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes),
      where);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  GF_BLAS(cublasLtMatmulAlgoGetHeuristic(pb.lt, op, wl, al, cl, cl, pref, 1, &result, &found), where);
  if (found == 0) return Unimplemented(where, ": no algorithm for this epilogue");
  cublasLtHandle_t handle = pb.lt;
  void* ws = pb.blas_workspace;
  const size_t wsb = pb.blas_workspace_bytes;
  // Without a residual C is not read (beta = 0); D is passed for it.
  const float beta = R ? 1.f : 0.f;
  const void* C = R ? R : D;
  pb.steps.push_back(
      {n.name(), [=](cudaStream_t s) {
         const float one = 1.f;
         return BlasStatus(cublasLtMatmul(handle, op, &one, W, wl, A, al, &beta, C, cl, D, cl, &result.algo, ws, wsb, s),
                           where);
       }});
  ++pb.stats.launches, ++pb.stats.cublas;
  pb.lines.push_back(line);
  return Status::Ok();
}

}  // namespace

Status PlanGemm(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan) {
  if (n.is(op::MatMul)) return PlanMatMul(pb, n, plan);
  if (!n.is(op::FusedGemm)) return PlanHostFallback(pb, n, Unimplemented(n.op(), " on the GPU"));
  const Value* a = n.input(0);
  const Value* w = n.input(1);
  // The projections are stored in the operands' dtype: f32, or f16 / bf16 (f32 sums, rounded
  // once), which the epilogue kernel loads like any tensor of that dtype.
  const DType dt = a->dtype();
  if (w->dtype() != dt || !GemmTakes(dt, dt))
    return PlanHostFallback(pb, n, Unimplemented("a GEMM of ", a->TypeString(), " and ", w->TypeString()));
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(n);
  const int64_t splits = attrs.splits, k = a->shape().back(), nn = w->shape()[1] / splits;
  const int64_t m = k == 0 ? 0 : a->numel() / k;
  const std::vector<int64_t>& out_proj = attrs.out_proj;
  GF_ASSIGN_OR_RETURN(void* ap, pb.memory.Buffer(a));
  GF_ASSIGN_OR_RETURN(void* wp, pb.memory.Buffer(w));
  const void* A = ap;
  void* W = wp;
  const size_t esize = DTypeSize(dt);
  const std::string where = StrCat(n.name(), " (", m, "x", nn * splits, "x", k, ")");
  const Gemm gemm = pb.gemm(dt, dt);
  const std::string in_dt = dt == DType::kF32 ? "" : StrCat(" in ", DTypeName(dt));  // for the plan's lines

  const CublasLtEpilogue& lt = plan.cublas_epilogue;
  if (plan.path == CudaPath::kCublas && (lt.kind != CublasLtEpilogue::kNone || lt.residual_input >= 0)) {
    // On a GPU: one cuBLASLt call, in f32, f16 or bf16 (the bias in D's type). Emulated: the
    // residual forms as the same one step on the host; the bias / activation epilogues as the
    // generated epilogue kernel (cuBLASLt's activations are not emulated).
    const bool lt_call = !pb.emu || lt.residual_input >= 0;
    if (lt_call) {
      const Status lt_plan = PlanCublasLt(pb, n, lt, m, nn, k, dt);
      // cuBLASLt found no algorithm for this shape and epilogue: GEMM + generated epilogue.
      if (lt_plan.ok() || lt_plan.code() != StatusCode::kUnimplemented) return lt_plan;
    }
    // Emulated (or no cuBLASLt algorithm): the same epilogue as a generated kernel.
    CudaNodePlan generic = plan;
    generic.path = CudaPath::kCublasThenKernel;
    generic.what = pb.emu && !lt_call ? "GEMM, then the generated epilogue (cuBLASLt's epilogue on a GPU)"
                                      : "cuBLAS GEMM, then the generated epilogue (cuBLASLt had no algorithm)";
    GF_ASSIGN_OR_RETURN(CudaKernelSource ek, GenerateGemmEpilogueKernel(n));
    generic.kernels = {std::move(ek)};
    return PlanGemm(pb, n, generic);
  }

  // Every projection a node output of its own (q/k/v): the outputs get one [S, M, N] block,
  // so that one strided-batched GEMM writes all of them.
  std::vector<void*> dst(static_cast<size_t>(splits), nullptr);
  std::vector<int64_t> ld(static_cast<size_t>(splits), splits * nn);
  // With many rows, one call per projection instead: each call fills the GPU alone, and the
  // batched call is the faster only for few rows (on an H200, 1 row against 512).
  constexpr int64_t kRowsForOneCallPerProjection = 64;
  bool batched = plan.path == CudaPath::kCublas && splits > 1 && static_cast<int64_t>(out_proj.size()) == splits &&
                 m < kRowsForOneCallPerProjection;
  for (size_t o = 0; o < out_proj.size() && batched; ++o)
    batched = out_proj[o] == static_cast<int64_t>(o) && !pb.memory.Has(n.output(o));
  if (batched) {
    GF_ASSIGN_OR_RETURN(void* p, pb.memory.SharedBuffer(n.outputs(), static_cast<size_t>(splits * m * nn) * esize,
                                                        StrCat(n.name(), " outputs")));
    for (int64_t s = 0; s < splits; ++s) pb.memory.Bind(n.output(static_cast<size_t>(s)), At(p, s * m * nn, dt));
    void* c = p;
    if (m * nn > 0) {
      pb.steps.push_back({n.name(), [=](cudaStream_t) {
                            return gemm(m, nn, k, A, k, 0, W, splits * nn, nn, c, nn, m * nn, splits, where);
                          }});
      ++pb.stats.launches, ++pb.stats.cublas;
    }
    pb.lines.push_back(StrCat(n.name(), ": ", plan.what, in_dt, " (strided-batched over the ", splits, " projections)"));
    return Status::Ok();
  }
  // Otherwise: projection s goes to the node output that IS it, else the workspace.
  for (size_t o = 0; o < out_proj.size(); ++o)
    if (out_proj[o] >= 0) {
      GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.output(o)));
      dst[static_cast<size_t>(out_proj[o])] = p;
      ld[static_cast<size_t>(out_proj[o])] = nn;
    }
  void* ws = nullptr;
  const bool all_in_ws = std::all_of(dst.begin(), dst.end(), [](void* p) { return p == nullptr; });
  if (std::any_of(dst.begin(), dst.end(), [](void* p) { return p == nullptr; })) {
    GF_ASSIGN_OR_RETURN(void* p, pb.memory.Scratch(static_cast<size_t>(m * splits * nn) * esize,
                                                   StrCat(n.name(), " workspace")));
    ws = p;
    for (int64_t s = 0; s < splits; ++s)
      if (!dst[static_cast<size_t>(s)]) dst[static_cast<size_t>(s)] = At(ws, s * nn, dt);
  }
  if (m * nn > 0) {
    if (all_in_ws) {  // one GEMM over the concatenated weights
      pb.steps.push_back({n.name(), [=](cudaStream_t) {
                            return gemm(m, splits * nn, k, A, k, 0, W, splits * nn, 0, ws, splits * nn, 0, 1, where);
                          }});
      ++pb.stats.launches, ++pb.stats.cublas;
    } else {
      for (int64_t s = 0; s < splits; ++s) {
        void* c = dst[static_cast<size_t>(s)];
        const int64_t ldc = ld[static_cast<size_t>(s)];
        const void* Ws = At(W, s * nn, dt);
        pb.steps.push_back({n.name(), [=](cudaStream_t) {
                              return gemm(m, nn, k, A, k, 0, Ws, splits * nn, 0, c, ldc, 0, 1, where);
                            }});
        ++pb.stats.launches, ++pb.stats.cublas;
      }
    }
  }
  if (plan.path == CudaPath::kCublas) {
    const bool per_projection = splits > 1 && !all_in_ws;
    pb.lines.push_back(per_projection ? StrCat(n.name(), ": cuBLAS GEMM", in_dt, ", one call per projection (", splits,
                                               " of ", m, " rows)")
                                      : StrCat(n.name(), ": ", plan.what, in_dt));
    return Status::Ok();
  }
  // The epilogue kernel: projections, extra inputs, then the epilogue's outputs.
  std::vector<void*> args(dst.begin(), dst.end());
  for (size_t i = 2; i < n.inputs().size(); ++i) {
    GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.input(i)));
    args.push_back(p);
  }
  for (size_t o = 0; o < out_proj.size(); ++o)
    if (out_proj[o] < 0) {
      GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.output(o)));
      args.push_back(p);
    }
  pb.lines.push_back(StrCat(n.name(), ": ", plan.what, in_dt, " ", plan.kernels[0].name));
  return pb.AddKernelStep(n.name(), plan.kernels[0], std::move(args));
}

}  // namespace graphfuse::cuda

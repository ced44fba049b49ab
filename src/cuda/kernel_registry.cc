// The CUDA backend's kernel registry: how each op runs on the GPU (PlanNodeForCuda). One row per
// op: its name and the function that plans it (the path, and the kernels to compile for it).
// An op without a row that the op table knows (include/graphfuse/ops.def) gets one generated
// elementwise kernel; any other op has no CUDA path, which the executor reports and runs on the
// host.
#include <string_view>

#include "ir/schemas/attention_layout.h"
#include "ir/schemas/fused_gemm.h"
#include "cuda/codegen.h"
#include "graphfuse/ops.h"

namespace graphfuse::cuda {
namespace {

using PlanFn = Result<CudaNodePlan> (*)(const Node& node, const CudaPlanOptions& options);

Result<CudaNodePlan> PlanView(const Node&, const CudaPlanOptions&) {
  CudaNodePlan p;
  p.path = CudaPath::kView;
  p.what = "a view of its input (no kernel)";
  return p;
}

Result<CudaNodePlan> PlanCublasGemm(const Node&, const CudaPlanOptions&) {
  CudaNodePlan p;
  p.path = CudaPath::kCublas;
  p.what = "cuBLAS GEMM";
  return p;
}

// One kernel from `Generate`; `What` says what the plan calls it.
template <Result<CudaKernelSource> (*Generate)(const Node&), const char* What>
Result<CudaNodePlan> PlanOneKernel(const Node& node, const CudaPlanOptions&) {
  GF_ASSIGN_OR_RETURN(CudaKernelSource k, Generate(node));
  CudaNodePlan p;
  p.path = CudaPath::kKernel;
  p.what = What;
  p.kernels.push_back(std::move(k));
  return p;
}

constexpr char kRowKernel[] = "generated row kernel";
constexpr char kTransposeKernel[] = "generated transpose kernel";
constexpr char kRopeKernel[] = "generated RoPE kernel";
constexpr char kElementwiseKernel[] = "generated elementwise kernel";
constexpr char kAttentionKernel[] = "generated attention kernel";

Result<CudaNodePlan> PlanAttention(const Node& node, const CudaPlanOptions& options) {
  // Many query rows per head: the one-kernel form would read each head's K and V once per
  // row; the flash kernel reads them once per tile of rows, and the GEMM form through cuBLAS.
  auto dims = schemas::ReadDims(node.attrs(), StrCat("CUDA codegen: ", node.Describe()));
  if (dims.ok() && dims->softcap != 0.f)
    return Unimplemented("CUDA codegen: ", node.Describe(), ": no generated kernel soft-caps the scores");
  if (dims.ok() && (dims->rope_q || dims->rope_k) &&
      (dims->rope_dim != dims->d || dims->rope_interleaved || dims->rope_tables_bshd))
    return Unimplemented("CUDA codegen: ", node.Describe(),
                         ": no generated kernel rotates part of a head, interleaved pairs, or with [B,S,H,r] tables");
  if (dims.ok() && !dims->proj && dims->s > options.attention_rows_one_kernel) {
    if (options.prefill_attention == PrefillAttention::kFlash) {
      auto flash = GenerateFlashAttentionKernel(node);
      if (flash.ok()) {
        CudaNodePlan p;
        p.path = CudaPath::kKernel;
        p.what = StrCat("flash attention (", dims->s, " query rows per head > ", options.attention_rows_one_kernel,
                        "): one generated kernel");
        p.kernels.push_back(std::move(*flash));
        return p;
      }
      if (flash.status().code() != StatusCode::kUnimplemented) return flash.status();
    }
    auto gemm_form = GenerateAttentionGemmKernels(node);
    if (gemm_form.ok()) {
      CudaNodePlan p;
      p.path = CudaPath::kAttentionGemms;
      p.what = StrCat("attention as GEMMs (", dims->s, " query rows per head > ", options.attention_rows_one_kernel,
                      "): the generated prep kernel, cuBLAS q k^T, the generated softmax, cuBLAS p v;");
      p.kernels = {gemm_form->prep, gemm_form->softmax};
      p.attention = std::move(*gemm_form);
      return p;
    }
    if (gemm_form.status().code() != StatusCode::kUnimplemented) return gemm_form.status();
  }
  return PlanOneKernel<GenerateAttentionKernel, kAttentionKernel>(node, options);
}

// FusedCachedAttention with few query rows (decode): the flash-decoding kernels. With many
// (a prefill over a cache) there is no path of its own: the executor runs its reference graph,
// whose attention takes its GEMM form.
Result<CudaNodePlan> PlanCachedAttention(const Node& node, const CudaPlanOptions& options) {
  GF_ASSIGN_OR_RETURN(schemas::Dims dims, schemas::ReadDims(node.attrs(), StrCat("CUDA codegen: ", node.Describe())));
  if (dims.softcap != 0.f || ((dims.rope_q || dims.rope_k) &&
                             (dims.rope_dim != dims.d || dims.rope_interleaved || dims.rope_tables_bshd)))
    return Unimplemented("CUDA codegen: ", node.Describe(),
                         ": no generated kernel soft-caps the scores or rotates part of a head");
  if (dims.s > options.attention_rows_one_kernel)
    return Unimplemented("CUDA codegen: ", node.Describe(), ": ", dims.s, " query rows per head > ",
                         options.attention_rows_one_kernel, ": not a decode step");
  GF_ASSIGN_OR_RETURN(DecodeAttentionKernels k, GenerateDecodeAttentionKernels(node, options.decode));
  CudaNodePlan p;
  p.path = CudaPath::kDecodeAttention;
  if (options.decode.one_launch) {
    p.what = StrCat("decode attention (", k.splits, " splits of ", k.chunk,
                    " keys, the last split of each head combining): the generated kernel");
    p.kernels = {k.split};
  } else {
    p.what = StrCat("decode attention (", k.splits, " splits of ", k.chunk, " keys): the generated split and combine kernels");
    p.kernels = {k.split, k.combine};
  }
  p.decode = std::move(k);
  return p;
}

Result<CudaNodePlan> PlanFusedGemm(const Node& node, const CudaPlanOptions&) {
  const CublasLtEpilogue e = CublasLtEpilogueFor(node);
  if (e.kind != CublasLtEpilogue::kNotCovered) {
    CudaNodePlan p;
    p.path = CudaPath::kCublas;
    p.cublas_epilogue = e;
    p.what = e.residual_input >= 0 ? "cuBLASLt GEMM, residual added as C (beta = 1)"
             : e.kind == CublasLtEpilogue::kNone
                 ? StrCat("cuBLAS GEMM (", schemas::FusedGemmAttrs::Read(node).splits, " projections in one call)")
                 : "cuBLASLt GEMM with its epilogue";
    return p;
  }
  GF_ASSIGN_OR_RETURN(CudaKernelSource k, GenerateGemmEpilogueKernel(node));
  CudaNodePlan p;
  p.path = CudaPath::kCublasThenKernel;
  p.what = "cuBLAS GEMM, then the generated epilogue";
  p.kernels.push_back(std::move(k));
  return p;
}

struct CudaOpRow {
  std::string_view op;
  PlanFn plan;
};

constexpr CudaOpRow kCudaOps[] = {
    {"Reshape", PlanView},
    {"Flatten", PlanView},
    {"Squeeze", PlanView},
    {"Unsqueeze", PlanView},
    {"Identity", PlanView},
    {"MatMul", PlanCublasGemm},
    {"Gemm", PlanCublasGemm},
    {"FusedGemm", PlanFusedGemm},
    {"FusedAttention", PlanAttention},
    {"FusedCachedAttention", PlanCachedAttention},
    {"RMSNorm", PlanOneKernel<GenerateRowKernel, kRowKernel>},
    {"LayerNormalization", PlanOneKernel<GenerateRowKernel, kRowKernel>},
    {"Softmax", PlanOneKernel<GenerateRowKernel, kRowKernel>},
    {"FusedNorm", PlanOneKernel<GenerateRowKernel, kRowKernel>},
    {"FusedSoftmax", PlanOneKernel<GenerateRowKernel, kRowKernel>},
    {"Transpose", PlanOneKernel<GenerateTransposeKernel, kTransposeKernel>},
    {"Rope", PlanOneKernel<GenerateRopeKernel, kRopeKernel>},
    {"FusedElementwise", PlanOneKernel<GenerateKernelForNode, kElementwiseKernel>},
};

}  // namespace

CublasLtEpilogue CublasLtEpilogueFor(const Node& node) {
  CublasLtEpilogue none;
  if (!node.is(op::FusedGemm)) return none;
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  const Graph* epi = attrs.epilogue.get();
  if (!epi) return {CublasLtEpilogue::kNone, -1};
  if (attrs.splits != 1) return none;
  if (attrs.out_proj != std::vector<int64_t>{-1} || epi->outputs().size() != 1 || epi->inputs().size() < 2 ||
      epi->inputs().size() > 3)
    return none;
  const Value* proj = epi->inputs()[0];
  const Value* out = epi->outputs()[0];
  if (proj->shape().empty() || proj->dtype() != out->dtype() || proj->shape() != out->shape()) return none;
  std::vector<const Node*> nodes;
  for (const auto& n : epi->nodes()) nodes.push_back(n.get());
  if (nodes.empty() || nodes.size() > 2) return none;
  // The other operand of an Add of x, or null.
  auto added_to = [](const Node& add, const Value* x) -> const Value* {
    if (!add.is(op::Add) || add.inputs().size() != 2) return nullptr;
    if (add.input(0) == x) return add.input(1);
    if (add.input(1) == x) return add.input(0);
    return nullptr;
  };
  auto is_bias = [&](const Value* v) {
    return v && v->shape().size() == 1 && v->shape()[0] == proj->shape().back() && v->dtype() == out->dtype();
  };
  auto is_residual = [&](const Value* v) { return v && v->shape() == out->shape() && v->dtype() == out->dtype(); };
  // Epilogue input j is node input j + 1 (the projection is input 0, A and W are the node's 0, 1).
  auto node_input = [&](const Value* v) -> int64_t {
    for (size_t j = 1; j < epi->inputs().size(); ++j)
      if (epi->inputs()[j] == v) return static_cast<int64_t>(j) + 1;
    return -1;
  };
  const Value* first = added_to(*nodes[0], proj);
  if (!first || node_input(first) < 0) return none;
  // p + r, and (p + bias) + r.
  if (epi->inputs().size() == 2 && nodes.size() == 1 && nodes[0]->output() == out && first->shape() == out->shape()) {
    if (!is_residual(first)) return none;
    CublasLtEpilogue e{CublasLtEpilogue::kNone, -1};
    e.residual_input = node_input(first);
    return e;
  }
  if (!is_bias(first)) return none;
  const int64_t bias_input = node_input(first);
  if (nodes.size() == 1) {
    if (epi->inputs().size() != 2 || nodes[0]->output() != out) return none;
    return {CublasLtEpilogue::kBias, bias_input};
  }
  const Node& second = *nodes[1];
  if (second.output() != out) return none;
  if (epi->inputs().size() == 3) {
    const Value* r = added_to(second, nodes[0]->output());
    if (!is_residual(r) || node_input(r) < 0 || r == first) return none;
    CublasLtEpilogue e{CublasLtEpilogue::kBias, bias_input};
    e.residual_input = node_input(r);
    return e;
  }
  if (second.inputs().size() != 1 || second.input(0) != nodes[0]->output()) return none;
  // cuBLASLt's GELU epilogue is the tanh form: an erf Gelu is never mapped onto it.
  if (second.is(op::Relu)) return {CublasLtEpilogue::kReluBias, bias_input};
  if (second.is(op::GeluTanh)) return {CublasLtEpilogue::kGeluTanhBias, bias_input};
  return none;
}

Result<PrefillAttention> ParsePrefillAttention(const std::string& name) {
  if (name == "flash") return PrefillAttention::kFlash;
  if (name == "gemms") return PrefillAttention::kGemms;
  return InvalidArgument("prefill attention '", name, "': expected flash or gemms");
}

Result<CudaNodePlan> PlanNodeForCuda(const Node& node, const CudaPlanOptions& options) {
  for (const CudaOpRow& row : kCudaOps)
    if (row.op == node.op()) return row.plan(node, options);
  if (OpFromName(node.op()).ok()) return PlanOneKernel<GenerateKernelForNode, kElementwiseKernel>(node, options);
  return Unimplemented("CUDA codegen: ", node.Describe(), ": no CUDA kernel for ", node.op(), " yet");
}

Status ForEachCudaPlan(const Graph& g,
                       const std::function<Status(const Node&, Result<CudaNodePlan>& plan, int depth)>& visit,
                       const CudaPlanOptions& options, int depth) {
  for (const auto& n : g.nodes()) {
    Result<CudaNodePlan> plan = PlanNodeForCuda(*n, options);
    GF_RETURN_IF_ERROR(visit(*n, plan, depth));
    if (const Graph* ref = plan.ok() ? nullptr : n->GetGraph("reference"))
      GF_RETURN_IF_ERROR(ForEachCudaPlan(*ref, visit, options, depth + 1));
  }
  return Status::Ok();
}

}  // namespace graphfuse::cuda

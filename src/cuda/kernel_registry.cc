// The CUDA backend's kernel registry: how each op runs on the GPU (PlanNodeForCuda). One row per
// op: its name and the function that plans it (the path, and the kernels to compile for it).
// An op without a row that the op table knows (include/graphfuse/ops.def) gets one generated
// elementwise kernel; any other op has no CUDA path, which the executor reports and runs on the
// host.
#include <string_view>

#include "../ir/schemas/attention_layout.h"
#include "codegen.h"
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
    p.what = e.kind == CublasLtEpilogue::kNone
                 ? StrCat("cuBLAS GEMM (", node.GetInt("splits", 1), " projections in one call)")
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
  if (node.op() != "FusedGemm") return none;
  const Graph* epi = node.GetGraph("epilogue");
  if (!epi) return {CublasLtEpilogue::kNone, -1};
  if (node.GetInt("splits", 1) != 1) return none;
  const std::vector<int64_t> out_proj = node.GetInts("out_proj");
  if (out_proj != std::vector<int64_t>{-1} || epi->inputs().size() != 2 || epi->outputs().size() != 1) return none;
  const Value* proj = epi->inputs()[0];
  const Value* bias = epi->inputs()[1];
  if (bias->shape().size() != 1 || proj->shape().empty() || bias->shape()[0] != proj->shape().back() ||
      bias->dtype() != DType::kF32)
    return none;
  std::vector<const Node*> nodes;
  for (const auto& n : epi->nodes()) nodes.push_back(n.get());
  if (nodes.empty() || nodes.size() > 2 || nodes[0]->op() != "Add") return none;
  const Node& add = *nodes[0];
  const bool reads = (add.input(0) == proj && add.input(1) == bias) || (add.input(0) == bias && add.input(1) == proj);
  if (!reads) return none;
  if (nodes.size() == 1) return {CublasLtEpilogue::kBias, 2};
  const Node& act = *nodes[1];
  if (act.input(0) != add.output() || epi->outputs()[0] != act.output()) return none;
  // cuBLASLt's GELU epilogue is the tanh form: an erf Gelu is never mapped onto it.
  if (act.op() == "Relu") return {CublasLtEpilogue::kReluBias, 2};
  if (act.op() == "GeluTanh") return {CublasLtEpilogue::kGeluTanhBias, 2};
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

#include "cuda/cuda_attention_plan.h"

namespace graphfuse::cuda {

Status PlanAttentionGemms(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan) {
  const AttentionGemmKernels& a = plan.attention;
  GF_ASSIGN_OR_RETURN(std::vector<void*> bufs, pb.NodeBuffers(n));  // the node's inputs, then its output
  void* out = bufs.back();
  auto scratch = [&](int64_t elements, const char* what) -> Result<float*> {
    GF_ASSIGN_OR_RETURN(void* p, pb.memory.Scratch(static_cast<size_t>(elements) * 4, StrCat(n.name(), " ", what)));
    return static_cast<float*>(p);
  };
  GF_ASSIGN_OR_RETURN(float* qd, scratch(a.qd_elements, "attention q scratch"));
  GF_ASSIGN_OR_RETURN(float* kd, scratch(a.kd_elements, "attention k scratch"));
  GF_ASSIGN_OR_RETURN(float* vd, scratch(a.vd_elements, "attention v scratch"));
  GF_ASSIGN_OR_RETURN(float* sc, scratch(a.scores_elements, "attention scores"));
  std::vector<void*> prep_args = {bufs[0], bufs[1], bufs[2]};
  for (int i : a.rope_inputs) prep_args.push_back(bufs[static_cast<size_t>(i)]);
  prep_args.insert(prep_args.end(), {qd, kd, vd});
  GF_RETURN_IF_ERROR(pb.AddKernelStep(n.name(), a.prep, std::move(prep_args)));
  const std::string where = StrCat(n.name(), " (attention, ", a.heads, " heads of ", a.s, "x", a.sk, ")");
  const Gemm gemm = pb.gemm();
  const DeviceMemory* mem = &pb.memory;
  if (a.scores_elements > 0 && a.d > 0) {
    pb.steps.push_back({n.name(), [=](cudaStream_t) {
                          return gemm(a.s, a.sk, a.d, qd, a.d, a.s * a.d, kd, a.d, a.sk * a.d, sc, a.sk, a.s * a.sk,
                                      a.heads, where + ": q k^T", /*trans_b=*/true);
                        }});
    ++pb.stats.launches, ++pb.stats.cublas;
  } else if (a.scores_elements > 0) {  // d = 0: every score is 0
    pb.steps.push_back({n.name(), [=](cudaStream_t s) {
                          return mem->Zero(sc, static_cast<size_t>(a.scores_elements) * 4, s, where);
                        }});
  }
  std::vector<void*> soft_args;
  for (int i : a.mask_inputs) soft_args.push_back(bufs[static_cast<size_t>(i)]);
  soft_args.push_back(sc);
  GF_RETURN_IF_ERROR(pb.AddKernelStep(n.name(), a.softmax, std::move(soft_args)));
  if (a.s * a.dv > 0) {
    float* o = static_cast<float*>(out);
    if (a.sk == 0) {
      const size_t bytes = ValueBytes(n.output());
      pb.steps.push_back({n.name(), [=](cudaStream_t s) { return mem->Zero(o, bytes, s, where); }});
    } else {
      // One call over every head where the output's heads are evenly spaced across batch
      // entries too; else one call per batch entry (its heads are).
      const bool even = a.b == 1 || a.out_head_stride_b == a.h * a.out_head_stride_h;
      const int64_t calls = even ? 1 : a.b, heads_per_call = even ? a.heads : a.h;
      for (int64_t b = 0; b < calls; ++b) {
        pb.steps.push_back({n.name(), [=](cudaStream_t) {
                              return gemm(a.s, a.dv, a.sk, sc + b * a.h * a.s * a.sk, a.sk, a.s * a.sk,
                                          vd + b * a.h * a.sk * a.dv, a.dv, a.sk * a.dv, o + b * a.out_head_stride_b,
                                          a.out_row_stride, a.out_head_stride_h, heads_per_call, where + ": p v");
                            }});
        ++pb.stats.launches, ++pb.stats.cublas;
      }
    }
  }
  pb.lines.push_back(StrCat(n.name(), ": ", plan.what, " ", a.prep.name, ", ", a.softmax.name));
  return Status::Ok();
}

Status PlanDecodeAttention(PlanBuilder& pb, const Node& n, const CudaNodePlan& plan) {
  const DecodeAttentionKernels& k = plan.decode;
  GF_ASSIGN_OR_RETURN(std::vector<void*> bufs, pb.NodeBuffers(n));  // inputs, then out, present_k, present_v
  const size_t ins = n.inputs().size();
  GF_ASSIGN_OR_RETURN(void* part, pb.memory.Scratch(static_cast<size_t>(k.partial_elements) * 4,
                                                   StrCat(n.name(), " decode attention partials")));
  std::vector<void*> split_args(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(ins));
  split_args.insert(split_args.end(), {bufs[ins + 1], bufs[ins + 2], part});
  if (k.tickets > 0) {
    // The counters are the node's own for the plan's life: zeroed once, left zeroed by every run.
    const size_t bytes = static_cast<size_t>(k.tickets) * sizeof(int32_t);
    const std::string what = StrCat(n.name(), " decode attention tickets");
    GF_ASSIGN_OR_RETURN(void* tickets, pb.memory.Alloc(bytes, what));
    GF_RETURN_IF_ERROR(pb.memory.Zero(tickets, bytes, nullptr, what));
    GF_RETURN_IF_ERROR(pb.memory.Sync(nullptr));
    split_args.insert(split_args.end(), {tickets, bufs[ins]});
    GF_RETURN_IF_ERROR(pb.AddKernelStep(n.name(), k.split, std::move(split_args)));
    pb.lines.push_back(StrCat(n.name(), ": ", plan.what, " ", k.split.name));
    return Status::Ok();
  }
  GF_RETURN_IF_ERROR(pb.AddKernelStep(n.name(), k.split, std::move(split_args)));
  GF_RETURN_IF_ERROR(pb.AddKernelStep(n.name(), k.combine, {part, bufs[ins]}));
  pb.lines.push_back(StrCat(n.name(), ": ", plan.what, " ", k.split.name, ", ", k.combine.name));
  return Status::Ok();
}

}  // namespace graphfuse::cuda

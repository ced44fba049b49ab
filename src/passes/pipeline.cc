#include "passes/pipeline.h"

#include <algorithm>
#include <iterator>

#include "ir/text.h"
#include "passes/fuse_elementwise.h"

namespace graphfuse {

FusionOptions FusionOptionsFor(const Target& target, const FusionOptions& options) {
  FusionOptions o = options;
  o.costs = target.costs();
  const TargetForms forms = target.forms();
  o.attention_projection = options.attention_projection && forms.attention_projection;
  o.norm_into_gemm = options.norm_into_gemm && forms.norm_into_gemm;
  o.narrow_row_kernels = options.narrow_row_kernels && forms.narrow_row_kernels;
  return o;
}

Result<std::vector<PassRecord>> RunPipeline(Graph& g, const Target& target, const PipelineOptions& options) {
  GF_RETURN_IF_ERROR(g.Verify().WithContext("verifier, before any pass"));
  FusionReport report;
  PassContext ctx{target, FusionOptionsFor(target, options.fusion), report};
  PassHooks hooks = options.hooks;
  if (options.print_after_each) {
    hooks.print_to = options.print_after_each;
    hooks.print_ir_after.insert("all");
  }
  const std::vector<const Pass*> passes = PipelineFor(ctx);
  // The kernels before fusion are counted once constants are folded (the first pass).
  const size_t first = !passes.empty() && passes.front() == FindPass("FoldConstants") ? 1 : 0;
  GF_ASSIGN_OR_RETURN(std::vector<PassRecord> records,
                      RunPasses(g, std::span(passes).first(first), ctx, hooks));
  const int64_t kernels_before = CountKernels(g);
  GF_ASSIGN_OR_RETURN(std::vector<PassRecord> rest, RunPasses(g, std::span(passes).subspan(first), ctx, hooks));
  records.insert(records.end(), rest.begin(), rest.end());
  // A refusal that a later pass overcame (a GEMM and the add it now runs as its epilogue)
  // no longer describes the plan: drop those whose two nodes ended up in one group.
  std::erase_if(report.refusals, [&](const FusionRefusal& r) {
    for (const FusedGroupInfo& grp : report.groups)
      if (std::find(grp.nodes.begin(), grp.nodes.end(), r.producer) != grp.nodes.end() &&
          std::find(grp.nodes.begin(), grp.nodes.end(), r.consumer) != grp.nodes.end())
        return true;
    return false;
  });
  report.kernels_before = kernels_before;
  report.kernels_after = CountKernels(g);
  if (options.fusion_report) *options.fusion_report = std::move(report);
  return records;
}

}  // namespace graphfuse

#include "pipeline.h"

#include <algorithm>
#include <iterator>

#include "../ir/text.h"
#include "fold_constants.h"
#include "fusion_passes.h"

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

Result<std::vector<PassRecord>> RunPipeline(Graph& g, const Target& target, const PipelineOptions& pipeline) {
  PipelineOptions options = pipeline;
  options.fusion = FusionOptionsFor(target, pipeline.fusion);
  std::vector<PassRecord> records;
  GF_RETURN_IF_ERROR(g.Verify().WithContext("verifier, before any pass"));
  auto after = [&](const char* pass, Result<int> changes) -> Status {
    if (!changes.ok()) return changes.status().WithContext(pass);
    GF_RETURN_IF_ERROR(g.Verify().WithContext(StrCat("verifier, after ", pass)));
    records.push_back({pass, *changes});
    if (options.print_after_each)
      std::fprintf(options.print_after_each, "// after %s (%d changes)\n%s\n", pass, *changes, PrintGraph(g).c_str());
    return Status::Ok();
  };
  FoldOptions fold;
  fold.target = &target;
  GF_RETURN_IF_ERROR(after("FoldConstants", FoldConstants(g, fold)));
  const int64_t kernels_before = CountKernels(g);
  FusionReport report;
  if (options.fusion.enabled) {
    // Canonicalization turns decomposed norms / activations back into single kernels: part of
    // the fused flow, so that --no-fuse runs the graph exactly as written.
    GF_RETURN_IF_ERROR(after("Canonicalize", Canonicalize(g)));
    GF_RETURN_IF_ERROR(after("CanonicalizeViews", CanonicalizeViews(g)));
    GF_RETURN_IF_ERROR(after("FuseAttention", FuseAttention(g, options.fusion, &report)));
    GF_RETURN_IF_ERROR(after("FuseAttentionCache", FuseAttentionCache(g, options.fusion, &report)));
  }
  auto fused = FuseElementwise(g, options.fusion);
  if (fused.ok()) {
    // The elementwise planner's refusals first, then whatever the later passes add.
    for (auto& r : report.refusals) fused->refusals.push_back(std::move(r));
    fused->groups.insert(fused->groups.begin(), std::make_move_iterator(report.groups.begin()),
                         std::make_move_iterator(report.groups.end()));
    report = std::move(*fused);
  }
  GF_RETURN_IF_ERROR(after("FuseElementwise", fused.ok() ? Result<int>(static_cast<int>(report.groups.size()))
                                                         : Result<int>(fused.status())));
  if (options.fusion.enabled) {
    GF_RETURN_IF_ERROR(after("FuseGemm", FuseGemm(g, options.fusion, &report)));
    GF_RETURN_IF_ERROR(after("FuseAttentionProjections", FuseAttentionProjections(g, options.fusion, &report)));
    GF_RETURN_IF_ERROR(after("FoldNormIntoGemm", FoldNormIntoGemm(g, options.fusion, &report)));
    GF_RETURN_IF_ERROR(after("FuseRowwise", FuseRowwise(g, options.fusion, &report)));
  }
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

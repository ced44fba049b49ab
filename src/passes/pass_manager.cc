#include "passes/pass_manager.h"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "ir/text.h"
#include "passes/fold_constants.h"
#include "passes/fusion_passes.h"

namespace graphfuse {

namespace {

Result<int> RunFoldConstants(Graph& g, PassContext& ctx) {
  FoldOptions fold;
  fold.target = &ctx.target;
  return FoldConstants(g, fold);
}

Result<int> RunCanonicalize(Graph& g, PassContext&) { return Canonicalize(g); }
Result<int> RunCanonicalizeViews(Graph& g, PassContext&) { return CanonicalizeViews(g); }

Result<int> RunFuseAttention(Graph& g, PassContext& ctx) { return FuseAttention(g, ctx.fusion, &ctx.report); }
Result<int> RunFuseAttentionCache(Graph& g, PassContext& ctx) {
  return FuseAttentionCache(g, ctx.fusion, &ctx.report);
}

// The elementwise planner makes a report of its own: its refusals come first, its groups after
// those the earlier passes formed.
Result<int> RunFuseElementwise(Graph& g, PassContext& ctx) {
  GF_ASSIGN_OR_RETURN(FusionReport fused, FuseElementwise(g, ctx.fusion));
  for (FusionRefusal& r : ctx.report.refusals) fused.refusals.push_back(std::move(r));
  fused.groups.insert(fused.groups.begin(), std::make_move_iterator(ctx.report.groups.begin()),
                      std::make_move_iterator(ctx.report.groups.end()));
  ctx.report = std::move(fused);
  return static_cast<int>(ctx.report.groups.size());
}

Result<int> RunFuseGemm(Graph& g, PassContext& ctx) { return FuseGemm(g, ctx.fusion, &ctx.report); }
Result<int> RunFuseAttentionProjections(Graph& g, PassContext& ctx) {
  return FuseAttentionProjections(g, ctx.fusion, &ctx.report);
}
Result<int> RunFoldNormIntoGemm(Graph& g, PassContext& ctx) { return FoldNormIntoGemm(g, ctx.fusion, &ctx.report); }
Result<int> RunFuseRowwise(Graph& g, PassContext& ctx) { return FuseRowwise(g, ctx.fusion, &ctx.report); }
Result<int> RunFuseSiblingNorms(Graph& g, PassContext& ctx) { return FuseSiblingNorms(g, ctx.fusion, &ctx.report); }

bool WantsAttentionProjection(const PassContext& ctx) { return ctx.fusion.attention_projection; }
bool WantsNormIntoGemm(const PassContext& ctx) { return ctx.fusion.norm_into_gemm; }

// The pipeline, in order. Canonicalization turns decomposed norms / activations back into
// single kernels: part of the fused flow, so that the unfused baseline runs the graph exactly as
// written. FuseElementwise runs in the baseline too, where it records why nothing fused.
constexpr Pass kPasses[] = {
    {"FoldConstants", "constants and shape-only subgraphs become constants", false, nullptr, RunFoldConstants},
    {"Canonicalize",
     "identity Casts / one-input Concats go; decomposed LayerNorm / RMSNorm / GELU / SiLU / Softmax / RoPE -> one op "
     "each; nodes computing the same value merge",
     true, nullptr, RunCanonicalize},
    {"CanonicalizeViews",
     "views between a GEMM and its readers move out of the way; slices of a packed projection become projections of "
     "their own",
     true, nullptr, RunCanonicalizeViews},
    {"FuseAttention", "scores MatMul -> scale / mask -> Softmax -> MatMul -> one FusedAttention", true, nullptr,
     RunFuseAttention},
    {"FuseAttentionCache", "a KV cache's append (Concat of past and new rows) moves into the attention", true, nullptr,
     RunFuseAttentionCache},
    {"FuseElementwise", "groups of op-table nodes become FusedElementwise nodes (one kernel each)", false, nullptr,
     RunFuseElementwise},
    {"FuseGemm", "horizontal GEMMs (shared input) and GEMM epilogues -> FusedGemm", true, nullptr, RunFuseGemm},
    {"FuseAttentionProjections", "the QKV GEMM(s) that only feed a FusedAttention move into it", true,
     WantsAttentionProjection, RunFuseAttentionProjections},
    {"FoldNormIntoGemm", "an RMSNorm between two GEMMs folds into them", true, WantsNormIntoGemm,
     RunFoldNormIntoGemm},
    {"FuseRowwise", "prologues / epilogues of norms and softmax -> FusedNorm / FusedSoftmax", true, nullptr,
     RunFuseRowwise},
    {"FuseSiblingNorms", "LayerNorms of one input (a parallel block's two norms) -> one FusedLayerNorms", true,
     nullptr, RunFuseSiblingNorms},
};

bool Asked(const std::set<std::string>& names, const char* pass) {
  return names.count("all") != 0 || names.count(pass) != 0;
}

}  // namespace

std::span<const Pass> AllPasses() { return kPasses; }

const Pass* FindPass(std::string_view name) {
  for (const Pass& p : kPasses)
    if (name == p.name) return &p;
  return nullptr;
}

Status CheckPassName(std::string_view name) {
  if (name == "all" || FindPass(name)) return Status::Ok();
  std::string known;
  for (const Pass& p : kPasses) known += StrCat(known.empty() ? "" : ", ", p.name);
  return InvalidArgument("no pass named '", std::string(name), "' (the passes: ", known, "; or all)");
}

std::vector<const Pass*> PipelineFor(const PassContext& ctx) {
  std::vector<const Pass*> out;
  for (const Pass& p : kPasses)
    if ((!p.fusion_only || ctx.fusion.enabled) && (!p.wanted || p.wanted(ctx))) out.push_back(&p);
  return out;
}

Result<std::vector<PassRecord>> RunPasses(Graph& g, std::span<const Pass* const> passes, PassContext& ctx,
                                          const PassHooks& hooks) {
  for (const std::set<std::string>* names : {&hooks.print_ir_before, &hooks.print_ir_after})
    for (const std::string& n : *names) GF_RETURN_IF_ERROR(CheckPassName(n));
  FILE* out = hooks.print_to ? hooks.print_to : stdout;
  std::vector<PassRecord> records;
  for (const Pass* pass : passes) {
    if (Asked(hooks.print_ir_before, pass->name))
      std::fprintf(out, "// before %s\n%s\n", pass->name, PrintGraph(g).c_str());
    const auto start = std::chrono::steady_clock::now();
    Result<int> changes = pass->run(g, ctx);
    if (!changes.ok()) return changes.status().WithContext(pass->name);
    g.RemoveDeadNodes();
    GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext(pass->name));
    GF_RETURN_IF_ERROR(g.Verify().WithContext(StrCat("verifier, after ", pass->name)));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    records.push_back({pass->name, *changes, ms});
    if (Asked(hooks.print_ir_after, pass->name))
      std::fprintf(out, "// after %s (%d changes)\n%s\n", pass->name, *changes, PrintGraph(g).c_str());
  }
  return records;
}

void Refuse(FusionReport* report, std::string producer, std::string consumer, const char* code, std::string message) {
  if (report) report->refusals.push_back({std::move(producer), std::move(consumer), code, std::move(message)});
}

}  // namespace graphfuse

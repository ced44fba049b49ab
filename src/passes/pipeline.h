// The pass pipeline: the passes of pass_manager.cc's list (AllPasses, in order; `graphfuse
// explain --passes` prints them) that the Target and the options ask for, run by the pass
// manager (RunPasses: verifier, finishing work, IR printing and timing after every pass).
//
// The Target decides what the passes may assume: its cost parameters price every merge, the
// forms only it runs (FuseAttentionProjections, FoldNormIntoGemm) run only for it, and
// FoldConstants evaluates nodes with it.
//
// With fusion disabled only FoldConstants runs (and FuseElementwise, which then records why
// nothing fused): the unfused baseline is the graph as written.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/target.h"
#include "passes/pass_manager.h"

namespace graphfuse {

struct PipelineOptions {
  FILE* print_after_each = nullptr;  // the IR after every pass, there (nullptr: as `hooks` say)
  PassHooks hooks;                   // the IR before / after the passes named
  // fusion.enabled = false gives the unfused baseline. Its costs are replaced by the Target's,
  // and a target-specific form runs only where the Target asks for it and this leaves it on.
  FusionOptions fusion;
  FusionReport* fusion_report = nullptr;  // filled when not null
};

// Runs the pipeline for `target`; one record per pass run. An error names the pass (a verifier
// failure after a pass is a bug in it).
Result<std::vector<PassRecord>> RunPipeline(Graph& g, const Target& target, const PipelineOptions& options = {});

// The fusion options the passes see for `target`: options' own, with the target's costs and
// forms applied.
FusionOptions FusionOptionsFor(const Target& target, const FusionOptions& options);

}  // namespace graphfuse

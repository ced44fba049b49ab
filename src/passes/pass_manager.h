// The pass manager: every pass registered once (AllPasses, in pipeline order), the pipeline of a
// target derived from that list, and one driver (RunPasses) that owns what every pass needs
// around it: the verifier after it, the finishing work (dead nodes removed, nodes in
// topological order), the IR printed before / after the passes asked for, its time, and the
// fusion report the passes add to.
//
// A pass is a function of the graph and a PassContext. Adding one: write it, add one row to
// kPasses (pass_manager.cc), where its place in the list is its place in the pipeline.
#pragma once

#include <cstdio>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/fusion.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

// What a pass sees beyond the graph.
struct PassContext {
  const Target& target;
  FusionOptions fusion;  // the user's, with the target's costs and forms applied
  FusionReport& report;  // fused groups and refused merges, added to by the fusion passes
};

struct Pass {
  const char* name;  // "FuseGemm": what --print-ir-after names, and the error context
  const char* what;  // one line: what it rewrites
  // Runs only when fusion is on (the others: also in the unfused baseline).
  bool fusion_only;
  // Whether the target's forms and the user's options ask for it (nullptr: always).
  bool (*wanted)(const PassContext& ctx);
  // Rewrites the graph; the changes it made (nodes folded, groups formed, ...).
  Result<int> (*run)(Graph& g, PassContext& ctx);
};

// Every pass, once, in pipeline order.
std::span<const Pass> AllPasses();
// The pass named `name`, or nullptr.
const Pass* FindPass(std::string_view name);
// Ok when `name` is a pass or "all" (what PassHooks and --print-ir-* take); else
// InvalidArgument naming it and listing the passes.
Status CheckPassName(std::string_view name);
// The passes that run for `ctx` (its target's forms, fusion on or off), in order.
std::vector<const Pass*> PipelineFor(const PassContext& ctx);

// What the manager does around the passes, besides running them.
struct PassHooks {
  FILE* print_to = nullptr;               // where the IR is printed (nullptr: stdout)
  std::set<std::string> print_ir_before;  // pass names, or "all"
  std::set<std::string> print_ir_after;   // pass names, or "all"
};

struct PassRecord {
  std::string pass;
  int changes = 0;  // what the pass reports it did (nodes folded, groups formed, ...)
  double ms = 0;    // its time, with the verifier and the finishing work after it
};

// Runs `passes` in order on `g`. After each: dead nodes go and the nodes are sorted
// topologically (the finishing work no pass repeats), then the verifier runs; an error names the
// pass (a verifier failure after a pass is a bug in it). A name in `hooks` that is no pass is
// refused before anything runs, naming the passes there are.
Result<std::vector<PassRecord>> RunPasses(Graph& g, std::span<const Pass* const> passes, PassContext& ctx,
                                          const PassHooks& hooks = {});

// The one way every pass records a merge it did not make: appends {producer, consumer, code,
// message} to the report (codes: fusion_legality.h); nothing when `report` is null (a pass run
// on its own, without a report).
void Refuse(FusionReport* report, std::string producer, std::string consumer, const char* code, std::string message);
inline void Refuse(FusionReport* report, const Node* producer, const Node* consumer, const char* code,
                   std::string message) {
  Refuse(report, producer->name(), consumer->name(), code, std::move(message));
}
inline void Refuse(FusionReport* report, const Node& producer, const Node& consumer, const char* code,
                   std::string message) {
  Refuse(report, producer.name(), consumer.name(), code, std::move(message));
}
inline void Refuse(FusionReport* report, const Node* producer, std::string consumer, const char* code,
                   std::string message) {
  Refuse(report, producer->name(), std::move(consumer), code, std::move(message));
}

}  // namespace graphfuse

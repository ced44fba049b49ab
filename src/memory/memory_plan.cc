#include "memory/memory_plan.h"

#include <algorithm>

#include "ir/op_registry.h"

namespace graphfuse {

namespace {

int64_t ValueBytes(const Value* v) { return v->numel() * static_cast<int64_t>(DTypeSize(v->dtype())); }

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

}  // namespace

MemoryPlacement MemoryPlan::Find(const Value* v) const {
  auto it = values.find(v);
  return it == values.end() ? MemoryPlacement{} : it->second;
}

MemoryPlanner::MemoryPlanner(const Graph& g, int64_t alignment) {
  plan_.alignment = std::max<int64_t>(alignment, 1);
  int i = 0;
  for (const auto& n : g.nodes()) {
    for (const Value* in : n->inputs())
      if (in) last_use_[in] = i;
    ++i;
  }
  for (const Value* o : g.outputs()) last_use_[o] = kForever;
}

int MemoryPlanner::LastUse(const Value* v) const {
  auto it = last_use_.find(v);
  return it == last_use_.end() ? node_ : std::max(node_, it->second);
}

void MemoryPlanner::NextNode() {
  for (BlockState& b : state_)
    if (!b.free && b.end <= node_) b.free = true;
  ++node_;
}

MemoryPlacement MemoryPlanner::Take(int64_t bytes, int end) {
  int best = -1;
  for (size_t b = 0; b < state_.size(); ++b)
    if (state_[b].free && plan_.blocks[b].bytes >= bytes &&
        (best < 0 || plan_.blocks[b].bytes < plan_.blocks[static_cast<size_t>(best)].bytes))
      best = static_cast<int>(b);
  const bool fresh = best < 0;
  if (fresh) {
    // Every block gets at least one byte of its own: no two blocks share an address.
    const int64_t offset = AlignUp(plan_.arena_bytes, plan_.alignment);
    plan_.blocks.push_back({offset, bytes});
    plan_.arena_bytes = offset + std::max<int64_t>(bytes, 1);
    plan_.peak_bytes += bytes;
    state_.push_back({});
    best = static_cast<int>(state_.size() - 1);
  }
  BlockState& s = state_[static_cast<size_t>(best)];
  s.free = false;
  s.end = end;
  plan_.no_reuse_bytes += bytes;
  return {best, plan_.blocks[static_cast<size_t>(best)].offset, bytes, fresh};
}

MemoryPlacement MemoryPlanner::Place(const Value* v) {
  if (auto it = plan_.values.find(v); it != plan_.values.end()) return it->second;
  return PlaceTogether({&v, 1}, ValueBytes(v));
}

MemoryPlacement MemoryPlanner::PlaceTogether(std::span<const Value* const> values, int64_t bytes) {
  int end = node_;
  for (const Value* v : values) end = std::max(end, LastUse(v));
  const MemoryPlacement p = Take(bytes, end);
  for (const Value* v : values) plan_.values[v] = p;
  return p;
}

MemoryPlacement MemoryPlanner::Scratch(int64_t bytes) {
  const MemoryPlacement p = Take(bytes, node_);
  plan_.scratch.push_back({node_, p});
  return p;
}

bool MemoryPlanner::Alias(const Value* view, const Value* of) {
  auto it = plan_.values.find(of);
  if (it == plan_.values.end()) return false;
  MemoryPlacement p = it->second;
  p.new_block = false;
  plan_.values[view] = p;
  BlockState& s = state_[static_cast<size_t>(p.block)];
  s.end = std::max(s.end, LastUse(view));
  return true;
}

Result<MemoryPlan> PlanMemory(const Graph& g, const MemoryPlanOptions& options) {
  MemoryPlanner planner(g, options.alignment);
  int64_t external = 0;
  for (const auto& n : g.nodes()) {
    const OpSchema* s = FindSchema(n->op());
    for (size_t k = 0; k < n->outputs().size(); ++k) {
      const Value* o = n->output(k);
      if (s && s->view && k == 0) {
        if (!n->input(0)) return InvalidArgument(n->Describe(), ": missing input");
        planner.Alias(o, n->input(0));
      } else if (options.in_arena && !options.in_arena(*o)) {
        external += ValueBytes(o);
      } else {
        planner.Place(o);
      }
    }
    if (options.scratch)
      for (int64_t bytes : options.scratch(*n)) planner.Scratch(bytes);
    planner.NextNode();
  }
  MemoryPlan plan = planner.Finish();
  plan.external_bytes = external;
  return plan;
}

}  // namespace graphfuse

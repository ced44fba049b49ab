// The liveness memory planner (src/memory/memory_plan.h): reuse after the last reader, views
// sharing their input's block, values kept out of the arena, scratch, the online planner, and
// random graphs whose simultaneously live buffers must never overlap.
#include "memory/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace graphfuse {
namespace {

// A node typed by hand (the planner reads types only): `op` over `inputs`, one output of f32[n].
Value* Op(Graph& g, const std::string& op, const std::vector<Value*>& inputs, int64_t n) {
  return g.AddNodeTyped(op, inputs, {}, {{DType::kF32, {n}}})->output();
}

constexpr int64_t kN = 1000;  // elements: 4000 bytes

TEST(MemoryPlan, ReusesABlockAfterItsLastReader) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Value* a = Op(g, "Relu", {x}, kN);
  Value* b = Op(g, "Relu", {a}, kN);
  Value* c = Op(g, "Relu", {b}, kN);  // a's last reader was b's node: c takes a's block
  Value* d = Op(g, "Relu", {c}, kN);  // b's: d takes b's
  ASSERT_TRUE(g.MarkOutput(d).ok());
  auto plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->blocks.size(), 2u);
  EXPECT_EQ(plan->Find(a).block, plan->Find(c).block);
  EXPECT_EQ(plan->Find(b).block, plan->Find(d).block);
  EXPECT_NE(plan->Find(a).block, plan->Find(b).block);
  EXPECT_EQ(plan->peak_bytes, 2 * kN * 4);
  EXPECT_EQ(plan->no_reuse_bytes, 4 * kN * 4);
  EXPECT_EQ(plan->Find(x).block, -1) << "graph inputs are never planned";
}

TEST(MemoryPlan, TakesTheSmallestFreeBlockThatFits) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Value* big = Op(g, "Relu", {x}, 4 * kN);
  Value* small = Op(g, "Relu", {x}, kN);
  Value* y = Op(g, "Add", {big, small}, kN);  // both free after this node
  Value* z = Op(g, "Relu", {y}, kN / 2);      // fits both: takes the smaller
  Value* w = Op(g, "Relu", {z}, 2 * kN);      // fits only `big`'s
  Value* v = Op(g, "Relu", {w}, 8 * kN);      // fits none: a new block
  ASSERT_TRUE(g.MarkOutput(v).ok());
  auto plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->Find(z).block, plan->Find(small).block);
  EXPECT_EQ(plan->Find(w).block, plan->Find(big).block);
  EXPECT_TRUE(plan->Find(v).new_block);
  EXPECT_EQ(plan->blocks.size(), 4u);  // big, small, y, v
  EXPECT_EQ(plan->blocks[static_cast<size_t>(plan->Find(small).block)].bytes, kN * 4) << "a block keeps its size";
}

TEST(MemoryPlan, ViewsShareTheirInputsBlockAndKeepItLive) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Value* a = Op(g, "Relu", {x}, kN);
  Value* va = Op(g, "Identity", {a}, kN);  // a view: a's block, read two nodes later
  Value* b = Op(g, "Relu", {x}, kN);
  Value* c = Op(g, "Add", {va, b}, kN);
  Value* vx = Op(g, "Flatten", {x}, kN);  // a view of a graph input: not in the arena
  Value* d = Op(g, "Add", {c, vx}, kN);
  ASSERT_TRUE(g.MarkOutput(d).ok());
  auto plan = PlanMemory(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->Find(va).block, plan->Find(a).block);
  EXPECT_NE(plan->Find(b).block, plan->Find(a).block) << "a is live through its view's reader";
  EXPECT_NE(plan->Find(c).block, plan->Find(a).block) << "c is written while its node reads a's block";
  EXPECT_EQ(plan->Find(vx).block, -1);
  EXPECT_EQ(plan->no_reuse_bytes, 4 * kN * 4) << "views ask for nothing";
}

TEST(MemoryPlan, ValuesOutOfTheArenaAreNotPlanned) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Value* a = Op(g, "Relu", {x}, kN);
  Value* y = Op(g, "Relu", {a}, kN);
  Value* vy = Op(g, "Identity", {y}, kN);
  ASSERT_TRUE(g.MarkOutput(y).ok());
  ASSERT_TRUE(g.MarkOutput(vy).ok());
  MemoryPlanOptions o;
  o.in_arena = [&](const Value& v) { return &v != y; };  // y goes to the caller's buffer
  auto plan = PlanMemory(g, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->Find(y).block, -1);
  EXPECT_EQ(plan->Find(vy).block, -1) << "a view of a value out of the arena is out of it too";
  EXPECT_NE(plan->Find(a).block, -1);
  EXPECT_EQ(plan->external_bytes, kN * 4);
  EXPECT_EQ(plan->no_reuse_bytes, kN * 4);
}

TEST(MemoryPlan, ScratchLivesDuringItsNode) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Value* a = Op(g, "Relu", {x}, kN);
  Value* y = Op(g, "Relu", {a}, kN);
  ASSERT_TRUE(g.MarkOutput(y).ok());
  MemoryPlanOptions o;
  o.in_arena = [&](const Value& v) { return &v != y; };
  o.scratch = [](const Node& n) { return std::vector<int64_t>{kN * 4, 100}; };
  auto plan = PlanMemory(g, o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->scratch.size(), 4u);
  const int block_a = plan->Find(a).block;
  for (int node = 0; node < 2; ++node) {
    const ScratchPlacement& s0 = plan->scratch[static_cast<size_t>(2 * node)];
    const ScratchPlacement& s1 = plan->scratch[static_cast<size_t>(2 * node + 1)];
    EXPECT_EQ(s0.node, node);
    EXPECT_EQ(s0.where.bytes, kN * 4);
    EXPECT_EQ(s1.where.bytes, 100);
    EXPECT_NE(s0.where.block, s1.where.block) << "two scratch buffers of one node";
    EXPECT_NE(s0.where.block, block_a) << "a is live at both nodes";
    EXPECT_NE(s1.where.block, block_a);
  }
  // Node 0's scratch is free again at node 1.
  EXPECT_EQ(plan->scratch[2].where.block, plan->scratch[0].where.block);
  EXPECT_EQ(plan->scratch[3].where.block, plan->scratch[1].where.block);
  EXPECT_EQ(plan->peak_bytes, kN * 4 + kN * 4 + 100);
  EXPECT_EQ(plan->no_reuse_bytes, kN * 4 + 2 * (kN * 4 + 100));
}

TEST(MemoryPlan, OnlinePlannerPlacesOutputsTogether) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {kN}).value();
  Node* split = g.AddNodeTyped("Split", {x}, {}, {{DType::kF32, {kN / 2}}, {DType::kF32, {kN / 2}}});
  Value* q = split->output(0);
  Value* k = split->output(1);
  Value* y = Op(g, "Relu", {q}, kN / 2);
  Value* z = Op(g, "Add", {y, k}, kN / 2);
  ASSERT_TRUE(g.MarkOutput(z).ok());
  MemoryPlanner p(g, 256);
  const Value* qk[] = {q, k};
  const MemoryPlacement together = p.PlaceTogether(qk, kN * 4);
  EXPECT_TRUE(together.new_block);
  p.NextNode();
  const MemoryPlacement py = p.Place(y);
  EXPECT_NE(py.block, together.block) << "k is read later";
  EXPECT_EQ(py.offset % 256, 0);
  p.NextNode();
  const MemoryPlacement scratch = p.Scratch(16);
  EXPECT_NE(scratch.block, together.block);
  p.NextNode();
  const MemoryPlan plan = p.Finish();
  EXPECT_EQ(plan.Find(q).block, plan.Find(k).block);
  EXPECT_EQ(plan.peak_bytes, kN * 4 + kN / 2 * 4 + 16);
}

// Random graphs: values of random sizes, views, multi-output nodes, graph outputs inside and out
// of the arena, scratch; no two buffers live at the same node may overlap in the arena.
TEST(MemoryPlan, LiveBuffersNeverOverlap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE(trial);
    Graph g;
    std::vector<Value*> values;
    const int num_inputs = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < num_inputs; ++i)
      values.push_back(g.AddInput(StrCat("x", i), DType::kF32, {1 + static_cast<int64_t>(rng() % 64)}).value());
    const int num_nodes = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < num_nodes; ++i) {
      std::vector<Value*> in;
      const int arity = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < arity; ++k) {  // mostly recent values: chains and diamonds
        const size_t back = std::min<size_t>(values.size(), 1 + rng() % 6);
        in.push_back(values[values.size() - 1 - rng() % back]);
      }
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 0) {
        values.push_back(Op(g, "Identity", {in[0]}, in[0]->numel()));
      } else {
        std::vector<ValueType> outs;
        const int num_outputs = kind == 1 ? 2 : 1;
        for (int k = 0; k < num_outputs; ++k) outs.push_back({DType::kF32, {static_cast<int64_t>(rng() % 200)}});
        Node* n = g.AddNodeTyped("Relu", in, {}, outs);
        for (Value* o : n->outputs()) values.push_back(o);
      }
    }
    for (size_t i = static_cast<size_t>(num_inputs); i < values.size(); ++i) {
      if (rng() % 8 != 0 && i + 1 != values.size()) continue;
      ASSERT_TRUE(g.MarkOutput(values[i]).ok());
    }
    std::map<const Node*, std::vector<int64_t>> scratch;
    for (const auto& n : g.nodes())
      for (int k = static_cast<int>(rng() % 3); k > 0; --k) scratch[n.get()].push_back(static_cast<int64_t>(rng() % 500));
    const int64_t alignment = int64_t{1} << (rng() % 9);
    std::map<const Value*, bool> arena;
    for (Value* v : values) arena[v] = rng() % 5 != 0;
    MemoryPlanOptions o;
    o.alignment = alignment;
    o.in_arena = [&](const Value& v) { return arena.at(&v); };
    o.scratch = [&](const Node& n) { return scratch[&n]; };
    auto plan = PlanMemory(g, o);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();

    // Liveness computed here on its own: [first node, last node] of every buffer.
    std::map<const Value*, int> producer_index, last_read;
    std::map<const Value*, const Value*> root;  // a view's buffer is its input's
    for (const Value* in : g.inputs()) root[in] = in;
    int i = 0;
    for (const auto& n : g.nodes()) {
      for (const Value* in : n->inputs()) last_read[in] = i;
      for (const Value* out : n->outputs()) {
        producer_index[out] = i;
        root[out] = n->op() == "Identity" ? root[n->input(0)] : out;
      }
      ++i;
    }
    for (const Value* out : g.outputs()) last_read[out] = num_nodes;
    struct Buffer {
      int first, last;
      MemoryPlacement where;
    };
    std::map<const Value*, Buffer> by_root;
    for (const auto& [v, r] : root) {
      if (!producer_index.count(r)) {
        EXPECT_EQ(plan->Find(v).block, -1) << "a graph input or a view of one";
        continue;
      }
      if (!arena.at(r)) {
        EXPECT_EQ(plan->Find(v).block, -1);
        continue;
      }
      const MemoryPlacement p = plan->Find(v);
      ASSERT_GE(p.block, 0);
      Buffer& b = by_root.try_emplace(r, Buffer{producer_index[r], producer_index[r], plan->Find(r)}).first->second;
      EXPECT_EQ(p.block, b.where.block) << "a view shares its input's block";
      if (last_read.count(v)) b.last = std::max(b.last, last_read[v]);
    }
    std::vector<Buffer> buffers;
    for (const auto& [r, b] : by_root) buffers.push_back(b);
    int64_t requested = 0;
    for (const Buffer& b : buffers) requested += b.where.bytes;
    for (const ScratchPlacement& s : plan->scratch) {
      buffers.push_back({s.node, s.node, s.where});
      requested += s.where.bytes;
    }
    EXPECT_EQ(plan->no_reuse_bytes, requested);
    int64_t block_bytes = 0;
    for (const MemoryBlock& b : plan->blocks) {
      EXPECT_EQ(b.offset % alignment, 0);
      block_bytes += b.bytes;
    }
    EXPECT_EQ(plan->peak_bytes, block_bytes);
    EXPECT_LE(plan->peak_bytes, plan->no_reuse_bytes);
    for (size_t p = 0; p < buffers.size(); ++p) {
      const MemoryBlock& bp = plan->blocks[static_cast<size_t>(buffers[p].where.block)];
      EXPECT_LE(buffers[p].where.bytes, bp.bytes);
      EXPECT_LE(bp.offset + bp.bytes, plan->arena_bytes);
      for (size_t q = p + 1; q < buffers.size(); ++q) {
        const bool live_together = buffers[p].first <= buffers[q].last && buffers[q].first <= buffers[p].last;
        if (!live_together) continue;
        const MemoryBlock& bq = plan->blocks[static_cast<size_t>(buffers[q].where.block)];
        const bool overlap = bp.offset < bq.offset + std::max<int64_t>(bq.bytes, 1) &&
                             bq.offset < bp.offset + std::max<int64_t>(bp.bytes, 1);
        ASSERT_FALSE(overlap) << "buffers live over nodes [" << buffers[p].first << ", " << buffers[p].last << "] and ["
                              << buffers[q].first << ", " << buffers[q].last << "] overlap";
      }
    }
  }
}

}  // namespace
}  // namespace graphfuse

// Memory planning by liveness, one planner for every executor.
//
// The nodes of a graph run one after another in graph order. Values written by nodes and
// per-node scratch take blocks of one arena:
//   - a value is live from the node that asks for its buffer to the last top-level node that
//     reads it; a graph output is live to the end; a value nobody reads, to its own node;
//   - scratch is live during the node that asks for it;
//   - a view (OpSchema::view: Reshape, Squeeze, ...) shares its input's block, which then
//     stays live as long as either is read;
//   - after each node, the blocks whose last reader it was become free; a request takes the
//     smallest free block that fits (the lowest index among equals), else a new block of
//     exactly its size. Blocks keep the size they were created with.
// Each block has an offset in the arena, a multiple of the alignment (blocks laid end to end in
// creation order), for a backend that allocates the arena as one buffer; a backend that
// allocates blocks one by one, as the planner creates them, ignores the offsets.
//
// Two ways in: PlanMemory plans a whole graph whose requests are known from the graph alone
// (the CPU executor); MemoryPlanner takes the requests as a backend plans each node's launches
// (the CUDA executor learns its workspaces, and which outputs share one buffer, only then).
// Which values live in the arena is the backend's choice: graph inputs, constants, and
// outputs written straight into the caller's buffers are simply not asked for.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse {

struct MemoryBlock {
  int64_t offset = 0;  // in the arena: a multiple of the plan's alignment
  int64_t bytes = 0;   // the first request it held (later ones fit in it)
};

// Where one request was placed: block -1 when the value is not in the arena.
struct MemoryPlacement {
  int block = -1;
  int64_t offset = 0;  // the block's offset in the arena
  int64_t bytes = 0;   // what was asked for (at most the block's bytes)
  bool new_block = false;  // the block was created for this request
};

struct ScratchPlacement {
  int node = 0;  // the top-level node (graph order) it belongs to
  MemoryPlacement where;
};

struct MemoryPlan {
  std::vector<MemoryBlock> blocks;
  std::unordered_map<const Value*, MemoryPlacement> values;  // in the arena (views too)
  std::vector<ScratchPlacement> scratch;                      // in request order
  int64_t alignment = 1;
  int64_t arena_bytes = 0;     // the arena holding every block (alignment padding included)
  int64_t peak_bytes = 0;      // the blocks' bytes added up: what lives at the peak
  int64_t no_reuse_bytes = 0;  // every request added up: the arena if nothing were reused
  int64_t external_bytes = 0;  // PlanMemory: bytes of node outputs kept out of the arena

  // The placement of `v`, or one with block -1 when it is not in the arena.
  MemoryPlacement Find(const Value* v) const;
};

// Requests in node order. Liveness comes from the top-level nodes of the graph given here;
// values of nested graphs (a fused node's reference graph) have no reader there and so live
// until the end of the top-level node that asked for them.
class MemoryPlanner {
 public:
  // `alignment` (bytes, at least 1): of every block's offset in the arena.
  explicit MemoryPlanner(const Graph& g, int64_t alignment = 1);

  // The top-level node being planned (graph order, from 0).
  int node() const { return node_; }
  // Ends the current node: blocks no later node reads become free.
  void NextNode();

  // The buffer of `v` (v->numel() elements of its dtype), live until its last reader. A value
  // asked for again keeps its first placement.
  MemoryPlacement Place(const Value* v);
  // One buffer of `bytes` shared by `values` (outputs of one node laid out in it by the
  // backend), live until the last of them is read.
  MemoryPlacement PlaceTogether(std::span<const Value* const> values, int64_t bytes);
  // Scratch of `bytes` for the current node only.
  MemoryPlacement Scratch(int64_t bytes);
  // `view` shares `of`'s block (keeping it live while `view` is read); false, and nothing
  // planned, when `of` is not in the arena.
  bool Alias(const Value* view, const Value* of);

  const MemoryPlan& plan() const { return plan_; }
  MemoryPlan Finish() { return std::move(plan_); }

 private:
  static constexpr int kForever = std::numeric_limits<int>::max();
  int LastUse(const Value* v) const;
  MemoryPlacement Take(int64_t bytes, int end);

  struct BlockState {
    int end = 0;  // the last top-level node that uses it
    bool free = false;
  };
  std::unordered_map<const Value*, int> last_use_;  // graph outputs: kForever
  std::vector<BlockState> state_;                   // per block of plan_.blocks
  MemoryPlan plan_;
  int node_ = 0;
};

struct MemoryPlanOptions {
  int64_t alignment = 1;  // of every block's offset in the arena
  // Whether a value written by a node (not a view's output 0) lives in the arena; when not, the
  // backend keeps it elsewhere (a caller's buffer) and its bytes count in external_bytes.
  // Unset: all of them.
  std::function<bool(const Value&)> in_arena;
  // Scratch each node asks for, in bytes, in order (placed after the node's outputs). Unset: none.
  std::function<std::vector<int64_t>(const Node&)> scratch;
};

// Plans every node of `g` in order: its outputs (a view op's output 0 aliases its input 0),
// then its scratch. An error when a view has no input.
Result<MemoryPlan> PlanMemory(const Graph& g, const MemoryPlanOptions& options = {});

}  // namespace graphfuse

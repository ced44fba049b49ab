// A planned graph as a function of its sequence lengths: plans of one shape class, made without
// running the importer or the passes again.
//
// Two plans of a model whose input sizes differ by a step (a decode step: past and total
// lengths one longer) usually differ only in integers: value dims, size attributes (an
// attention's seq_k), the elements of small integer constants (a Reshape's target) and the
// sizes of constants that repeat one value (a mask of ones). `Fit` checks that two planned
// graphs are the same but for such integers, each of which moved by a whole multiple of the
// step, and `Instantiate(t)` builds the graph t steps from the first one: every such integer
// moved t times its slope, every other part (nodes, weights, float constants, fused bodies)
// as it was. The caller checks a prediction against a real plan before trusting the template
// (CompiledModel: the third plan of a class is made both ways and compared), and every
// instantiated graph passes Graph::Verify, whose shape inference catches a size that does not
// fit its node.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/status.h"

namespace graphfuse {

// A graph split into its structure (ops, names, dtypes, float values, weights' identities) and
// the integers a change of input sizes may move, in a fixed walk order.
struct FlatGraph {
  std::string structure;
  std::vector<int64_t> ints;
  // How each constant met in the walk entered the flat form (a small-integer tensor, a fill, a
  // causal mask, a hash, an identity), in walk order, so that a rebuild need not scan it again.
  std::vector<uint8_t> contents;
  // Each graph attribute (a fused body, a reference graph) met in the walk: where its integers
  // begin and end among `ints`, and its constants among `contents`.
  struct Subgraph {
    const Graph* graph;
    std::pair<size_t, size_t> ints, contents;
  };
  std::vector<Subgraph> subgraphs;
};
FlatGraph Flatten(const Graph& g);

class ShapeTemplate {
 public:
  // `b` is the plan `delta` steps away from `a` (delta != 0). An error says what differs
  // beyond integers, or which integer did not move by a multiple of delta.
  static Result<ShapeTemplate> Fit(std::shared_ptr<const Graph> a, const Graph& b, int64_t delta);
  // The graph t steps from `a` (verified). `references` false leaves out the "reference" graph
  // attributes whose sizes move (for a target that never reads them, Target::
  // ReadsReferenceGraphs): most of a decoder's moving nodes are attention reference graphs.
  Result<std::shared_ptr<Graph>> Instantiate(int64_t t, bool references = true) const;

 private:
  std::shared_ptr<const Graph> base_;
  std::vector<int64_t> base_ints_, slopes_;
  std::vector<uint8_t> contents_;  // FlatGraph::contents of the base
  // The base's graph attributes none of whose integers move, with how many integers and
  // constants they hold: instantiated graphs share them.
  std::map<const Graph*, std::pair<size_t, size_t>> fixed_subgraphs_;
  // The others (integers and constants each holds, counted once per meeting in the walk).
  std::map<const Graph*, std::pair<size_t, size_t>> moving_subgraphs_;
};

}  // namespace graphfuse

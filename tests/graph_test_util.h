// Small lookups shared by the pass tests: ops in a graph, groups and refusals in a report.
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "passes/fuse_elementwise.h"

namespace graphfuse {

inline int CountOp(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op() == op;
  return n;
}

inline const Node* FindOp(const Graph& g, const std::string& op) {
  for (const auto& node : g.nodes())
    if (node->op() == op) return node.get();
  return nullptr;
}

// The first refusal with this code, or the first group of this kind.
inline const FusionRefusal* FindRefusal(const FusionReport& r, const std::string& code) {
  for (const auto& x : r.refusals)
    if (x.code == code) return &x;
  return nullptr;
}
inline const FusedGroupInfo* FindGroup(const FusionReport& r, const std::string& kind) {
  for (const auto& x : r.groups)
    if (x.kind == kind) return &x;
  return nullptr;
}

inline std::vector<TensorView> Views(const std::vector<Tensor>& ts) {
  std::vector<TensorView> v;
  for (const Tensor& t : ts) v.push_back(t.view());
  return v;
}

}  // namespace graphfuse

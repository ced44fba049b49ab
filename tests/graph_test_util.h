// Small lookups shared by the pass tests: ops in a graph, groups and refusals in a report.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graphfuse/graph.h"
#include "graphfuse/tensor.h"
#include "ir/text.h"
#include "passes/fuse_elementwise.h"

namespace graphfuse {

// A graph in textual IR; a parse error fails the test and gives an empty graph.
inline std::unique_ptr<Graph> Parse(const std::string& text) {
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : std::make_unique<Graph>();
}

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

// Fresh random data for every graph input: random sign, magnitude uniform in [lo, hi) (never
// zero). `special` may give an element of a named input its own value (masks, keep-masks).
using SpecialValue = std::function<std::optional<double>(const Value& input, int64_t index, std::mt19937& rng)>;
inline std::vector<Tensor> RandomInputs(const Graph& g, uint32_t seed, double lo, double hi,
                                        const SpecialValue& special = nullptr) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mag(lo, hi);
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs()) {
    Tensor t = Tensor::Empty(v->dtype(), v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double sign = (rng() & 1) ? 1 : -1;
      double x = sign * mag(rng);
      if (special)
        if (std::optional<double> s = special(*v, i, rng)) x = *s;
      t.SetFromDouble(i, x);
    }
    ins.push_back(std::move(t));
  }
  return ins;
}

// Fresh random float inputs (magnitude in [0.05, 1), random sign); integer and bool inputs 0.
inline std::vector<Tensor> FloatInputs(const Graph& g, uint32_t seed) {
  return RandomInputs(g, seed, 0.05, 1.0, [](const Value& v, int64_t, std::mt19937&) -> std::optional<double> {
    if (IsFloat(v.dtype())) return std::nullopt;
    return 0.0;
  });
}

// The largest |a[i] - b[i]| over two tensors of one size; NaN when any difference is NaN
// (std::max would pass over it).
inline double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double err = std::fabs(a.GetAsDouble(i) - b.GetAsDouble(i));
    if (!(err <= worst)) worst = err;
  }
  return worst;
}

// The largest |t[i]|.
inline double MaxAbs(const Tensor& t) {
  double peak = 0;
  for (int64_t i = 0; i < t.numel(); ++i) peak = std::max(peak, std::fabs(t.GetAsDouble(i)));
  return peak;
}

inline std::vector<TensorView> Views(const std::vector<Tensor>& ts) {
  std::vector<TensorView> v;
  for (const Tensor& t : ts) v.push_back(t.view());
  return v;
}

}  // namespace graphfuse

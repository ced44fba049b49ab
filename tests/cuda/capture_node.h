// Test helper for the CUDA kernel tests: one node's inputs and outputs as the CPU executor sees
// them when it runs the whole graph, so that a generated kernel can run on exactly those
// operands and be compared with the CPU kernel's results.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "../graph_test_util.h"
#include "cpu/executor.h"
#include "graphfuse/graph.h"
#include "graphfuse/tensor.h"

namespace graphfuse::cuda {

struct NodeRun {
  std::vector<Tensor> in, out;
};

// Runs g on the CPU on `inputs` (one per graph input) and copies `target`'s operands and results.
inline Result<NodeRun> CaptureNode(const Graph& g, const Node& target, const std::vector<Tensor>& inputs) {
  GF_ASSIGN_OR_RETURN(auto plan, ExecutionPlan::Compile(g));
  NodeRun run;
  auto copy = [](const TensorView& v) -> Result<Tensor> {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(v.dtype, v.shape));
    std::memcpy(t.data(), v.data, t.nbytes());
    return t;
  };
  ExecutionPlan::StepObserver observe = [&](const Node& n, std::span<const TensorView> in,
                                            std::span<const TensorView> out) -> Status {
    if (&n != &target) return Status::Ok();
    for (const TensorView& v : in) {
      GF_ASSIGN_OR_RETURN(Tensor t, copy(v));
      run.in.push_back(std::move(t));
    }
    for (const TensorView& v : out) {
      GF_ASSIGN_OR_RETURN(Tensor t, copy(v));
      run.out.push_back(std::move(t));
    }
    return Status::Ok();
  };
  std::vector<Tensor> outs;
  std::vector<TensorView> out_views;
  for (const Value* v : g.outputs()) outs.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
  for (const Tensor& t : outs) out_views.push_back(t.view());
  GF_RETURN_IF_ERROR(plan->Run(Views(inputs), out_views, CpuContext{}, &observe));
  if (run.out.empty()) return Internal("node ", target.name(), " did not run");
  return run;
}

}  // namespace graphfuse::cuda

// The embeddable API: load a model, compile it for a Target, run it.
//
//   auto model = graphfuse::Model::FromOnnxFile("block.onnx");           // or bytes, or a Graph
//   auto target = graphfuse::MakeTarget("cpu", {.threads = 4});
//   auto compiled = graphfuse::CompiledModel::Compile(std::move(*model), **target);
//   auto outputs = (*compiled)->Run(inputs);                           // std::vector<Tensor>
//   for (const auto& g : (*compiled)->report().groups) ...             // what was fused, and why not
//
// A CompiledModel may be run from several threads at once. It leaves process-wide settings
// (BLAS threads, OpenMP, environment variables) as the embedding program set them; see
// ApplyProcessSettings in graphfuse/cpu.h for the ones graphfuse's own tools choose.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/fusion.h"
#include "graphfuse/graph.h"
#include "graphfuse/status.h"
#include "graphfuse/target.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

// A graph as loaded, before any pass: a model to compile once.
class Model {
 public:
  // An ONNX file (.onnx); tensors kept in external data files are refused as Unimplemented.
  static Result<Model> FromOnnxFile(const std::string& path);
  // A serialized ONNX ModelProto; `name` labels errors.
  static Result<Model> FromOnnxBytes(std::string_view bytes, const std::string& name = "model");
  // A graph built with the graph API (graphfuse/graph.h); verified here.
  static Result<Model> FromGraph(std::unique_ptr<Graph> graph);

  const Graph& graph() const { return *graph_; }

 private:
  explicit Model(std::unique_ptr<Graph> graph) : graph_(std::move(graph)) {}
  std::unique_ptr<Graph> graph_;
  friend class CompiledModel;
};

struct CompileOptions {
  // fusion.enabled = false compiles the unfused baseline: every node its own kernel.
  FusionOptions fusion;
};

// A graph input or output as a caller sees it.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
};

class CompiledModel {
 public:
  // Runs the pass pipeline for `target` and compiles the result with it.
  static Result<std::unique_ptr<CompiledModel>> Compile(Model model, const Target& target,
                                                        const CompileOptions& options = {});

  const std::vector<TensorInfo>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return outputs_; }

  // Runs on `inputs` (one per input, types as inputs() says) into caller-owned `outputs` (one per
  // output, preallocated as outputs() says). Errors name the input, node and op at fault (wrong
  // count, dtype or shape: InvalidArgument), and leave the model usable for the next call.
  // Safe to call from several threads at once.
  Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs) const;
  // Same, returning newly allocated outputs.
  Result<std::vector<Tensor>> Run(std::span<const TensorView> inputs) const;

  // What fusion did: every fused kernel with its member nodes, every refused merge and why.
  const FusionReport& report() const { return report_; }
  // The graph as planned (after every pass).
  const Graph& graph() const { return *graph_; }
  // Kernel launches one run makes.
  int64_t launches_per_run() const { return executable_->launches_per_run(); }

 private:
  CompiledModel() = default;
  std::shared_ptr<const Graph> graph_;
  std::unique_ptr<Executable> executable_;
  FusionReport report_;
  std::vector<TensorInfo> inputs_, outputs_;
};

}  // namespace graphfuse

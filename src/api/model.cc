// The embeddable API (include/graphfuse/model.h): import, the pass pipeline for a Target, and
// that target's executable, behind one object.
#include "graphfuse/model.h"

#include "onnx/import.h"
#include "passes/pipeline.h"

namespace graphfuse {

Result<Model> Model::FromOnnxFile(const std::string& path) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ImportOnnxFile(path));
  return Model(std::move(g));
}

Result<Model> Model::FromOnnxBytes(std::string_view bytes, const std::string& name) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ImportOnnxBytes(std::string(bytes), name));
  return Model(std::move(g));
}

Result<Model> Model::FromGraph(std::unique_ptr<Graph> graph) {
  if (!graph) return InvalidArgument("Model::FromGraph: no graph");
  GF_RETURN_IF_ERROR(graph->Verify().WithContext(StrCat("graph '", graph->name(), "'")));
  return Model(std::move(graph));
}

Result<std::unique_ptr<CompiledModel>> CompiledModel::Compile(Model model, const Target& target,
                                                              const CompileOptions& options) {
  std::unique_ptr<CompiledModel> m(new CompiledModel());
  std::shared_ptr<Graph> g = std::move(model.graph_);
  PipelineOptions pipeline;
  pipeline.fusion = options.fusion;
  pipeline.fusion_report = &m->report_;
  GF_RETURN_IF_ERROR(RunPipeline(*g, target, pipeline).status().WithContext(StrCat("graph '", g->name(), "'")));
  for (const Value* v : g->inputs()) m->inputs_.push_back({v->name(), v->dtype(), v->shape()});
  for (const Value* v : g->outputs()) m->outputs_.push_back({v->name(), v->dtype(), v->shape()});
  m->graph_ = g;
  GF_ASSIGN_OR_RETURN(m->executable_, target.Compile(std::move(g)));
  return m;
}

Status CompiledModel::Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs) const {
  return executable_->Run(inputs, outputs);
}

Result<std::vector<Tensor>> CompiledModel::Run(std::span<const TensorView> inputs) const {
  std::vector<Tensor> out;
  std::vector<TensorView> views;
  for (const TensorInfo& o : outputs_) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(o.dtype, o.shape));
    out.push_back(std::move(t));
    views.push_back(out.back().view());
  }
  GF_RETURN_IF_ERROR(executable_->Run(inputs, views));
  return out;
}

}  // namespace graphfuse

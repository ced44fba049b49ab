// The embeddable API: load a model, compile it for a Target, run it.
//
//   auto model = graphfuse::Model::FromOnnxFile("block.onnx");           // or bytes, or a Graph
//   auto target = graphfuse::MakeTarget("cpu", {.cpu = {.threads = 4}});
//   auto compiled = graphfuse::CompiledModel::Compile(std::move(*model), std::move(*target));
//   auto outputs = (*compiled)->Run(inputs);                           // std::vector<Tensor>
//   for (const auto& g : (*compiled)->plan()->report().groups) ...     // what was fused, and why not
//
// Dims may be symbolic (an ONNX model exported with dynamic axes): each call's input shapes,
// and the values of inputs that become shapes, select a Plan, made for them on first sight and
// kept in a bounded cache, so a later call with a known signature does no planning.
//
// A CompiledModel may be run from several threads at once. It leaves process-wide settings
// (BLAS threads, OpenMP, environment variables) as the embedding program set them; graphfuse's
// own tools set none either.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/fusion.h"
#include "graphfuse/graph.h"
#include "graphfuse/profiling.h"
#include "graphfuse/status.h"
#include "graphfuse/target.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

struct InputBinding;

namespace detail {
struct ModelSource;
struct PlanCache;
struct ShapeClass;
}  // namespace detail

// A graph input or output as a caller sees it. In a model's declaration a dim may be symbolic:
// shape[k] is -1 and dim_params[k] its name ("" when the model leaves it unnamed); in a Plan
// every dim is a size.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<std::string> dim_params;  // one per dim; "" for a fixed dim
  // Inputs only: its values become a shape (a Reshape's shape, a Range's limit, ...), so each
  // set of values gets a plan of its own.
  bool values_shape_plan = false;
  // Where its values become a shape: the first operand that reads them ("input 1 of node
  // 'Reshape_0' (Reshape)"), for messages.
  std::string value_use;
};

// What an ONNX model says about itself (ModelProto's producer, domain, version, doc strings and
// metadata_props); empty for a model built with the graph API.
struct ModelMetadata {
  std::string producer_name, producer_version, domain;
  std::string description;        // the model's doc_string
  std::string graph_name;
  std::string graph_description;  // the graph's doc_string
  int64_t version = 0;            // model_version
  std::vector<std::pair<std::string, std::string>> custom;  // metadata_props, in file order
};

// A model as loaded, before any pass: an ONNX model, whose dims may be symbolic, or a graph
// built with the graph API (static).
class Model {
 public:
  // An ONNX file (.onnx). Weights kept in external data files (the dynamo exporter's
  // model.onnx.data; every model over 2 GB) are read from the file's folder, mapped rather than
  // copied where they lie aligned; a location outside the folder, a missing file or a range past
  // a file's end is refused naming the initializer and the path.
  static Result<Model> FromOnnxFile(const std::string& path);
  // A serialized ONNX ModelProto; `name` labels errors; `external_data_folder`: where its
  // external data files are (none: a model with external data is refused).
  static Result<Model> FromOnnxBytes(std::string_view bytes, const std::string& name = "model",
                                     const std::string& external_data_folder = "");
  // A graph built with the graph API (graphfuse/graph.h); verified here.
  static Result<Model> FromGraph(std::unique_ptr<Graph> graph);

  // Inputs and outputs as declared.
  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  // Whether one plan serves every call: every dim fixed, no input whose values become shapes.
  bool is_static() const;
  const ModelMetadata& metadata() const;

 private:
  explicit Model(std::shared_ptr<detail::ModelSource> source) : source_(std::move(source)) {}
  std::shared_ptr<detail::ModelSource> source_;
  friend class CompiledModel;
};

struct CompileOptions {
  // fusion.enabled = false compiles the unfused baseline: every node its own kernel.
  FusionOptions fusion;
  // What the model computes in, as the target runs it (Target::ForDtype): bf16 on the CPU holds
  // the GEMMs' constant weights in bf16; bf16 / f16 on the CUDA target converts the model. The
  // model's inputs and outputs keep their declared types. A dtype the target does not run is
  // refused by Compile.
  DType dtype = DType::kF32;
  // Plans kept for a model with symbolic dims: the least recently used one is dropped when a
  // new input signature needs room. At least 1.
  int plan_cache_capacity = 16;
  // Plans of one shape class are made without import or passes: when two plans' input sizes
  // differ by a step (a decode step: past and total lengths one longer; a prompt one longer)
  // and the planned graphs differ only in sizes that moved by multiples of it, the class's later
  // plans are the first one with its sizes moved (ShapeTemplate), once a third plan made both
  // ways agreed. The first plan of a class makes its next two steps at once (every size of 2 or
  // more one and two longer), so that its template is fitted and checked before the class's
  // second call, and a decoder's second and third steps are already planned. Off: every
  // signature is planned from the model.
  bool shape_classes = true;
};

// Time spent making one plan, in milliseconds.
struct PlanningTime {
  double import_ms = 0;   // the graph for the bound shapes (shape arithmetic folded)
  double passes_ms = 0;   // canonicalization, fusion, memory planning; or the graph made from its
                          // shape class's template (then import_ms is 0)
  double compile_ms = 0;  // the target's executable (native code where it compiles any)
  // Of compile_ms: timing the CPU's GEMM engines for shape classes this machine had not timed
  // (paid once per machine; ExecutableStats::tuning_ms).
  double gemm_tuning_ms = 0;
  double total_ms() const { return import_ms + passes_ms + compile_ms; }
};

// The model specialized for one input signature: its graph after every pass and the target's
// executable for it.
class Plan {
 public:
  // Every dim a size.
  const std::vector<TensorInfo>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return outputs_; }
  // What fusion did: every fused kernel with its member nodes, every refused merge and why.
  const FusionReport& report() const { return report_; }
  // The graph as planned (inputs whose values became shapes are constants in it). A plan made
  // from its shape class's template for a target that never reads reference graphs (the CPU:
  // Target::ReadsReferenceGraphs) leaves out the "reference" graphs of fused nodes whose sizes
  // moved; the class's first plan holds them.
  const Graph& graph() const { return *graph_; }
  // Kernel launches one run makes.
  int64_t launches_per_run() const { return executable_->launches_per_run(); }
  // The executable's launches and memory, and how it runs, for a person (Executable::stats,
  // Executable::Describe).
  ExecutableStats stats() const { return executable_->stats(); }
  std::vector<std::string> describe() const { return executable_->Describe(); }
  // Replays of the latest run timed on the device (Executable::DeviceRunMs).
  Result<double> DeviceRunMs(int repeats, double* median_wall_ms = nullptr) const {
    return executable_->DeviceRunMs(repeats, median_wall_ms);
  }
  // How the target's kernels run the nodes where they choose (the CPU: each GEMM's engine).
  const std::vector<KernelChoice>& kernel_choices() const { return kernel_choices_; }
  const PlanningTime& planning_time() const { return planning_; }
  // The input signature it was made for: "f32[2,7];i64[3]={2,7,64}".
  const std::string& signature() const { return signature_; }
  // Whether it was made from its shape class's template (no import, no passes; CompileOptions::
  // shape_classes); its report is the class's first plan's.
  bool from_template() const { return from_template_; }
  // Whether Run reads model input (output = false) or writes model output `index` through a
  // strided view in place (TensorView::strides): a KV cache's past and present rows kept in one
  // buffer of larger capacity, present over past's rows, so a decode step writes only its new
  // rows. Other strided views are copied to and from contiguous buffers around the run.
  bool takes_strided(bool output, size_t index) const;

 private:
  friend class CompiledModel;
  Plan() = default;
  std::shared_ptr<const Graph> graph_;
  std::unique_ptr<Executable> executable_;
  FusionReport report_;
  std::vector<KernelChoice> kernel_choices_;
  std::vector<TensorInfo> inputs_, outputs_;
  std::vector<int> graph_input_;  // per model input: its graph input, or -1 (became a constant)
  PlanningTime planning_;
  std::string signature_;
  bool from_template_ = false;
};

struct PlanCacheStats {
  int64_t hits = 0;         // calls that found their plan (a static model's calls are not looked up)
  int64_t plans_made = 0;   // calls (or Compile) that planned
  int64_t evictions = 0;    // plans dropped for room
  int64_t size = 0;         // plans kept now
  int64_t capacity = 0;
  double planning_ms = 0;   // all planning so far
  double last_planning_ms = 0;  // the latest call's planning (0 when it found its plan)
  // Shape classes whose template makes their plans, and the plans made so (also in plans_made).
  // plans_ahead: plans made for a class's next steps before any call asked for them (kept in the
  // cache; their time is in planning_ms and in the last_planning_ms of the call that made them).
  int64_t shape_classes = 0;
  int64_t plans_from_template = 0;
  int64_t plans_ahead = 0;
  // What the plans derived from the weights, made once and shared by all of them whatever their
  // shapes (concatenated projections, folded norm scales, packed GEMM panels, bf16 copies): its
  // entries and bytes. The model's own weights are not counted.
  int64_t prepared_entries = 0;
  int64_t prepared_bytes = 0;
};

class CompiledModel {
 public:
  // A static model is planned here, and errors in the model surface here. A model with
  // symbolic dims is checked here and planned at each call with a signature not seen before;
  // the target is kept for that.
  static Result<std::unique_ptr<CompiledModel>> Compile(Model model, std::shared_ptr<const Target> target,
                                                        const CompileOptions& options = {});
  ~CompiledModel();

  // As the model declares them (symbolic dims are -1).
  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  const ModelMetadata& metadata() const;

  // The plan for these inputs' shapes (and values, where they become shapes): from the cache,
  // or made now. Inputs that contradict the model (count, dtype, rank, a fixed dim, two sizes
  // for one symbolic dim, more memory than the machine has) are refused with InvalidArgument
  // naming the input and the dim, and nothing is planned for them.
  Result<std::shared_ptr<const Plan>> PlanFor(std::span<const TensorView> inputs) const;
  // The plan the latest call used (for a static model, the one plan); nullptr before the first
  // call of a model with symbolic dims.
  std::shared_ptr<const Plan> plan() const;

  // Runs on `inputs` (one per input) into caller-owned `outputs` (one per output, preallocated
  // with the shapes PlanFor(inputs)->outputs() gives). Views may be strided (NumPy views, say).
  // A KV cache kept in place: give each `past` input as the first P rows (axis 2) of a buffer
  // [B, KV, capacity, d] and its `present` output as the first P + N rows of the same buffer
  // (same strides); where the plan takes them in place (Plan::takes_strided) a step writes only
  // the N new rows. Errors name the input, node and op at fault, and leave the model usable for
  // the next call. Safe to call from several threads. `trace`, when given, records the call and
  // each kernel's time (graphfuse/profiling.h); kernels are then timed one by one.
  Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
             TraceRecorder* trace = nullptr) const;
  // Same, returning newly allocated outputs.
  Result<std::vector<Tensor>> Run(std::span<const TensorView> inputs, TraceRecorder* trace = nullptr) const;
  // Run, showing `observer` each node of the plan with its inputs and outputs (slow: checks of
  // fused kernels against their original ops); Unimplemented on a target whose executables do
  // not (Executable::RunObserved).
  Status RunObserved(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                     const NodeObserver& observer) const;

  PlanCacheStats cache_stats() const;

 private:
  CompiledModel() = default;
  Result<std::shared_ptr<const Plan>> MakePlan(const InputBinding& binding) const;
  // A plan for `binding` from its shape class, or planned from the model, and the class
  // bookkeeping that goes with either; `ahead` receives the plans made for a new class's next
  // steps (CompileOptions::shape_classes).
  Result<std::shared_ptr<const Plan>> PlanByClass(const InputBinding& binding,
                                                  std::vector<std::shared_ptr<const Plan>>* ahead) const;
  // The cache takes `p` for its signature (the most recently used), dropping the least recently
  // used plans for room; the plan kept for the signature (one already there wins). A plan made
  // `ahead` of its call enters as the least recently used, and only where there is room.
  std::shared_ptr<const Plan> CachePlan(std::shared_ptr<const Plan> p, bool ahead = false) const;
  // A new class's plans one and two steps on, its template fitted and checked on them: `ahead`
  // receives them where the model takes those sizes and the template agrees.
  void LookAhead(detail::ShapeClass& cls, const InputBinding& binding,
                 std::vector<std::shared_ptr<const Plan>>* ahead) const;
  Status FinishPlan(Plan& p, std::shared_ptr<Graph> g, const InputBinding& binding) const;
  Status RunPlan(const Plan& plan, std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                 RunProfiler* profiler = nullptr, const NodeObserver* observer = nullptr) const;
  // PlanFor; `planned`, when given, says whether this call made the plan.
  Result<std::shared_ptr<const Plan>> PlanForTraced(std::span<const TensorView> inputs, bool* planned) const;
  // RunPlan, profiled and recorded in `trace` with the call's planning (since start_ns) when a
  // trace is given.
  Status RunTraced(const Plan& plan, std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                   int64_t start_ns, bool planned, TraceRecorder* trace) const;
  std::shared_ptr<detail::ModelSource> source_;
  std::shared_ptr<const Target> target_;
  CompileOptions options_;
  std::unique_ptr<detail::PlanCache> cache_;
  // A static model's one plan: its calls skip the binding and the cache (the executable checks
  // their inputs).
  std::shared_ptr<const Plan> static_plan_;
};

}  // namespace graphfuse

// The embeddable API (include/graphfuse/model.h): import, the pass pipeline for a Target, and
// that target's executable, per input signature, behind one object with a bounded plan cache.
#include "graphfuse/model.h"

#include <algorithm>
#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/prepared_store.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"
#include "passes/shape_template.h"
#include "runtime/signature.h"

namespace graphfuse {
namespace detail {

// What a Model was loaded from: an ONNX model (imported once per binding) or a graph built
// with the graph API (static: taken by its one plan).
struct ModelSource {
  std::string label;
  std::shared_ptr<const OnnxModel> onnx;
  std::unique_ptr<Graph> graph;
  std::vector<TensorDecl> inputs, outputs;
  std::vector<TensorInfo> input_info, output_info;
  ModelMetadata metadata;

  Result<std::unique_ptr<Graph>> Instantiate(const InputBinding& b) {
    if (onnx) return onnx->Instantiate(b);
    if (!graph) return InvalidArgument("model '", label, "' was compiled already (a graph is planned once)");
    return std::move(graph);
  }
};

// Plans of inputs whose symbolic sizes move in step from a first plan's (ShapeTemplate).
struct ShapeClass {
  std::vector<int64_t> sizes;         // the symbolic sizes of its first plan's inputs
  std::shared_ptr<const Plan> first;
  std::vector<bool> moving;           // the sizes that move with the step (known from its second plan)
  std::shared_ptr<const ShapeTemplate> tmpl;
  bool verified = false;              // a third plan, made both ways, agreed
  bool refused = false;               // its plans differ in more than moving sizes
  // Its template was fitted on plans made ahead, every size of 2 or more moving: until a call
  // shows which sizes move, a call that moves only some of them refits the class on itself.
  bool guessed = false;
};

// Plans by signature, most recently used first.
struct PlanCache {
  std::mutex mu;
  std::list<std::shared_ptr<ShapeClass>> classes;  // most recently used first, at most kMaxClasses
  std::list<std::shared_ptr<const Plan>> lru;
  std::unordered_map<std::string, std::list<std::shared_ptr<const Plan>>::iterator> index;
  std::shared_ptr<const Plan> last;
  PlanCacheStats stats;
};

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxClasses = 8;

// The sizes of the binding's symbolic dims, in declaration order; empty when an input's values
// become shapes (those plans stay per value) or nothing is symbolic.
std::vector<int64_t> SymbolicSizes(const std::vector<TensorDecl>& decls, const InputBinding& b) {
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < decls.size(); ++i) {
    if (b.values[i]) return {};
    for (size_t k = 0; k < decls[i].dims.size(); ++k)
      if (!decls[i].dims[k].fixed()) sizes.push_back(b.shapes[i][k]);
  }
  return sizes;
}

// What a new signature is to its class: t steps from its first plan along the class's step
// (0: not of this class). `fit`: the class has one plan, and these sizes all moved by t. Sizes
// 0 and 1 are special to the passes (an empty cache, a single row that broadcasts), so a moving
// size is 2 or more in every plan of a class.
// A signature with the first plan's own sizes (its plan dropped from the cache) is a member at
// t = 0 once the class has a template.
struct ClassStep {
  bool member = false;
  int64_t t = 0;
  bool fit = false;
};
// `use_template` false: as if the class had its first plan only.
ClassStep StepOf(const detail::ShapeClass& c, const std::vector<int64_t>& sizes, bool use_template = true) {
  if (c.refused || c.sizes.size() != sizes.size()) return {};
  const bool tmpl = c.tmpl && use_template;
  std::optional<int64_t> t;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t d = sizes[i] - c.sizes[i];
    const bool moves = tmpl ? static_cast<bool>(c.moving[i]) : d != 0;
    if (!moves && d != 0) return {};
    if (!moves) continue;
    if ((t && d != *t) || sizes[i] < 2 || c.sizes[i] < 2) return {};
    t = d;
  }
  if (!t || (*t == 0 && !tmpl)) return {};
  return {true, *t, !tmpl};
}

// The sizes of a class's plan `t` steps on, every size of 2 or more moving (the look-ahead).
std::vector<Shape> ShapesAhead(const std::vector<TensorDecl>& decls, const std::vector<Shape>& shapes, int64_t t) {
  std::vector<Shape> out = shapes;
  for (size_t i = 0; i < decls.size(); ++i)
    for (size_t k = 0; k < decls[i].dims.size(); ++k)
      if (!decls[i].dims[k].fixed() && out[i][k] >= 2) out[i][k] += t;
  return out;
}

// Whether the template's graph `t` steps on is `planned`, the graph planned from the model.
bool Agrees(const ShapeTemplate& tmpl, int64_t t, const Graph& planned) {
  auto predicted = tmpl.Instantiate(t);
  if (!predicted.ok()) return false;
  const FlatGraph a = Flatten(**predicted), b = Flatten(planned);
  return a.structure == b.structure && a.ints == b.ints;
}

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

TensorInfo InfoOf(const TensorDecl& d) {
  TensorInfo info{d.name, d.dtype, {}, {}, d.values_shape_plan, d.value_use};
  for (const DeclDim& dim : d.dims) {
    info.shape.push_back(dim.fixed() ? dim.value : -1);
    info.dim_params.push_back(dim.fixed() ? "" : dim.param);
  }
  return info;
}

TensorDecl DeclOf(const Value& v) {
  TensorDecl d{v.name(), v.dtype(), {}, false, ""};
  for (int64_t s : v.shape()) d.dims.push_back({s, ""});
  return d;
}

// The caller's view of the declarations.
void DescribeDecls(detail::ModelSource& s) {
  for (const TensorDecl& d : s.inputs) s.input_info.push_back(InfoOf(d));
  for (const TensorDecl& d : s.outputs) s.output_info.push_back(InfoOf(d));
}

std::shared_ptr<detail::ModelSource> SourceOf(std::shared_ptr<const OnnxModel> onnx) {
  auto s = std::make_shared<detail::ModelSource>();
  s->label = onnx->label();
  s->inputs = onnx->inputs();
  s->outputs = onnx->outputs();
  s->metadata = onnx->metadata();
  s->onnx = std::move(onnx);
  DescribeDecls(*s);
  return s;
}

}  // namespace

Result<Model> Model::FromOnnxFile(const std::string& path) {
  GF_ASSIGN_OR_RETURN(auto onnx, OnnxModel::FromFile(path));
  return Model(SourceOf(std::move(onnx)));
}

Result<Model> Model::FromOnnxBytes(std::string_view bytes, const std::string& name,
                                   const std::string& external_data_folder) {
  GF_ASSIGN_OR_RETURN(auto onnx, OnnxModel::FromBytes(std::string(bytes), name, external_data_folder));
  return Model(SourceOf(std::move(onnx)));
}

Result<Model> Model::FromGraph(std::unique_ptr<Graph> graph) {
  if (!graph) return InvalidArgument("Model::FromGraph: no graph");
  GF_RETURN_IF_ERROR(graph->Verify().WithContext(StrCat("graph '", graph->name(), "'")));
  auto s = std::make_shared<detail::ModelSource>();
  s->label = StrCat("graph '", graph->name(), "'");
  for (const Value* v : graph->inputs()) s->inputs.push_back(DeclOf(*v));
  for (const Value* v : graph->outputs()) s->outputs.push_back(DeclOf(*v));
  DescribeDecls(*s);
  s->graph = std::move(graph);
  return Model(std::move(s));
}

const std::vector<TensorInfo>& Model::inputs() const { return source_->input_info; }
const std::vector<TensorInfo>& Model::outputs() const { return source_->output_info; }
bool Model::is_static() const { return IsStaticSignature(source_->inputs); }
const ModelMetadata& Model::metadata() const { return source_->metadata; }

CompiledModel::~CompiledModel() = default;

Result<std::unique_ptr<CompiledModel>> CompiledModel::Compile(Model model, std::shared_ptr<const Target> target,
                                                              const CompileOptions& options) {
  if (!target) return InvalidArgument("CompiledModel::Compile: no target");
  if (!model.source_) return InvalidArgument("CompiledModel::Compile: the model was moved from");
  if (options.plan_cache_capacity < 1)
    return InvalidArgument("CompileOptions::plan_cache_capacity is ", options.plan_cache_capacity,
                           "; at least 1 plan must be kept");
  if (options.dtype != DType::kF32) {
    // The target as it computes in that dtype (or the error naming what it computes in).
    auto narrow = target->ForDtype(options.dtype);
    if (!narrow.ok()) return narrow.status().WithContext(StrCat("CompileOptions::dtype ", DTypeName(options.dtype)));
    target = std::shared_ptr<const Target>(std::move(*narrow));
  }
  std::unique_ptr<CompiledModel> m(new CompiledModel());
  m->source_ = std::move(model.source_);
  m->target_ = std::move(target);
  m->options_ = options;
  m->cache_ = std::make_unique<detail::PlanCache>();
  m->cache_->stats.capacity = options.plan_cache_capacity;
  if (IsStaticSignature(m->source_->inputs)) {
    // One plan serves every call: make it now, so that a model's errors surface at Compile.
    GF_ASSIGN_OR_RETURN(InputBinding b, BindShapes(m->source_->inputs, {}));
    GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> p, m->MakePlan(b));
    detail::PlanCache& c = *m->cache_;
    c.lru.push_front(p);
    c.index[p->signature()] = c.lru.begin();
    c.last = p;
    c.stats.plans_made = c.stats.size = 1;
    c.stats.planning_ms = p->planning_time().total_ms();
    m->static_plan_ = p;
  }
  return m;
}

Result<std::shared_ptr<const Plan>> CompiledModel::MakePlan(const InputBinding& binding) const {
  std::shared_ptr<Plan> p(new Plan());
  const std::string& label = source_->label;
  auto t = Clock::now();
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, source_->Instantiate(binding));
  // Every value the bound shapes give must fit in memory before anything is allocated for it.
  for (const auto& n : g->nodes())
    for (const Value* v : n->outputs())
      if (v)
        GF_RETURN_IF_ERROR(CheckFitsInMemory(StrCat(label, ": value '", v->name(), "' of ", n->Describe()), v->dtype(),
                                             v->shape()));
  if (target_->graph_dtype() != DType::kF32) {
    // The model in the dtype the target computes it in (CompileOptions::dtype).
    auto converted = ConvertPrecision(*g, target_->graph_dtype());
    if (!converted.ok()) return converted.status().WithContext(label);
    g = std::move(*converted);
  }
  p->planning_.import_ms = MsSince(t);

  t = Clock::now();
  PipelineOptions pipeline;
  pipeline.fusion = options_.fusion;
  pipeline.fusion_report = &p->report_;
  GF_RETURN_IF_ERROR(RunPipeline(*g, *target_, pipeline).status().WithContext(label));
  p->planning_.passes_ms = MsSince(t);
  GF_RETURN_IF_ERROR(FinishPlan(*p, std::move(g), binding));
  return std::shared_ptr<const Plan>(std::move(p));
}

Status CompiledModel::FinishPlan(Plan& plan, std::shared_ptr<Graph> g, const InputBinding& binding) const {
  Plan* p = &plan;
  p->graph_input_.clear();
  p->inputs_.clear();
  p->outputs_.clear();
  for (size_t i = 0; i < source_->inputs.size(); ++i) {
    int index = -1;
    for (size_t k = 0; k < g->inputs().size(); ++k)
      if (g->inputs()[k]->name() == source_->inputs[i].name) index = static_cast<int>(k);
    p->graph_input_.push_back(index);
    TensorInfo info = source_->input_info[i];
    info.shape = binding.shapes[i];
    info.dim_params.assign(info.shape.size(), "");
    p->inputs_.push_back(std::move(info));
  }
  for (const Value* v : g->outputs()) p->outputs_.push_back(InfoOf(DeclOf(*v)));
  p->signature_ = binding.key;

  const auto t = Clock::now();
  std::shared_ptr<const Graph> planned = std::move(g);
  p->graph_ = planned;
  GF_ASSIGN_OR_RETURN(p->executable_, target_->Compile(planned));
  p->kernel_choices_ = target_->DescribeKernels(*planned);
  p->planning_.compile_ms = MsSince(t);
  p->planning_.gemm_tuning_ms = p->executable_->stats().tuning_ms;
  return Status::Ok();
}

Result<std::shared_ptr<const Plan>> CompiledModel::PlanByClass(const InputBinding& binding,
                                                               std::vector<std::shared_ptr<const Plan>>* ahead) const {
  detail::PlanCache& c = *cache_;
  const std::vector<int64_t> sizes = options_.shape_classes ? SymbolicSizes(source_->inputs, binding)
                                                            : std::vector<int64_t>{};
  std::shared_ptr<detail::ShapeClass> cls;
  std::shared_ptr<const ShapeTemplate> verified;  // the class's template, once it is trusted
  ClassStep step;
  if (!sizes.empty()) {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto it = c.classes.begin(); it != c.classes.end(); ++it) {
      detail::ShapeClass& k = **it;
      step = StepOf(k, sizes);
      if (!step.member && k.guessed) {
        // The look-ahead moved sizes this call keeps: the class is refitted on this call.
        step = StepOf(k, sizes, /*use_template=*/false);
        if (step.member) {
          if (k.verified) --c.stats.shape_classes;
          k.tmpl = nullptr, k.verified = false, k.guessed = false;
          k.moving.clear();
        }
      }
      if (!step.member) continue;
      cls = *it;
      if (cls->verified) verified = cls->tmpl;
      c.classes.splice(c.classes.begin(), c.classes, it);
      break;
    }
  }
  if (verified) {
    // The class's template makes the plan: no import, no passes.
    std::shared_ptr<Plan> p(new Plan());
    const auto t = Clock::now();
    auto g = verified->Instantiate(step.t, target_->ReadsReferenceGraphs());
    if (g.ok()) {
      p->planning_.passes_ms = MsSince(t);
      p->report_ = cls->first->report_;  // `first` is set once, when the class is made
      p->from_template_ = true;
      if (Status st = FinishPlan(*p, std::move(*g), binding); st.ok()) {
        std::lock_guard<std::mutex> lock(c.mu);
        ++c.stats.plans_from_template;
        return std::shared_ptr<const Plan>(std::move(p));
      }
    }
    // A size the template cannot make (a dim below 0, a node whose inference refuses it): this
    // signature is planned from the model, and so are the class's next ones.
    std::lock_guard<std::mutex> lock(c.mu);
    if (!cls->refused) --c.stats.shape_classes;
    cls->refused = true;
    cls->verified = false;
  }
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> p, MakePlan(binding));
  if (sizes.empty()) return p;
  if (!cls) {
    auto fresh = std::make_shared<detail::ShapeClass>();
    fresh->sizes = sizes;
    fresh->first = p;
    LookAhead(*fresh, binding, ahead);
    std::lock_guard<std::mutex> lock(c.mu);
    if (fresh->verified) ++c.stats.shape_classes;
    c.classes.push_front(std::move(fresh));
    if (c.classes.size() > kMaxClasses) {
      if (c.classes.back()->verified && !c.classes.back()->refused) --c.stats.shape_classes;
      c.classes.pop_back();
    }
    return p;
  }
  std::lock_guard<std::mutex> lock(c.mu);
  if (step.fit && !cls->tmpl && !cls->refused) {
    // The second plan of the class: which sizes move, and by how much per step.
    auto tmpl = ShapeTemplate::Fit(cls->first->graph_, *p->graph_, step.t);
    if (!tmpl.ok()) {
      cls->refused = true;
    } else {
      cls->tmpl = std::make_shared<const ShapeTemplate>(std::move(*tmpl));
      cls->moving.resize(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) cls->moving[i] = sizes[i] != cls->sizes[i];
    }
  } else if (cls->tmpl && !cls->verified && !cls->refused && step.t != 0) {
    // The third: the template's graph must be the one planned from the model.
    cls->verified = Agrees(*cls->tmpl, step.t, *p->graph_);
    cls->refused = !cls->verified;
    if (cls->verified) ++c.stats.shape_classes;
  }
  return p;
}

void CompiledModel::LookAhead(detail::ShapeClass& cls, const InputBinding& binding,
                              std::vector<std::shared_ptr<const Plan>>* ahead) const {
  // Plans one and two steps on, every size of 2 or more moving (a decode step: past and total
  // lengths; a prompt: its length): the first fits the template, the second checks it. Sizes
  // the model cannot take (a length past a table's end, say) leave the class as it was.
  if (std::none_of(cls.sizes.begin(), cls.sizes.end(), [](int64_t v) { return v >= 2; })) return;  // none moves
  std::shared_ptr<const Plan> next[2];
  for (int64_t t = 1; t <= 2; ++t) {
    const std::vector<Shape> shapes = ShapesAhead(source_->inputs, binding.shapes, t);
    std::vector<TensorView> views;
    for (size_t i = 0; i < shapes.size(); ++i) views.emplace_back(source_->inputs[i].dtype, shapes[i], nullptr);
    auto b = BindInputs(source_->inputs, views);  // shapes only: no input of a class gives values
    if (!b.ok()) return;
    auto p = MakePlan(*b);
    if (!p.ok()) return;
    next[t - 1] = std::move(*p);
  }
  auto tmpl = ShapeTemplate::Fit(cls.first->graph_, *next[0]->graph_, 1);
  if (!tmpl.ok()) return;
  auto shared = std::make_shared<const ShapeTemplate>(std::move(*tmpl));
  if (!Agrees(*shared, 2, *next[1]->graph_)) return;
  cls.tmpl = std::move(shared);
  cls.moving.resize(cls.sizes.size());
  for (size_t i = 0; i < cls.sizes.size(); ++i) cls.moving[i] = cls.sizes[i] >= 2;  // as ShapesAhead moved them
  cls.verified = cls.guessed = true;
  ahead->push_back(std::move(next[0]));
  ahead->push_back(std::move(next[1]));
}

const std::vector<TensorInfo>& CompiledModel::inputs() const { return source_->input_info; }
const std::vector<TensorInfo>& CompiledModel::outputs() const { return source_->output_info; }
const ModelMetadata& CompiledModel::metadata() const { return source_->metadata; }

Result<std::shared_ptr<const Plan>> CompiledModel::PlanFor(std::span<const TensorView> inputs) const {
  auto bound = BindInputs(source_->inputs, inputs);
  if (!bound.ok()) return bound.status().WithContext(source_->label);
  InputBinding b = std::move(bound).value();
  detail::PlanCache& c = *cache_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.index.find(b.key); it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.stats.hits;
      c.stats.last_planning_ms = 0;
      c.last = *it->second;
      return c.last;
    }
  }
  // Planned without the lock: other signatures keep running meanwhile. Two threads that meet
  // one new signature at once both plan it, and the first plan stored is the one kept.
  std::vector<std::shared_ptr<const Plan>> ahead;
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> p, PlanByClass(b, &ahead));
  double ms = p->planning_time().total_ms();
  for (const auto& a : ahead) ms += a->planning_time().total_ms();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.stats.plans_made;
    c.stats.plans_ahead += static_cast<int64_t>(ahead.size());
    c.stats.planning_ms += ms;
    c.stats.last_planning_ms = ms;
  }
  p = CachePlan(std::move(p));
  for (auto& a : ahead) CachePlan(std::move(a), /*ahead=*/true);
  return p;
}

std::shared_ptr<const Plan> CompiledModel::CachePlan(std::shared_ptr<const Plan> p, bool ahead) const {
  detail::PlanCache& c = *cache_;
  std::vector<std::shared_ptr<const Plan>> dropped;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.index.find(p->signature()); it != c.index.end()) {
    if (!ahead) c.last = *it->second;
    return *it->second;
  }
  if (ahead) {
    // Least recently used, and only where there is room: a plan no call asked for yet pushes
    // out no plan a call has used.
    if (static_cast<int>(c.lru.size()) >= options_.plan_cache_capacity) return p;
    c.lru.push_back(p);
    c.index[p->signature()] = std::prev(c.lru.end());
    c.stats.size = static_cast<int64_t>(c.lru.size());
    return p;
  }
  c.lru.push_front(p);
  c.index[p->signature()] = c.lru.begin();
  while (static_cast<int>(c.lru.size()) > options_.plan_cache_capacity) {
    c.index.erase(c.lru.back()->signature());
    dropped.push_back(std::move(c.lru.back()));
    c.lru.pop_back();
    ++c.stats.evictions;
  }
  c.stats.size = static_cast<int64_t>(c.lru.size());
  c.last = p;
  return p;
}

bool Plan::takes_strided(bool output, size_t index) const {
  if (output) return index < outputs_.size() && executable_->TakesStrided(true, index);
  return index < graph_input_.size() && graph_input_[index] >= 0 &&
         executable_->TakesStrided(false, static_cast<size_t>(graph_input_[index]));
}

std::shared_ptr<const Plan> CompiledModel::plan() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  return cache_->last;
}

PlanCacheStats CompiledModel::cache_stats() const {
  PlanCacheStats s;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    s = cache_->stats;
  }
  if (source_->onnx && source_->onnx->prepared_store()) {
    const PreparedStoreStats p = source_->onnx->prepared_store()->stats();
    s.prepared_entries = p.entries;
    s.prepared_bytes = p.bytes;
  }
  return s;
}

Status CompiledModel::Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                          TraceRecorder* trace) const {
  // The clock is read only for a trace: untraced calls stay as they were.
  if (static_plan_) return RunTraced(*static_plan_, inputs, outputs, trace ? SteadyClockNs() : 0, false, trace);
  const int64_t start_ns = trace ? SteadyClockNs() : 0;
  bool planned = false;
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> p, PlanForTraced(inputs, trace ? &planned : nullptr));
  return RunTraced(*p, inputs, outputs, start_ns, planned, trace);
}

Result<std::shared_ptr<const Plan>> CompiledModel::PlanForTraced(std::span<const TensorView> inputs,
                                                                 bool* planned) const {
  if (!planned) return PlanFor(inputs);
  // Whether this call made its plan: plans made moved on (another thread's call may move it too;
  // the trace then shows this call as planning).
  const int64_t made = cache_stats().plans_made;
  Result<std::shared_ptr<const Plan>> p = PlanFor(inputs);
  *planned = cache_stats().plans_made != made;
  return p;
}

Status CompiledModel::RunTraced(const Plan& plan, std::span<const TensorView> inputs,
                                std::span<const TensorView> outputs, int64_t start_ns, bool planned,
                                TraceRecorder* trace) const {
  if (!trace) return RunPlan(plan, inputs, outputs);
  const int64_t run_start_ns = SteadyClockNs();
  StepLog log;
  const Status st = RunPlan(plan, inputs, outputs, &log);
  TracedRun r;
  r.graph = &plan.graph();
  r.report = &plan.report();
  r.kernel_choices = &plan.kernel_choices();
  r.signature = plan.signature();
  r.target = std::string(target_->name());
  r.start_ns = start_ns;
  r.run_start_ns = run_start_ns;
  r.end_ns = SteadyClockNs();
  r.planned = planned;
  r.from_template = plan.from_template();
  r.kernels = plan.launches_per_run();
  r.ok = st.ok();
  r.steps = &log.steps;
  trace->Record(r);
  return st;
}

Status CompiledModel::RunPlan(const Plan& plan, std::span<const TensorView> inputs,
                              std::span<const TensorView> outputs, RunProfiler* profiler,
                              const NodeObserver* observer) const {
  const Plan* p = &plan;
  if (inputs.size() != p->inputs().size())
    return InvalidArgument(source_->label, ": the model takes ", p->inputs().size(), " inputs, ", inputs.size(),
                           " were given");
  if (outputs.size() != p->outputs().size())
    return InvalidArgument(source_->label, ": the model gives ", p->outputs().size(), " outputs, ", outputs.size(),
                           " were given to fill");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorInfo& o = p->outputs()[i];
    if (outputs[i].dtype != o.dtype || outputs[i].shape != o.shape)
      return InvalidArgument(source_->label, ": output '", o.name, "' is ", DTypeName(o.dtype), ShapeToString(o.shape),
                             " for these inputs, but the tensor given for it is ", DTypeName(outputs[i].dtype),
                             ShapeToString(outputs[i].shape));
  }
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) {
    const TensorView& v = i < inputs.size() ? inputs[i] : outputs[i - inputs.size()];
    if (!v.strides.empty() && v.strides.size() != v.shape.size())
      return InvalidArgument(source_->label, ": ", i < inputs.size() ? "input '" : "output '",
                             i < inputs.size() ? p->inputs()[i].name : p->outputs()[i - inputs.size()].name,
                             "' is a view of ", ShapeToString(v.shape), " with ", v.strides.size(), " strides");
  }
  std::vector<TensorView> graph_inputs(p->graph().inputs().size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (p->graph_input_[i] >= 0) graph_inputs[static_cast<size_t>(p->graph_input_[i])] = inputs[i];
  // Strided views the executable does not take in place: inputs gathered into contiguous
  // copies, outputs run into contiguous buffers and scattered after. Contiguous calls pay a
  // check per view.
  std::vector<Tensor> copies;
  std::vector<TensorView> run_outputs;
  for (size_t i = 0; i < graph_inputs.size(); ++i) {
    if (graph_inputs[i].contiguous() || p->executable_->TakesStrided(false, i)) continue;
    GF_ASSIGN_OR_RETURN(Tensor c, Tensor::Empty(graph_inputs[i].dtype, graph_inputs[i].shape));
    GF_RETURN_IF_ERROR(CopyView(graph_inputs[i], c.view()));
    graph_inputs[i] = c.view();
    copies.push_back(std::move(c));
  }
  std::vector<std::pair<size_t, Tensor>> scatter;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].contiguous() || p->executable_->TakesStrided(true, i)) continue;
    if (run_outputs.empty()) run_outputs.assign(outputs.begin(), outputs.end());
    GF_ASSIGN_OR_RETURN(Tensor c, Tensor::Empty(outputs[i].dtype, outputs[i].shape));
    run_outputs[i] = c.view();
    scatter.emplace_back(i, std::move(c));
  }
  std::span<const TensorView> run_out = run_outputs.empty() ? outputs : run_outputs;
  GF_RETURN_IF_ERROR(observer   ? p->executable_->RunObserved(graph_inputs, run_out, *observer)
                     : profiler ? p->executable_->RunProfiled(graph_inputs, run_out, *profiler)
                                : p->executable_->Run(graph_inputs, run_out));
  for (const auto& [i, c] : scatter) GF_RETURN_IF_ERROR(CopyView(c.view(), outputs[i]));
  return Status::Ok();
}

Status CompiledModel::RunObserved(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                                  const NodeObserver& observer) const {
  std::shared_ptr<const Plan> p = static_plan_;
  if (!p) {
    GF_ASSIGN_OR_RETURN(p, PlanFor(inputs));
  }
  return RunPlan(*p, inputs, outputs, nullptr, &observer);
}

Result<std::vector<Tensor>> CompiledModel::Run(std::span<const TensorView> inputs, TraceRecorder* trace) const {
  const int64_t start_ns = trace ? SteadyClockNs() : 0;
  bool planned = false;
  std::shared_ptr<const Plan> p = static_plan_;
  if (!p) {
    GF_ASSIGN_OR_RETURN(p, PlanForTraced(inputs, trace ? &planned : nullptr));
  }
  std::vector<Tensor> out;
  std::vector<TensorView> views;
  for (const TensorInfo& o : p->outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(o.dtype, o.shape));
    out.push_back(std::move(t));
    views.push_back(out.back().view());
  }
  GF_RETURN_IF_ERROR(RunTraced(*p, inputs, views, start_ns, planned, trace));
  return out;
}

}  // namespace graphfuse

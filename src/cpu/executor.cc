// Compiling a graph into steps and buffers, and running them.
//
// Intermediate values share one arena planned by liveness (src/memory/memory_plan.h): a view op
// (Reshape, Squeeze, ...) shares its input's memory, a block is reused once nothing later reads
// it. Graph outputs are written straight into the caller's buffers unless they alias an input,
// a constant or another output, in which case they live in the arena and are copied at the end.
#include "cpu/executor.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <map>

#include "cpu/lower_group.h"
#include "ir/op_registry.h"
#include "memory/memory_plan.h"
#include "cpu/kernel_registry.h"
#include "cpu/kernels/gemm_tuning.h"

namespace graphfuse {

struct ExecutionPlan::Ref {
  enum Kind { kNone, kInput, kOutput, kConst, kArena } kind = kNone;
  int index = 0;               // kInput, kOutput: which graph input / output
  int64_t offset = 0;          // kArena
  const void* data = nullptr;  // kConst
};

struct ExecutionPlan::Step {
  const Node* node = nullptr;
  const CpuKernel* kernel = nullptr;
  std::vector<Ref> in_refs, out_refs;
  std::vector<TensorView> in_views, out_views;  // types fixed at compile time, data set per run
  bool has_program = false;                     // elementwise: a prepared one-instruction program
  cpu::TileProgram program;
  std::optional<cpu::TileRunner> runner;        // `program` planned, reused while its pointers hold
  std::shared_ptr<const void> state;            // the kernel's prepare result, if any
  bool io_strides = false;  // takes a graph input or output as a strided view (TakesStrided)
};

ExecutionPlan::~ExecutionPlan() = default;

namespace {

Status RunKernel(const Node& n, const CpuKernel* k, std::span<const TensorView> in, std::span<const TensorView> out,
                 const CpuContext& ctx, const void* state = nullptr) {
  if (!k) return Internal(n.Describe(), ": no kernel");
  // Nothing to compute when every output is empty; a kernel could still loop over the other
  // dims of an empty input (Split of [2^40, 0] along axis 1 walked 2^40 empty rows).
  bool all_empty = !out.empty();
  for (const TensorView& o : out) all_empty &= o.numel() == 0;
  if (all_empty) return Status::Ok();
  Status st = k->run(KernelContext{n, in, out, ctx, state});
  return st.ok() ? st : st.WithContext(n.Describe());
}

}  // namespace

Result<std::unique_ptr<ExecutionPlan>> ExecutionPlan::Compile(const Graph& g, const PrepareOptions& prepare) {
  PrepareOptions options = prepare;
  if (!options.store) options.store = g.prepared_store();
  std::unique_ptr<ExecutionPlan> plan(new ExecutionPlan());
  plan->graph_ = &g;
  const kernels::GemmTuningTotals tuned_before = kernels::GemmTuningSoFar();

  // A graph output computed by a node (listed once) is written into the caller's buffer.
  std::map<const Value*, int> direct_output;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* o = g.outputs()[i];
    if (o->producer() && std::count(g.outputs().begin(), g.outputs().end(), o) == 1 &&
        !FindSchema(o->producer()->op())->view)
      direct_output[o] = static_cast<int>(i);
  }

  // Steps, in node order; errors name the first node at fault.
  plan->steps_.reserve(g.num_nodes());
  for (const auto& node : g.nodes()) {
    const Node& n = *node;
    const OpSchema* s = FindSchema(n.op());
    if (!s) return Unimplemented(n.Describe(), ": op not supported");
    if (s->view) {
      if (!n.input(0)) return InvalidArgument(n.Describe(), ": missing input");
      continue;
    }
    Step step;
    step.node = &n;
    step.kernel = FindCpuKernel(n.op());
    for (const Value* in : n.inputs())
      step.in_views.push_back(in ? TensorView{in->dtype(), in->shape(), nullptr} : TensorView{});
    for (const Value* o : n.outputs()) step.out_views.push_back(TensorView{o->dtype(), o->shape(), nullptr});
    if (s->elementwise) {
      const OpKind kind = *OpFromName(n.op());
      step.program = cpu::SingleOpProgram(kind, step.in_views, step.out_views[0], ElementwiseAttrs(kind, n.attrs()));
      step.has_program = true;
    } else if (const Graph* body = n.GetGraph("body"); body && n.is(op::FusedElementwise)) {
      auto program = cpu::LowerElementwiseGroup(*body);
      if (!program.ok()) return program.status().WithContext(n.Describe());
      step.program = *program;
      step.has_program = true;
    } else if (!step.kernel) {
      return Unimplemented(n.Describe(), ": has no kernel and was not folded (is an input non-constant?)");
    }
    if (step.kernel && step.kernel->prepare) {
      auto prepared = step.kernel->prepare(n, options);
      if (!prepared.ok()) return prepared.status().WithContext(n.Describe());
      step.state = std::move(*prepared);
    }
    plan->steps_.push_back(std::move(step));
  }

  // Intermediate values (and outputs that need a copy) share one arena by liveness.
  MemoryPlanOptions mo;
  mo.alignment = static_cast<int64_t>(kTensorAlignment);
  mo.in_arena = [&](const Value& v) { return !direct_output.count(&v); };
  GF_ASSIGN_OR_RETURN(MemoryPlan memory, PlanMemory(g, mo));

  // Where each value is, in node order (a view is wherever its input is).
  std::map<const Value*, Ref> ref_of;
  for (size_t i = 0; i < g.inputs().size(); ++i) ref_of[g.inputs()[i]] = {Ref::kInput, static_cast<int>(i)};
  for (const Value* c : g.constants()) ref_of[c] = {Ref::kConst, 0, 0, c->constant()->data()};
  for (const auto& n : g.nodes()) {
    const bool view = FindSchema(n->op())->view;
    for (size_t k = 0; k < n->outputs().size(); ++k) {
      const Value* o = n->output(k);
      if (view && k == 0) {
        ref_of[o] = ref_of.at(n->input(0));
      } else if (auto d = direct_output.find(o); d != direct_output.end()) {
        ref_of[o] = {Ref::kOutput, d->second};
      } else {
        ref_of[o] = {Ref::kArena, 0, memory.Find(o).offset};
      }
    }
  }
  for (Step& step : plan->steps_) {
    for (const Value* in : step.node->inputs()) step.in_refs.push_back(in ? ref_of.at(in) : Ref{});
    for (const Value* o : step.node->outputs()) step.out_refs.push_back(ref_of.at(o));
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* o = g.outputs()[i];
    plan->output_refs_.push_back(ref_of.at(o));
    if (!direct_output.count(o)) plan->output_copies_.push_back({static_cast<int>(i), static_cast<int>(i)});
  }
  // Graph inputs and outputs that may be strided views (a KV cache kept in place).
  auto takes = [&](const Node* n, int slot, bool output) {
    const CpuKernel* k = n ? FindCpuKernel(n->op()) : nullptr;
    const uint32_t bits = k ? (output ? k->strided_outputs : k->strided_inputs) : 0;
    return slot < 32 && (bits >> slot & 1u);
  };
  for (const Value* in : g.inputs()) {
    bool ok = !in->uses().empty() && std::count(g.outputs().begin(), g.outputs().end(), in) == 0;
    for (const Use& u : in->uses()) ok = ok && takes(u.node, u.input_index, false);
    plan->strided_inputs_.push_back(ok);
  }
  for (const Value* o : g.outputs())
    plan->strided_outputs_.push_back(direct_output.count(o) && o->uses().empty() &&
                                     takes(o->producer(), o->producer_output(), true));
  for (Step& step : plan->steps_) {
    for (size_t k = 0; k < step.in_refs.size(); ++k)
      step.io_strides |= step.in_refs[k].kind == Ref::kInput && plan->TakesStrided(false, step.in_refs[k].index);
    for (size_t k = 0; k < step.out_refs.size(); ++k)
      step.io_strides |= step.out_refs[k].kind == Ref::kOutput && plan->TakesStrided(true, step.out_refs[k].index);
  }
  plan->arena_bytes_ = std::max<int64_t>(memory.arena_bytes, 1);
  plan->stats_.kernels_launched = static_cast<int64_t>(plan->steps_.size());
  plan->stats_.peak_activation_bytes = memory.peak_bytes;
  // Without reuse, every value a node writes would have a buffer of its own, outputs included.
  plan->stats_.activation_bytes_no_reuse = memory.no_reuse_bytes + memory.external_bytes;
  const kernels::GemmTuningTotals tuned = kernels::GemmTuningSoFar();
  plan->stats_.gemm_classes_timed = tuned.timed - tuned_before.timed;
  plan->stats_.gemm_tuning_ms = tuned.ms - tuned_before.ms;
  return plan;
}

Result<void*> ExecutionPlan::GrowArena(Tensor& arena, int64_t bytes) {
  if (arena.nbytes() < static_cast<size_t>(bytes)) {
    GF_ASSIGN_OR_RETURN(arena, Tensor::Empty(DType::kBool, {bytes}));
    std::memset(arena.data(), 0, arena.nbytes());
  }
  return arena.data();
}

void* ExecutionPlan::Resolve(const Ref& r, std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                             char* arena) const {
  switch (r.kind) {
    case Ref::kNone: return nullptr;
    case Ref::kInput: return inputs[r.index].data;
    case Ref::kOutput: return outputs[r.index].data;
    case Ref::kConst: return const_cast<void*>(r.data);
    case Ref::kArena: return arena + r.offset;
  }
  return nullptr;
}

Status ExecutionPlan::CheckIO(std::span<const TensorView> inputs, std::span<const TensorView> outputs) const {
  const Graph& g = *graph_;
  if (inputs.size() != g.inputs().size())
    return InvalidArgument("graph '", g.name(), "' takes ", g.inputs().size(), " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs()[i];
    if (inputs[i].dtype != v->dtype() || inputs[i].shape != v->shape())
      return InvalidArgument("graph input ", i, " '", v->name(), "' is ", v->TypeString(), ", got ",
                             DTypeName(inputs[i].dtype), ShapeToString(inputs[i].shape));
    if (inputs[i].data == nullptr && v->numel() > 0)
      return InvalidArgument("graph input ", i, " '", v->name(), "' has no data");
    if (!inputs[i].contiguous() && !TakesStrided(false, i))
      return InvalidArgument("graph input ", i, " '", v->name(), "' is a strided view; the plan reads it only "
                             "contiguous");
  }
  if (outputs.size() != g.outputs().size())
    return InvalidArgument("graph '", g.name(), "' has ", g.outputs().size(), " outputs, got ", outputs.size(), " buffers");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Value* v = g.outputs()[i];
    if (outputs[i].dtype != v->dtype() || outputs[i].shape != v->shape() || (!outputs[i].data && v->numel() > 0))
      return InvalidArgument("graph output ", i, " '", v->name(), "' is ", v->TypeString(), ", got a buffer of ",
                             DTypeName(outputs[i].dtype), ShapeToString(outputs[i].shape));
    if (!outputs[i].contiguous() && !TakesStrided(true, i))
      return InvalidArgument("graph output ", i, " '", v->name(), "' is given a strided view; the plan writes it "
                             "only contiguous");
  }
  return Status::Ok();
}

Status ExecutionPlan::Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                          const CpuContext& ctx, const StepObserver* observer, void* arena, RunProfiler* profiler) {
  GF_RETURN_IF_ERROR(CheckIO(inputs, outputs));
  if (!arena) {
    GF_ASSIGN_OR_RETURN(arena, GrowArena(arena_, arena_bytes_));
  }
  char* const base = static_cast<char*>(arena);
  auto report = [profiler](const Step& s, int64_t start_ns) {
    StepTiming t;
    t.node = s.node;
    t.label = s.node->name();
    t.start_ns = start_ns;
    t.duration_ns = SteadyClockNs() - start_ns;
    profiler->OnStep(t);
  };
  for (Step& s : steps_) {
    const int64_t start_ns = profiler ? SteadyClockNs() : 0;
    if (s.has_program) {
      for (size_t k = 0; k < s.in_refs.size(); ++k) s.program.inputs[k].data = Resolve(s.in_refs[k], inputs, outputs, base);
      for (size_t k = 0; k < s.out_refs.size(); ++k) s.program.outputs[k].data = Resolve(s.out_refs[k], inputs, outputs, base);
      // Planning a launch (layout, in-place checks) costs about as much as a 1K-element add:
      // it is done again only when a buffer moved (graph inputs / outputs given per run).
      if (!s.runner || !s.runner->BoundTo(s.program, ctx.codegen)) s.runner.emplace(s.program, ctx.codegen);
      s.runner->Launch(ctx);
      if (profiler) report(s, start_ns);
      if (!observer) continue;
    }
    for (size_t k = 0; k < s.in_refs.size(); ++k) s.in_views[k].data = Resolve(s.in_refs[k], inputs, outputs, base);
    for (size_t k = 0; k < s.out_refs.size(); ++k) s.out_views[k].data = Resolve(s.out_refs[k], inputs, outputs, base);
    if (s.io_strides) {  // graph inputs / outputs it takes strided: their views' strides, this run's
      for (size_t k = 0; k < s.in_refs.size(); ++k)
        if (s.in_refs[k].kind == Ref::kInput) s.in_views[k].strides = inputs[s.in_refs[k].index].strides;
      for (size_t k = 0; k < s.out_refs.size(); ++k)
        if (s.out_refs[k].kind == Ref::kOutput) s.out_views[k].strides = outputs[s.out_refs[k].index].strides;
    }
    if (!s.has_program) {
      GF_RETURN_IF_ERROR(RunKernel(*s.node, s.kernel, s.in_views, s.out_views, ctx, s.state.get()));
      if (profiler) report(s, start_ns);
    }
    if (observer) GF_RETURN_IF_ERROR((*observer)(*s.node, s.in_views, s.out_views));
  }
  for (const auto& [out, ref] : output_copies_) {
    const void* src = Resolve(output_refs_[ref], inputs, outputs, base);
    const size_t bytes = static_cast<size_t>(outputs[out].numel()) * DTypeSize(outputs[out].dtype);
    if (bytes) std::memmove(outputs[out].data, src, bytes);
  }
  return Status::Ok();
}

Result<std::vector<Tensor>> ExecutionPlan::Run(std::span<const TensorView> inputs, const CpuContext& ctx) {
  std::vector<Tensor> out;
  std::vector<TensorView> views;
  for (const Value* o : graph_->outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(o->dtype(), o->shape()));
    out.push_back(std::move(t));
  }
  for (const Tensor& t : out) views.push_back(t.view());
  GF_RETURN_IF_ERROR(Run(inputs, views, ctx));
  return out;
}

Result<std::vector<Tensor>> Execute(const Graph& g, std::span<const TensorView> inputs, const CpuContext& ctx,
                                    ExecStats* stats) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionPlan> plan, ExecutionPlan::Compile(g));
  auto out = plan->Run(inputs, ctx);
  if (stats) *stats = plan->stats();
  return out;
}

Status RunNodeOnce(const Node& n, std::span<const TensorView> in, std::span<const TensorView> out,
                   const CpuContext& ctx) {
  if (!FindSchema(n.op())) return Unimplemented(n.Describe(), ": op not supported");
  return RunKernel(n, FindCpuKernel(n.op()), in, out, ctx);
}

}  // namespace graphfuse

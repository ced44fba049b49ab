// Compiling a graph into steps and buffers, and running them.
//
// Planning walks the nodes once: every intermediate value gets a slot; a view op (Reshape,
// Squeeze, ...) shares its input's memory; a slot returns to a free list after the last node
// that reads any value in it, and later values take the smallest free slot that fits. Graph
// outputs are written straight into the caller's buffers unless they alias an input, a
// constant or another output, in which case they are copied at the end.
#include "executor.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <map>

#include "../cpu/lower_group.h"
#include "../ir/op_registry.h"
#include "kernel_registry.h"

namespace graphfuse {

struct ExecutionPlan::Ref {
  enum Kind { kNone, kInput, kOutput, kConst, kSlot } kind = kNone;
  int index = 0;
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

Result<std::unique_ptr<ExecutionPlan>> ExecutionPlan::Compile(const Graph& g) {
  std::unique_ptr<ExecutionPlan> plan(new ExecutionPlan());
  plan->graph_ = &g;
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());

  std::map<const Value*, Ref> ref_of;
  for (size_t i = 0; i < g.inputs().size(); ++i) ref_of[g.inputs()[i]] = {Ref::kInput, static_cast<int>(i), nullptr};
  for (const Value* c : g.constants()) ref_of[c] = {Ref::kConst, 0, c->constant()->data()};
  // A graph output computed by a node (listed once) is written into the caller's buffer.
  std::map<const Value*, int> direct_output;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* o = g.outputs()[i];
    if (o->producer() && std::count(g.outputs().begin(), g.outputs().end(), o) == 1 &&
        !FindSchema(o->producer()->op())->view)
      direct_output[o] = static_cast<int>(i);
  }
  std::map<const Value*, int> last_use;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value* in : nodes[i]->inputs())
      if (in) last_use[in] = static_cast<int>(i);
  for (const Value* o : g.outputs()) last_use[o] = static_cast<int>(nodes.size());

  struct Slot {
    int64_t bytes;
    int last_use;
  };
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  int64_t no_reuse = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    const OpSchema* s = FindSchema(n.op());
    if (!s) return Unimplemented(n.Describe(), ": op not supported");
    for (size_t k = 0; k < n.outputs().size(); ++k) {
      const Value* o = n.output(k);
      const int lu = last_use.count(o) ? last_use.at(o) : static_cast<int>(i);
      if (s->view && k == 0) {
        if (!n.input(0)) return InvalidArgument(n.Describe(), ": missing input");
        const Ref r = ref_of.at(n.input(0));
        ref_of[o] = r;
        if (r.kind == Ref::kSlot) slots[r.index].last_use = std::max(slots[r.index].last_use, lu);
        continue;
      }
      const int64_t bytes = o->numel() * static_cast<int64_t>(DTypeSize(o->dtype()));
      no_reuse += bytes;
      if (direct_output.count(o)) {
        ref_of[o] = {Ref::kOutput, direct_output.at(o), nullptr};
        continue;
      }
      int best = -1;
      for (int f : free_slots)
        if (slots[f].bytes >= bytes && (best < 0 || slots[f].bytes < slots[best].bytes)) best = f;
      if (best < 0) {
        best = static_cast<int>(slots.size());
        slots.push_back({bytes, lu});
      } else {
        free_slots.erase(std::find(free_slots.begin(), free_slots.end(), best));
        slots[best].last_use = lu;
      }
      ref_of[o] = {Ref::kSlot, best, nullptr};
    }
    for (size_t si = 0; si < slots.size(); ++si)
      if (slots[si].last_use == static_cast<int>(i) &&
          std::find(free_slots.begin(), free_slots.end(), static_cast<int>(si)) == free_slots.end())
        free_slots.push_back(static_cast<int>(si));

    if (s->view) continue;
    Step step;
    step.node = &n;
    step.kernel = FindCpuKernel(n.op());
    for (const Value* in : n.inputs()) {
      step.in_refs.push_back(in ? ref_of.at(in) : Ref{});
      step.in_views.push_back(in ? TensorView{in->dtype(), in->shape(), nullptr} : TensorView{DType::kF32, {}, nullptr});
    }
    for (const Value* o : n.outputs()) {
      step.out_refs.push_back(ref_of.at(o));
      step.out_views.push_back(TensorView{o->dtype(), o->shape(), nullptr});
    }
    if (s->elementwise) {
      const OpKind kind = *OpFromName(n.op());
      step.program = cpu::SingleOpProgram(kind, step.in_views, step.out_views[0], ElementwiseAttrs(kind, n.attrs()));
      step.has_program = true;
    } else if (const Graph* body = n.GetGraph("body"); body && n.op() == "FusedElementwise") {
      auto program = cpu::LowerElementwiseGroup(*body);
      if (!program.ok()) return program.status().WithContext(n.Describe());
      step.program = *program;
      step.has_program = true;
    } else if (!step.kernel) {
      return Unimplemented(n.Describe(), ": has no kernel and was not folded (is an input non-constant?)");
    }
    if (step.kernel && step.kernel->prepare) {
      auto prepared = step.kernel->prepare(n);
      if (!prepared.ok()) return prepared.status().WithContext(n.Describe());
      step.state = std::move(*prepared);
    }
    plan->steps_.push_back(std::move(step));
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* o = g.outputs()[i];
    plan->output_refs_.push_back(ref_of.at(o));
    if (!direct_output.count(o)) plan->output_copies_.push_back({static_cast<int>(i), static_cast<int>(i)});
  }
  int64_t peak = 0;
  for (const Slot& s : slots) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kBool, {std::max<int64_t>(s.bytes, 1)}));
    std::memset(t.data(), 0, t.nbytes());  // touch every page now, not during the first run
    peak += s.bytes;
    plan->arena_.push_back(std::move(t));
  }
  plan->stats_.kernels_launched = static_cast<int64_t>(plan->steps_.size());
  plan->stats_.peak_activation_bytes = peak;
  plan->stats_.activation_bytes_no_reuse = no_reuse;
  return plan;
}

void* ExecutionPlan::Resolve(const Ref& r, std::span<const TensorView> inputs,
                             std::span<const TensorView> outputs) const {
  switch (r.kind) {
    case Ref::kNone: return nullptr;
    case Ref::kInput: return inputs[r.index].data;
    case Ref::kOutput: return outputs[r.index].data;
    case Ref::kConst: return const_cast<void*>(r.data);
    case Ref::kSlot: return const_cast<void*>(arena_[r.index].data());
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
  }
  if (outputs.size() != g.outputs().size())
    return InvalidArgument("graph '", g.name(), "' has ", g.outputs().size(), " outputs, got ", outputs.size(), " buffers");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Value* v = g.outputs()[i];
    if (outputs[i].dtype != v->dtype() || outputs[i].shape != v->shape() || (!outputs[i].data && v->numel() > 0))
      return InvalidArgument("graph output ", i, " '", v->name(), "' is ", v->TypeString(), ", got a buffer of ",
                             DTypeName(outputs[i].dtype), ShapeToString(outputs[i].shape));
  }
  return Status::Ok();
}

Status ExecutionPlan::Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                          const CpuContext& ctx, const StepObserver* observer) {
  GF_RETURN_IF_ERROR(CheckIO(inputs, outputs));
  for (Step& s : steps_) {
    if (s.has_program) {
      for (size_t k = 0; k < s.in_refs.size(); ++k) s.program.inputs[k].data = Resolve(s.in_refs[k], inputs, outputs);
      for (size_t k = 0; k < s.out_refs.size(); ++k) s.program.outputs[k].data = Resolve(s.out_refs[k], inputs, outputs);
      // Planning a launch (layout, in-place checks) costs about as much as a 1K-element add:
      // it is done again only when a buffer moved (graph inputs / outputs given per run).
      if (!s.runner || !s.runner->BoundTo(s.program, ctx.codegen)) s.runner.emplace(s.program, ctx.codegen);
      s.runner->Launch(ctx);
      if (!observer) continue;
    }
    for (size_t k = 0; k < s.in_refs.size(); ++k) s.in_views[k].data = Resolve(s.in_refs[k], inputs, outputs);
    for (size_t k = 0; k < s.out_refs.size(); ++k) s.out_views[k].data = Resolve(s.out_refs[k], inputs, outputs);
    if (!s.has_program) GF_RETURN_IF_ERROR(RunKernel(*s.node, s.kernel, s.in_views, s.out_views, ctx, s.state.get()));
    if (observer) GF_RETURN_IF_ERROR((*observer)(*s.node, s.in_views, s.out_views));
  }
  for (const auto& [out, ref] : output_copies_) {
    const void* src = Resolve(output_refs_[ref], inputs, outputs);
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

// CanonicalizeViews: moves the views exporters put between a GEMM and its readers out of the
// way of fusion, and turns slices of a packed projection into projections of their own.
//
//   %a2 = Reshape(%x, [-1, K])              (transformers' Conv1D: view, addmm, view)
//   %p  = MatMul(%a2, %W)                           %p = MatMul(%x, %W)
//   %y2 = Add(%p, %b)                   ==>         %y = Add(%p, %b)
//   %y  = Reshape(%y2, [B, S, N])
//
//   %p = MatMul(%x, %W)                             %q = Add(MatMul(%x, %W[:, 0:E]), %b[0:E])
//   %y = Add(%p, %b)                    ==>         %k = Add(MatMul(%x, %W[:, E:2E]), %b[E:2E])
//   %q, %k, %v = Split(%y) {axis = -1}              %v = Add(MatMul(%x, %W[:, 2E:3E]), %b[2E:3E])
//
// Note on the rewrites. A view (Reshape, Flatten, Squeeze, Unsqueeze, Identity) keeps the
// element order, so a view that keeps the innermost dim only splits or merges the leading
// (row) dims. Such a view of a value that only it reads moves above the value's producer when
// the producer works row by row:
//  - a MatMul by 2-D weights (each row of A gives a row of the product): A is viewed with the
//    new row dims instead;
//  - an op of the elementwise table whose operands are of the result's shape (each is viewed
//    the same way) or broadcast along the last dim only (a bias, a scalar: they read the same
//    elements under either row shape, and are left as they are).
// Moved views meet the view on the other side of the GEMM: a view of a view is one view of
// the first input, and a view to its input's own shape is dropped. What the view fed now
// reads the producer directly, so the bias add and what follows it are elementwise readers
// of the GEMM (FuseGemm's epilogue), and a GEMM's result and its residual are of one shape.
//
// Slices of a projection: y = MatMul(x, W) [+ b] with W a constant [K, N] and b absent or a
// constant of N values along the last dim, read only by Slice / Split nodes that each take a
// contiguous range of the last dim, all of one width (at most 8), with no column read twice.
// Each range becomes its own projection, x by the range's columns of W (plus the range of b); FuseGemm then runs them
// as one GEMM with one output per range. The slice kernels and the packed tensor are gone,
// and the attention reads q, k and v as separate tensors.
//
// Every rewrite keeps the value names readers see (the new value takes the old one's name);
// new nodes take the names of the nodes they stand for. A view that is a graph output stays.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/prepared_store.h"
#include "passes/fusion_passes.h"
#include "passes/match.h"

namespace graphfuse {
namespace {

// A node that only gives its input another shape: same elements, same order, no kernel.
bool IsPureView(const Node& n) {
  return match::IsReshapeLike(n) && n.outputs().size() == 1 && n.input(0) != nullptr &&
         n.input(0)->numel() == n.output()->numel();
}

// Whether `s` has no zero dims (a zero would read as "copy this dim" in a Reshape's shape).
bool AllPositive(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](int64_t d) { return d > 0; });
}

// Whether operand `u` of an elementwise op over `space` reads the same elements whatever the
// row dims: one value per column of the last dim (or a scalar), all its other dims 1.
bool IsRowBroadcast(const Value* u, const Shape& space) {
  const Shape& s = u->shape();
  if (s.empty()) return true;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] != 1) return false;
  return s.back() == 1 || s.back() == space.back();
}

// Replaces every use of `old` by `now`. A value the rewrite made (`made`) takes old's name, so
// that readers and graph outputs keep the names they had; one that existed keeps its own.
Status TakeOver(Graph& g, Value* old, Value* now, bool made) {
  const std::string name = old->name();
  g.ReplaceAllUsesWith(old, now);
  if (!made) return Status::Ok();
  GF_RETURN_IF_ERROR(g.RenameValue(old, g.FreshName(name + "_replaced")));
  return g.RenameValue(now, name);
}

class ViewRewriter {
 public:
  static constexpr size_t kMaxPieces = 8;  // FuseGemm's most projections in one GEMM

  explicit ViewRewriter(Graph& g) : g_(g) {}

  Result<int> Run() {
    int changes = 0;
    // Each rewrite removes a view or a slice node (or moves a view towards the inputs, which
    // ends); the bound only guards that argument.
    const size_t max_changes = 4 * g_.num_nodes() + 16;
    for (bool changed = true; changed && static_cast<size_t>(changes) < max_changes;) {
      changed = false;
      std::vector<Node*> order;
      for (const auto& n : g_.nodes()) order.push_back(n.get());
      for (Node* n : order) {
        if (IsPureView(*n)) {
          GF_ASSIGN_OR_RETURN(changed, FoldView(n));
          if (!changed) {
            GF_ASSIGN_OR_RETURN(changed, HoistView(n));
          }
        } else if (n->is(op::MatMul)) {
          GF_ASSIGN_OR_RETURN(changed, SplitProjection(n));
        }
        if (changed) break;
      }
      if (changed) {
        ++changes;
        g_.RemoveDeadNodes();
        GF_RETURN_IF_ERROR(g_.TopologicalSort().WithContext("CanonicalizeViews"));
      }
    }
    return changes;
  }

 private:
  // A Reshape of x to `shape` (x itself when it has that shape already).
  Result<Value*> ViewAs(Value* x, const Shape& shape, const std::string& name) {
    if (x->shape() == shape) return x;
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {static_cast<int64_t>(shape.size())}));
    std::copy(shape.begin(), shape.end(), t.data_as<int64_t>());
    GF_ASSIGN_OR_RETURN(Value * s, g_.AddConstant(g_.FreshName(name + "_shape"), std::make_shared<const Tensor>(std::move(t))));
    GF_ASSIGN_OR_RETURN(Node * r, g_.AddNode("Reshape", {x, s}, {}, name, -1, {g_.FreshName(x->name() + "_view")}));
    return r->output();
  }

  // A view of a view reads the first one's input; a view to its input's shape goes away.
  Result<bool> FoldView(Node* v) {
    Value* out = v->output();
    if (out->is_graph_output()) return false;
    Value* x = v->input(0);
    if (x->shape() == out->shape()) {
      GF_RETURN_IF_ERROR(TakeOver(g_, out, x, /*made=*/false).WithContext(v->Describe()));
      return true;
    }
    Node* inner = x->producer();
    if (!inner || !IsPureView(*inner) || !AllPositive(out->shape())) return false;
    GF_ASSIGN_OR_RETURN(Value * folded, ViewAs(inner->input(0), out->shape(), v->name()));
    GF_RETURN_IF_ERROR(TakeOver(g_, out, folded, folded != inner->input(0)).WithContext(v->Describe()));
    return true;
  }

  // The view moves above its input's producer when that works row by row (see the note).
  Result<bool> HoistView(Node* v) {
    Value* x = v->input(0);
    Value* out = v->output();
    Node* p = x->producer();
    const Shape& from = x->shape();
    const Shape& to = out->shape();
    if (!p || !match::HasSingleUse(x) || p->outputs().size() != 1 || from.empty() || to.empty() ||
        from.back() != to.back() || !AllPositive(to))
      return false;
    std::vector<Value*> inputs;
    if (p->is(op::MatMul)) {
      Value* a = p->input(0);
      Value* w = p->input(1);
      if (!a || !w || w->shape().size() != 2 || a->shape().size() < 2 || from.size() < 2 || to.size() < 2) return false;
      // A view that only adds or drops dims of 1 (a head split into one head: multi-query K / V)
      // stays below a GEMM whose input others read too: above it, the GEMM would read a view of
      // its own and no longer join the other projections of that input.
      auto non_unit = [](const Shape& s) {
        Shape r;
        for (int64_t d : s)
          if (d != 1) r.push_back(d);
        return r;
      };
      if (!match::HasSingleUse(a) && non_unit(from) == non_unit(to)) return false;
      Shape a_shape(to.begin(), to.end() - 1);
      a_shape.push_back(a->shape().back());
      GF_ASSIGN_OR_RETURN(Value * a2, ViewAs(a, a_shape, v->name()));
      inputs = {a2, w};
    } else if (match::IsElementwiseOp(*p) && p->output()->shape() == from) {
      for (Value* u : p->inputs()) {
        if (!u) {
          inputs.push_back(nullptr);
        } else if (u->shape() == from) {
          inputs.push_back(nullptr);  // viewed below, once every operand is known to fit
        } else if (IsRowBroadcast(u, from) && u->shape().size() <= to.size()) {
          inputs.push_back(u);
        } else {
          return false;
        }
      }
      for (size_t i = 0; i < inputs.size(); ++i)
        if (p->input(i) && p->input(i)->shape() == from) {
          GF_ASSIGN_OR_RETURN(inputs[i], ViewAs(p->input(i), to, v->name()));
        }
    } else {
      return false;
    }
    auto moved = g_.AddNode(p->op(), inputs, p->attrs(), p->name());
    if (!moved.ok() || (*moved)->output()->shape() != to || (*moved)->output()->dtype() != out->dtype()) {
      if (moved.ok()) g_.RemoveNode(*moved);
      g_.RemoveDeadNodes();  // the views made for it
      return false;
    }
    GF_RETURN_IF_ERROR(TakeOver(g_, out, (*moved)->output(), /*made=*/true).WithContext(v->Describe()));
    return true;
  }

  // [start, end) of the last dim that `reader` (a Slice, or output `k` of a Split) takes of y;
  // none when it takes anything else.
  static std::optional<std::pair<int64_t, int64_t>> LastDimRange(const Node& reader, const Value* y, size_t k) {
    const size_t rank = y->shape().size();
    if (reader.is(op::Split)) {
      if (reader.input(0) != y || !match::IsLastAxis(reader.GetInt("axis", 0), rank)) return std::nullopt;
      int64_t start = 0;
      for (size_t i = 0; i < k; ++i) start += reader.output(i)->shape().back();
      return std::make_pair(start, start + reader.output(k)->shape().back());
    }
    if (!reader.is(op::Slice) || reader.input(0) != y) return std::nullopt;
    return match::LastAxisSliceRange(reader);
  }

  // Slices of a projection become projections of their own (see the note).
  Result<bool> SplitProjection(Node* mm) {
    Value* x = mm->input(0);
    Value* w = mm->input(1);
    if (!x || !w || !w->constant() || w->dtype() != DType::kF32 || w->shape().size() != 2 || x->shape().size() < 2)
      return false;
    const int64_t k = w->shape()[0], n = w->shape()[1];
    // y: the product, or the product plus a bias of N values.
    Value* y = mm->output();
    Node* bias_add = nullptr;
    Value* bias = nullptr;
    bool bias_first = false;
    if (Node* add = match::SingleUse(y) ? match::SingleUse(y)->node : nullptr; add && add->is(op::Add)) {
      Value* b = match::OtherOperand(*add, y);
      if (b && b->constant() && b->dtype() == DType::kF32 && b->numel() == n && IsRowBroadcast(b, y->shape()) &&
          add->output()->shape() == y->shape()) {
        bias_add = add, bias = b, bias_first = add->input(0) == b;
        y = add->output();
      }
    }
    if (y->is_graph_output() || y->uses().empty()) return false;
    // Every reader takes a range of the last dim; no column twice.
    struct Piece {
      Value* out;
      int64_t start, end;
      std::string name;
    };
    std::vector<Piece> pieces;
    // Readers in use order (not by address: the rewrite must be the same from run to run).
    std::vector<const Node*> readers;
    for (const Use& u : y->uses())
      if (std::find(readers.begin(), readers.end(), u.node) == readers.end()) readers.push_back(u.node);
    for (const Node* r : readers) {
      for (size_t o = 0; o < r->outputs().size(); ++o) {
        auto range = LastDimRange(*r, y, o);
        if (!range || range->second <= range->first) return false;
        pieces.push_back({r->output(o), range->first, range->second, r->name()});
      }
    }
    // Ranges of one width, so that FuseGemm runs the projections as one GEMM again (at most
    // its 8 per group): the rewrite then saves the slice kernels and costs no launch.
    if (pieces.empty() || pieces.size() > kMaxPieces) return false;
    for (const Piece& p : pieces)
      if (p.end - p.start != pieces.front().end - pieces.front().start) return false;
    std::vector<int64_t> covered(static_cast<size_t>(n), 0);
    for (const Piece& p : pieces)
      for (int64_t c = p.start; c < p.end; ++c)
        if (covered[static_cast<size_t>(c)]++) return false;

    const float* wd = w->constant()->data_as<float>();
    for (const Piece& p : pieces) {
      const int64_t width = p.end - p.start;
      const std::string suffix = StrCat("/cols", p.start, "_", p.end);
      const Tensor* wsrc[] = {w->constant().get()};
      GF_ASSIGN_OR_RETURN(auto wt, DeriveTensor(g_.prepared_store(), wsrc, StrCat("columns ", p.start, "..", p.end),
                                                [&]() -> Result<Tensor> {
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {k, width}));
        for (int64_t r = 0; r < k; ++r) std::copy(wd + r * n + p.start, wd + r * n + p.end, t.data_as<float>() + r * width);
        return t;
      }));
      GF_ASSIGN_OR_RETURN(Value * wp, g_.AddConstant(g_.FreshName(w->name() + suffix), std::move(wt)));
      GF_ASSIGN_OR_RETURN(Node * mp, g_.AddNode("MatMul", {x, wp}, {}, mm->name() + suffix));
      Value* result = mp->output();
      if (bias_add) {
        Shape bs = bias->shape();
        bs.back() = width;
        const Tensor* bsrc[] = {bias->constant().get()};
        GF_ASSIGN_OR_RETURN(auto bt, DeriveTensor(g_.prepared_store(), bsrc,
                                                  StrCat("columns ", p.start, "..", p.end, " as ", ShapeToString(bs)),
                                                  [&]() -> Result<Tensor> {
          GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, bs));
          std::copy(bias->constant()->data_as<float>() + p.start, bias->constant()->data_as<float>() + p.end,
                    t.data_as<float>());
          return t;
        }));
        GF_ASSIGN_OR_RETURN(Value * bp, g_.AddConstant(g_.FreshName(bias->name() + suffix), std::move(bt)));
        GF_ASSIGN_OR_RETURN(Node * ap, g_.AddNode("Add", bias_first ? std::vector<Value*>{bp, result}
                                                                     : std::vector<Value*>{result, bp},
                                                  {}, bias_add->name() + suffix));
        result = ap->output();
      }
      if (result->shape() != p.out->shape() || result->dtype() != p.out->dtype())
        return Internal("CanonicalizeViews: the projection of columns [", p.start, ", ", p.end, ") of '",
                        mm->name(), "' gives ", result->TypeString(), " in place of '", p.out->name(), "' ",
                        p.out->TypeString());
      GF_RETURN_IF_ERROR(TakeOver(g_, p.out, result, /*made=*/true).WithContext(p.name));
    }
    return true;
  }

  Graph& g_;
};

}  // namespace

Result<int> CanonicalizeViews(Graph& g) { return ViewRewriter(g).Run(); }

}  // namespace graphfuse

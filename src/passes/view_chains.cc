// SimplifyViewChains: a chain of views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) and
// Transposes that unpacks with Gathers of one constant index, as exporters write packed-QKV
// unpacking and the head splits after it, becomes at most three nodes: a Slice of a column range
// of its source (the last axis), a Reshape and a Transpose.
//
//   torch.nn.MultiheadAttention seq-first, as the dynamo exporter writes q (k, v alike):
//     %p = Add(MatMul(%x, %W), %b)                  [S,B,3E]
//     %u = Squeeze(Transpose(Unsqueeze(Reshape(%p, [S,B,3,E])), perm 3,1,2,0,4))
//     %q = Reshape(Transpose(Reshape(Gather(%u, 0), [S,B*H,d]), perm 1,0,2), [B,H,S,d])
//   ==> %q = Transpose(Reshape(Slice(%p, 0:E, last axis), [S,B,H,d]), perm 1,2,0,3)
//
// Note on the algorithm. Each value of the chain is described by where its elements lie in the
// source (row-major): an offset, and per dim a run of atoms, each a size and a stride. A view op
// regroups the atoms into its dims, splitting an atom where a dim ends inside it (a chain whose
// dims and atoms do not divide one another stops there); a Transpose permutes the dims; a Gather
// of index i adds the index's atom offsets and drops the dim. At the end every dim must be one
// evenly strided run. The chain's result then has a simple form
// when its dims with strides below the source's last dim C cover one contiguous column range
// [c0, c0 + w) and its other dims step whole rows: it is Slice(source, c0 : c0 + w) (omitted
// when w = C) viewed with the strides sorted (a Reshape, omitted when it is the identity) and
// transposed back into the chain's order (a Transpose, omitted when the order is kept). The
// chain is rewritten when it takes no more nodes than it has; its values are read by the next
// node of the chain alone, except a value read only by Gathers of one index (the q, k and v of
// a packed projection). Chains without a Gather (head splits, K^T, repeated heads) stay as
// written: the fusion passes read those forms.
#include "passes/view_chains.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>

#include "passes/match.h"

namespace graphfuse {
namespace {

// Where the elements of a value lie in its chain's source (row-major): each dim is a run of
// atoms, outermost first, each atom a size and a stride; the atoms of a dim need not be evenly
// strided with one another (a head split merged with the batch: [S, B*H, d] of a [S, B, E]
// source). A dim of size 1 has no atom.
struct Atom {
  int64_t size, stride;
};
struct AtomView {
  std::vector<std::vector<Atom>> dims;
  int64_t offset = 0;
};

bool IsViewOp(const Node& n) {
  return match::IsReshapeLike(n) && n.outputs().size() == 1 && n.input(0) && n.input(0)->numel() == n.output()->numel();
}

// A Gather of one constant index (a scalar: the axis goes).
std::optional<int64_t> ScalarGatherIndex(const Node& n) {
  if (!n.is(op::Gather) || n.inputs().size() != 2 || !n.input(1) || !n.input(1)->shape().empty()) return std::nullopt;
  const std::optional<std::vector<int64_t>> idx = match::IntConstant(n.input(1));
  if (!idx || idx->size() != 1) return std::nullopt;
  return (*idx)[0];
}

bool IsChainOp(const Node& n) {
  return IsViewOp(n) || (n.is(op::Transpose) && n.outputs().size() == 1) || ScalarGatherIndex(n).has_value();
}

// Whether the chain may pass through `v` walking up from a reader: v read by that reader alone,
// or only by Gathers of one index (each reader is then rewritten on its own).
bool MayPassThrough(const Value* v) {
  if (v->is_graph_output()) return false;
  if (match::HasSingleUse(v)) return true;
  for (const Use& u : v->uses())
    if (!ScalarGatherIndex(*u.node)) return false;
  return !v->uses().empty();
}

// `to` viewing v's elements in the same order: atoms are split where a dim of `to` ends inside
// one. Fails where a dim of `to` and an atom do not divide one another.
bool Reshape(AtomView& v, const Shape& to) {
  std::vector<Atom> atoms;  // innermost first
  for (auto d = v.dims.rbegin(); d != v.dims.rend(); ++d)
    for (auto a = d->rbegin(); a != d->rend(); ++a) atoms.push_back(*a);
  std::vector<std::vector<Atom>> dims;  // innermost first, each dim's atoms innermost first
  size_t k = 0;
  Atom cur = atoms.empty() ? Atom{1, 0} : atoms[0];
  for (auto t = to.rbegin(); t != to.rend(); ++t) {
    std::vector<Atom> dim;
    int64_t need = *t;
    if (need <= 0) return false;
    while (need > 1) {
      if (cur.size == 1) {
        if (++k >= atoms.size()) return false;
        cur = atoms[k];
        continue;
      }
      if (need % cur.size == 0) {
        dim.push_back(cur);
        need /= cur.size;
        cur.size = 1;
      } else if (cur.size % need == 0) {
        dim.push_back({need, cur.stride});
        cur.stride *= need;
        cur.size /= need;
        need = 1;
      } else {
        return false;
      }
    }
    std::reverse(dim.begin(), dim.end());
    dims.push_back(std::move(dim));
  }
  if (cur.size != 1) return false;
  for (++k; k < atoms.size(); ++k)
    if (atoms[k].size != 1) return false;
  std::reverse(dims.begin(), dims.end());
  v.dims = std::move(dims);
  return true;
}

Shape ShapeOf(const AtomView& v) {
  Shape s;
  for (const auto& d : v.dims) {
    int64_t n = 1;
    for (const Atom& a : d) n *= a.size;
    s.push_back(n);
  }
  return s;
}

// Applies one chain op to the view; false when it cannot be described.
bool Apply(const Node& n, AtomView& v) {
  const int64_t rank = static_cast<int64_t>(v.dims.size());
  if (const std::optional<int64_t> index = ScalarGatherIndex(n)) {
    int64_t axis = n.GetInt("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    const Shape s = ShapeOf(v);
    int64_t i = *index;
    if (i < 0) i += s[static_cast<size_t>(axis)];
    if (i < 0 || i >= s[static_cast<size_t>(axis)]) return false;
    const std::vector<Atom>& d = v.dims[static_cast<size_t>(axis)];
    for (auto a = d.rbegin(); a != d.rend(); ++a) {  // i in the atoms' mixed radix
      v.offset += (i % a->size) * a->stride;
      i /= a->size;
    }
    v.dims.erase(v.dims.begin() + axis);
  } else if (n.is(op::Transpose)) {
    std::vector<int64_t> perm = n.GetInts("perm");
    if (perm.empty()) {
      perm.resize(v.dims.size());
      std::iota(perm.rbegin(), perm.rend(), 0);
    }
    if (static_cast<int64_t>(perm.size()) != rank) return false;
    std::vector<std::vector<Atom>> dims;
    for (int64_t p : perm) {
      if (p < 0 || p >= rank) return false;
      dims.push_back(v.dims[static_cast<size_t>(p)]);
    }
    v.dims = std::move(dims);
  } else if (!Reshape(v, n.output()->shape())) {
    return false;
  }
  return ShapeOf(v) == n.output()->shape();
}

// One stride per dim (0 for a dim of 1), merging each dim's evenly strided atoms; nullopt when
// a dim keeps atoms that are not.
std::optional<std::vector<int64_t>> Strides(const AtomView& v) {
  std::vector<int64_t> strides;
  for (const auto& d : v.dims) {
    if (d.empty()) {
      strides.push_back(0);
      continue;
    }
    for (size_t k = 0; k + 1 < d.size(); ++k)
      if (d[k].stride != d[k + 1].stride * d[k + 1].size) return std::nullopt;
    strides.push_back(d.back().stride);
  }
  return strides;
}

// The simple form of a view of `src`: the column range, the viewed shape (source order) and the
// permutation back to the view's order.
struct SimpleForm {
  int64_t c0 = 0, w = 0;
  Shape viewed;
  std::vector<int64_t> perm;
};

struct StridedView {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

std::optional<SimpleForm> SimpleFormOf(const StridedView& v, const Shape& src) {
  if (src.empty() || v.shape.empty()) return std::nullopt;
  const int64_t c = src.back();
  const int64_t rows = c > 0 ? std::accumulate(src.begin(), src.end() - 1, int64_t{1}, std::multiplies<>()) : 0;
  // Dims: column dims (stride < C, of size > 1), row dims (stride a multiple of C); the strides
  // in the sliced tensor [rows, w] follow once w is known.
  SimpleForm f;
  f.c0 = v.offset % std::max<int64_t>(c, 1);
  const int64_t row0 = v.offset / std::max<int64_t>(c, 1);
  if (row0 != 0) return std::nullopt;  // a slice of rows: not this form
  int64_t w = 1, row_numel = 1;
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] == 1) continue;
    if (v.strides[i] < c) w *= v.shape[i];
    else if (v.strides[i] % c == 0) row_numel *= v.shape[i];
    else return std::nullopt;
  }
  if (f.c0 + w > c || row_numel != rows) return std::nullopt;
  f.w = w;
  // Strides in the slice [rows, w]: column strides stay, row strides scale by w / C.
  std::vector<int64_t> order;
  std::vector<int64_t> sliced(v.shape.size());
  for (size_t i = 0; i < v.shape.size(); ++i) sliced[i] = v.strides[i] < c ? v.strides[i] : v.strides[i] / c * w;
  // The source's own dims, permuted, when they give the view (no Reshape: the form the fusion
  // passes read, e.g. K^T as a Transpose of K's heads even where a dim of 1 is ambiguous).
  if (w == c && v.shape.size() == src.size()) {
    std::vector<int64_t> src_strides(src.size());
    for (int64_t i = static_cast<int64_t>(src.size()) - 1, st = 1; i >= 0; --i) {
      src_strides[static_cast<size_t>(i)] = st;
      st *= src[static_cast<size_t>(i)];
    }
    std::vector<bool> used(src.size(), false);
    std::vector<int64_t> perm(v.shape.size(), -1);
    bool ok = true;
    for (size_t j = 0; j < v.shape.size() && ok; ++j) {
      for (size_t i = 0; i < src.size() && perm[j] < 0; ++i)
        if (!used[i] && src[i] == v.shape[j] && (v.shape[j] == 1 || src_strides[i] == v.strides[j]))
          used[i] = true, perm[j] = static_cast<int64_t>(i);
      ok = perm[j] >= 0;
    }
    if (ok) {
      f.viewed = src;
      f.perm = perm;
      return f;
    }
  }
  // Sorted by stride, the dims other than 1s must tile the slice contiguously; the 1s go first
  // (a batch of 1 leads, as in the [B,S,H,d] the exporters' head splits write).
  std::vector<int64_t> units;
  for (size_t i = 0; i < v.shape.size(); ++i) (v.shape[i] == 1 ? units : order).push_back(static_cast<int64_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return sliced[static_cast<size_t>(a)] > sliced[static_cast<size_t>(b)];
  });
  order.insert(order.begin(), units.begin(), units.end());
  int64_t expect = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t i = static_cast<size_t>(*it);
    if (v.shape[i] == 1) continue;
    if (sliced[i] != expect) return std::nullopt;
    expect *= v.shape[i];
  }
  for (int64_t i : order) f.viewed.push_back(v.shape[static_cast<size_t>(i)]);
  // The view's dim j is viewed dim position_of[j]: perm[j] = where order holds j.
  f.perm.resize(order.size());
  for (size_t k = 0; k < order.size(); ++k) f.perm[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
  return f;
}

}  // namespace

Result<int> SimplifyViewChains(Graph& g) {
  // Chain tops: chain ops whose result is not read by a chain op that may take it in.
  std::vector<Node*> tops;
  for (const auto& n : g.nodes()) {
    if (!IsChainOp(*n)) continue;
    bool top = true;
    if (MayPassThrough(n->output()))
      for (const Use& u : n->output()->uses()) top &= !IsChainOp(*u.node);
    if (top) tops.push_back(n.get());
  }
  int rewritten = 0;
  for (Node* top : tops) {
    // Walk up.
    std::vector<Node*> chain = {top};
    bool gathers = ScalarGatherIndex(*top).has_value();
    for (Node* n = top; n->input(0) && n->input(0)->producer() && IsChainOp(*n->input(0)->producer()) &&
                        MayPassThrough(n->input(0));) {
      n = n->input(0)->producer();
      gathers |= ScalarGatherIndex(*n).has_value();
      chain.push_back(n);
    }
    if (chain.size() < 2) continue;
    std::reverse(chain.begin(), chain.end());
    // Only chains that unpack with Gathers: others are left as the exporters wrote them, which
    // the fusion passes read as they are (head splits, K^T, repeated heads).
    if (!gathers) continue;
    Value* src = chain.front()->input(0);
    const Shape& xs = src->shape();
    if (xs.empty()) continue;
    AtomView av;
    for (int64_t i = static_cast<int64_t>(xs.size()) - 1, st = 1; i >= 0; --i) {
      const int64_t n = xs[static_cast<size_t>(i)];
      av.dims.insert(av.dims.begin(), n == 1 ? std::vector<Atom>{} : std::vector<Atom>{{n, st}});
      st *= n;
    }
    bool described = true;
    for (const Node* n : chain) described = described && Apply(*n, av);
    if (!described) continue;
    const std::optional<std::vector<int64_t>> strides = Strides(av);
    if (!strides) continue;
    const StridedView v{ShapeOf(av), *strides, av.offset};
    const std::optional<SimpleForm> f = SimpleFormOf(v, xs);
    if (!f) continue;
    const bool slice = f->w != xs.back();
    std::vector<int64_t> identity(f->perm.size());
    std::iota(identity.begin(), identity.end(), 0);
    const bool transpose = f->perm != identity;
    Shape sliced_shape = xs;
    sliced_shape.back() = f->w;
    const bool reshape = f->viewed != sliced_shape;
    const size_t made = size_t{slice} + size_t{reshape} + size_t{transpose};
    if (made > chain.size()) continue;
    if (made == 0 && top->output()->is_graph_output()) continue;  // the output keeps a node of its own
    Value* cur = src;
    const std::string base = top->name();
    if (slice) {
      GF_ASSIGN_OR_RETURN(Value * starts, match::AddIntsConstant(g, base + "_starts", {f->c0}));
      GF_ASSIGN_OR_RETURN(Value * ends, match::AddIntsConstant(g, base + "_ends", {f->c0 + f->w}));
      GF_ASSIGN_OR_RETURN(Value * axes, match::AddIntsConstant(g, base + "_axes", {-1}));
      GF_ASSIGN_OR_RETURN(Node * s, g.AddNode("Slice", {cur, starts, ends, axes}, {}, g.FreshName(base + "_columns")));
      cur = s->output();
    }
    if (reshape) {
      GF_ASSIGN_OR_RETURN(Value * shape, match::AddIntsConstant(g, base + "_shape", f->viewed));
      GF_ASSIGN_OR_RETURN(Node * r, g.AddNode("Reshape", {cur, shape}, {}, g.FreshName(base + "_view")));
      cur = r->output();
    }
    if (transpose) {
      GF_ASSIGN_OR_RETURN(Node * t, g.AddNode("Transpose", {cur}, {{"perm", f->perm}}, g.FreshName(base + "_transpose")));
      cur = t->output();
    }
    if (cur == src) {  // the chain gives its source back: its readers read the source
      if (top->output()->is_graph_output()) continue;
      g.ReplaceAllUsesWith(top->output(), src);
      ++rewritten;
      continue;
    }
    const std::string name = top->output()->name();
    g.ReplaceAllUsesWith(top->output(), cur);
    GF_RETURN_IF_ERROR(g.RenameValue(top->output(), g.FreshName(name + "_chain")));
    GF_RETURN_IF_ERROR(g.RenameValue(cur, name));
    ++rewritten;
  }
  if (rewritten > 0) {
    g.RemoveDeadNodes();
    GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("SimplifyViewChains"));
  }
  return rewritten;
}

}  // namespace graphfuse

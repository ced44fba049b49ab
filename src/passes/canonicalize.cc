// Canonicalize: recognizes what exporters write out as primitive ops and replaces each pattern
// with the single op it is, so that the fusion passes see RMSNorm / LayerNormalization / Gelu /
// GeluTanh / Silu / Softmax / Rope nodes. First, nodes that return their input (a Cast to the
// dtype it has, which transformers' norms and softmax write for mixed precision; a Concat of one
// input; an Expand to the shape it has; a Mul by 1) go, so that they split no pattern, and a
// Gather that reads its data in order becomes the view it is, a node computing what an earlier
// node computes goes (its readers read the earlier one's results), a chain of views and
// Transposes that unpacks packed q / k / v with one-index Gathers becomes a Slice, a Reshape and
// a Transpose (view_chains.cc), and a swap of the last two dims written through a 3-D view
// (Reshape, Transpose, Reshape: the dynamo exporter's K^T) becomes the one Transpose it is.
//
// Note on the matching algorithm
// ------------------------------
// Every pattern is matched from its root, the node that computes the pattern's result, walking
// producers upward:
//
//     x ──┬──────────────────────────────┐
//         └─ Pow(·,2) ─ ReduceMean ─ Add(eps) ─ Sqrt ─ Div(1,·) ─┐
//                                                               Mul ─ Mul(weight)   <- root
//
// * Products are matched as multisets of factors: Mul nodes whose result feeds only the next Mul
//   are flattened, so x*0.5*(1+erf) in any association and operand order is {x, 0.5, 1+erf}.
//   Add and Mul operands are tried in both orders.
// * Constants are graph constants (initializers, or Constant nodes already folded by
//   FoldConstants) holding one float element (scalar or shape [1]); their value is compared in
//   f32 with a relative tolerance of 1e-6, so 0.5001 is not 0.5. Epsilons are read as written.
// * A match is accepted only if every intermediate value is consumed by pattern nodes alone and
//   is not a graph output (otherwise removing the pattern would drop a value someone reads), if
//   every value in it has the float dtype of the pattern input, and if the result has the
//   input's shape (a broadcasting constant must not change the shape).
// * Roots are tried consumers first (reverse topological order), so the largest match wins: the
//   Mul by an RMSNorm weight is tried before the Mul by 1/sqrt(...) inside it.
// * Rewrite: the new node is appended, takes over every use of the root's value and that value's
//   name (user-visible names survive), dead nodes are removed and the graph re-sorted; then the
//   scan restarts, so no matcher ever sees a removed node. Patterns are few and matching is
//   local, so the restarts cost O(patterns * nodes).
//
// Forms never mix: the tanh approximation of GELU becomes GeluTanh, never Gelu; the softmax
// written without the max subtraction is left alone.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/prepared_store.h"
#include "graphfuse/ops.h"
#include "passes/fusion_passes.h"
#include "passes/match.h"
#include "passes/view_chains.h"

namespace graphfuse {
namespace {

using match::HasSingleUse;
using match::IsScalarConstant;
using match::OperandOrders;
using match::OtherOperand;
using match::ProducerOf;
using match::SingleUseProducer;

// Constants as exporters write them: one element, scalar or [1], integer ones too.
constexpr match::ScalarRule kScalar{.integers = true, .max_rank = 1};
constexpr double kSqrt2 = 1.4142135623730950488;
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // GELU tanh form's outer coefficient
constexpr double kGeluCubic = 0.044715;                   // and its cubic coefficient

// A recognized pattern and the op that replaces it.
struct Match {
  const char* op;  // the replacement op, also the suffix of its node name
  std::vector<Value*> inputs;
  AttributeMap attrs;
  std::vector<Node*> members;  // every node of the pattern, the root included
  Node* root = nullptr;
  // LayerNormalization needs a Scale input: when the pattern has none, a [d] constant of ones.
  int64_t unit_scale_dim = -1;
};

// ---- small helpers ----

// Whether reduction n (ReduceMean/Sum/Max) reduces exactly the last axis and keeps dims. Axes
// come from the attribute (opset 13) or a constant second input (ReduceSum 13, all from 18).
bool ReducesLastAxis(const Node* n) {
  if (!n || n->GetInt("keepdims", 1) != 1 || !n->input(0)) return false;
  std::vector<int64_t> axes;
  if (n->input(1)) {
    auto a = match::IntConstant(n->input(1));
    if (!a) return false;
    axes = *a;
  } else {
    axes = n->GetInts("axes");
  }
  return axes.size() == 1 && match::IsLastAxis(axes[0], n->input(0)->shape().size());
}

// The reduced input of `v = op(input)` reducing the last axis, or nullptr.
Value* LastAxisReduceOf(const Value* v, op::Id op, std::vector<Node*>& members) {
  Node* r = ProducerOf(v, op);
  if (!r || !ReducesLastAxis(r)) return nullptr;
  members.push_back(r);
  return r->input(0);
}

// The factors of the product computed by Mul node n, descending into Mul operands that feed
// only this product: x * 0.5 * y in any association gives {x, 0.5, y}. The walked Mul nodes go
// to `members`. At most `kMaxFactors` factors (a pattern never needs more).
constexpr size_t kMaxFactors = 6;
bool ProductFactors(Node* n, std::vector<Value*>& factors, std::vector<Node*>& members) {
  if (!n->is(op::Mul) || n->inputs().size() != 2) return false;
  members.push_back(n);
  for (Value* in : n->inputs()) {
    if (!in) return false;
    if (Node* m = SingleUseProducer(in, op::Mul)) {
      if (!ProductFactors(m, factors, members)) return false;
    } else {
      factors.push_back(in);
    }
    if (factors.size() > kMaxFactors) return false;
  }
  return true;
}

// Removes one occurrence of `v` from `factors`; false if absent.
bool TakeFactor(std::vector<Value*>& factors, const Value* v) {
  auto it = std::find(factors.begin(), factors.end(), v);
  if (it == factors.end()) return false;
  factors.erase(it);
  return true;
}

// Removes the one-element constant equal to `c` from `factors`; false if absent.
bool TakeConstFactor(std::vector<Value*>& factors, double c) {
  auto it = std::find_if(factors.begin(), factors.end(),
                         [c](const Value* v) { return IsScalarConstant(v, c, kScalar); });
  if (it == factors.end()) return false;
  factors.erase(it);
  return true;
}

// x when `v` = x^2, written Pow(x, 2) or Mul(x, x); else nullptr.
Value* SquareOf(const Value* v, std::vector<Node*>& members) {
  if (Node* p = ProducerOf(v, op::Pow); p && p->inputs().size() == 2 && IsScalarConstant(p->input(1), 2.0, kScalar)) {
    members.push_back(p);
    return p->input(0);
  }
  if (Node* m = ProducerOf(v, op::Mul); m && m->inputs().size() == 2 && m->input(0) == m->input(1)) {
    members.push_back(m);
    return m->input(0);
  }
  return nullptr;
}

// s when `v` = 1 / sqrt(s): Rsqrt(s), Reciprocal(Sqrt(s)), Div(1, Sqrt(s)) or Pow(s, -0.5).
Value* InvSqrtOf(const Value* v, std::vector<Node*>& members) {
  if (Node* r = ProducerOf(v, op::Rsqrt)) {
    members.push_back(r);
    return r->input(0);
  }
  if (Node* p = ProducerOf(v, op::Pow); p && p->inputs().size() == 2 && IsScalarConstant(p->input(1), -0.5, kScalar)) {
    members.push_back(p);
    return p->input(0);
  }
  Node* inv = ProducerOf(v, op::Reciprocal);
  Value* root = inv ? inv->input(0) : nullptr;
  if (!inv) {
    inv = ProducerOf(v, op::Div);
    if (!inv || !IsScalarConstant(inv->input(0), 1.0, kScalar)) return nullptr;
    root = inv->input(1);
  }
  Node* sq = ProducerOf(root, op::Sqrt);
  if (!sq) return nullptr;
  members.push_back(inv);
  members.push_back(sq);
  return sq->input(0);
}

// `v` = (product of numerators) / sqrt(s), written as Div(n, Sqrt(s)) or as a product with a
// 1/sqrt(s) factor (see InvSqrtOf) or a Div(n, Sqrt(s)) factor.
struct ScaledBySqrt {
  std::vector<Value*> numerators;
  Value* s = nullptr;
};

// Splits one factor: a 1/sqrt(s) factor or Div(n, Sqrt(s)) sets out.s (once), anything else is
// a numerator. `expand` is false for a factor read elsewhere too, which must stay whole.
bool AddNormFactor(Value* f, bool expand, ScaledBySqrt& out, std::vector<Node*>& members) {
  std::vector<Node*> walked;
  Value* s = expand ? InvSqrtOf(f, walked) : nullptr;
  Value* numerator = nullptr;
  if (!s && expand) {
    Node* div = ProducerOf(f, op::Div);
    Node* sq = div ? ProducerOf(div->input(1), op::Sqrt) : nullptr;
    if (sq) {
      walked = {div, sq};
      s = sq->input(0);
      numerator = div->input(0);
    }
  }
  if (!s) {
    out.numerators.push_back(f);
    return true;
  }
  if (out.s) return false;  // two square roots: not a normalization
  out.s = s;
  if (numerator) out.numerators.push_back(numerator);
  members.insert(members.end(), walked.begin(), walked.end());
  return true;
}

std::optional<ScaledBySqrt> MatchScaledBySqrt(Node* root, std::vector<Node*>& members) {
  ScaledBySqrt out;
  if (root->is(op::Div)) {
    // Div(n, Sqrt(s)); a Div(1, Sqrt(s)) root leaves no numerator, which no norm accepts.
    if (!AddNormFactor(root->output(), true, out, members) || !out.s) return std::nullopt;
    return out;
  }
  std::vector<Value*> factors;
  if (!ProductFactors(root, factors, members)) return std::nullopt;
  for (Value* f : factors)
    if (!AddNormFactor(f, HasSingleUse(f), out, members)) return std::nullopt;
  if (!out.s) return std::nullopt;
  return out;
}

// eps when `s` = stat + eps (either order) with eps a one-element constant; sets *stat.
std::optional<float> EpsilonOf(const Value* s, Value** stat, std::vector<Node*>& members) {
  Node* add = ProducerOf(s, op::Add);
  if (!add) return std::nullopt;
  for (auto [x, c] : OperandOrders(*add)) {
    if (std::optional<double> eps = match::ScalarConstant(c, kScalar)) {
      *stat = x;
      members.push_back(add);
      return static_cast<float>(*eps);
    }
  }
  return std::nullopt;
}

// Whether a norm parameter (RMSNorm weight, LayerNorm gamma / beta) of shape [d], [1] or []
// with x's dtype can be an input of the normalization op over x's last dim.
bool IsRowParam(const Value* p, const Value* x) {
  if (!p || p->dtype() != x->dtype() || p->shape().size() > 1) return false;
  return p->shape().empty() || p->shape()[0] == 1 || p->shape()[0] == x->shape().back();
}

// ---- the patterns: one matcher each, returning the replacement or nothing ----

// x * (1/sqrt(mean(x^2, -1) + eps)) [* weight], or x / sqrt(...) [* weight] -> RMSNorm.
std::optional<Match> MatchRmsNorm(Node* root) {
  if (!root->is(op::Mul) && !root->is(op::Div)) return std::nullopt;
  Match m{"RMSNorm", {}, {}, {}, root};
  std::optional<ScaledBySqrt> q = MatchScaledBySqrt(root, m.members);
  if (!q) return std::nullopt;
  Value* mean = nullptr;
  std::optional<float> eps = EpsilonOf(q->s, &mean, m.members);
  if (!eps) return std::nullopt;
  Value* sq = LastAxisReduceOf(mean, op::ReduceMean, m.members);
  Value* x = sq ? SquareOf(sq, m.members) : nullptr;
  if (!x || !TakeFactor(q->numerators, x) || q->numerators.size() > 1) return std::nullopt;
  Value* weight = q->numerators.empty() ? nullptr : q->numerators[0];
  if (weight && !IsRowParam(weight, x)) return std::nullopt;
  m.inputs = weight ? std::vector<Value*>{x, weight} : std::vector<Value*>{x};
  m.attrs = {{"axis", int64_t{-1}}, {"epsilon", *eps}};
  return m;
}

// d = x - mean(x, -1); d / sqrt(mean(d^2, -1) + eps) [* gamma] [+ beta] -> LayerNormalization.
std::optional<Match> MatchLayerNorm(Node* root) {
  Match m{"LayerNormalization", {}, {}, {}, root};
  Node* core = root;
  Value* beta = nullptr;
  if (root->is(op::Add) && root->inputs().size() == 2) {
    // The normalized product is one operand (feeding only this Add), beta the other.
    core = nullptr;
    for (auto [v, other] : OperandOrders(*root)) {
      Node* p = HasSingleUse(v) ? v->producer() : nullptr;
      if (p && (p->is(op::Mul) || p->is(op::Div))) {
        core = p;
        beta = other;
        break;
      }
    }
    if (!core) return std::nullopt;
    m.members.push_back(root);
  } else if (!root->is(op::Mul) && !root->is(op::Div)) {
    return std::nullopt;
  }
  std::optional<ScaledBySqrt> q = MatchScaledBySqrt(core, m.members);
  if (!q) return std::nullopt;
  Value* var = nullptr;
  std::optional<float> eps = EpsilonOf(q->s, &var, m.members);
  if (!eps) return std::nullopt;
  Value* sq = LastAxisReduceOf(var, op::ReduceMean, m.members);
  Value* d = sq ? SquareOf(sq, m.members) : nullptr;
  Node* sub = ProducerOf(d, op::Sub);
  if (!sub || sub->inputs().size() != 2) return std::nullopt;
  m.members.push_back(sub);
  Value* x = sub->input(0);
  if (LastAxisReduceOf(sub->input(1), op::ReduceMean, m.members) != x) return std::nullopt;
  if (!TakeFactor(q->numerators, d) || q->numerators.size() > 1) return std::nullopt;
  Value* gamma = q->numerators.empty() ? nullptr : q->numerators[0];
  if ((gamma && !IsRowParam(gamma, x)) || (beta && !IsRowParam(beta, x))) return std::nullopt;
  if (x->shape().empty()) return std::nullopt;
  m.inputs = {x, gamma};
  if (!gamma) m.unit_scale_dim = x->shape().back();
  if (beta) m.inputs.push_back(beta);
  m.attrs = {{"axis", int64_t{-1}}, {"epsilon", *eps}};
  return m;
}

// Splits a GELU product {x, 0.5, 1 + f(...)} where f is the op `inner` (Erf or Tanh): returns
// f's node and x candidates are checked by the caller. Members get the Add and f.
Node* GeluOuter(Node* root, op::Id inner, std::vector<Value*>& factors, std::vector<Node*>& members) {
  if (!ProductFactors(root, factors, members) || factors.size() != 3 || !TakeConstFactor(factors, 0.5))
    return nullptr;
  for (int k = 0; k < 2; ++k) {
    Value* a = factors[k];
    Node* add = SingleUseProducer(a, op::Add);
    if (!add) continue;
    Node* f = ProducerOf(match::OperandBesideScalar(*add, 1.0, kScalar), inner);
    if (!f) continue;
    members.push_back(add);
    members.push_back(f);
    factors.erase(factors.begin() + k);  // leaves x
    return f;
  }
  return nullptr;
}

// x * 0.5 * (1 + Erf(x / sqrt2)) (or x * (1/sqrt2)), any association / order -> Gelu.
std::optional<Match> MatchGeluErf(Node* root) {
  if (!root->is(op::Mul)) return std::nullopt;
  Match m{"Gelu", {}, {}, {}, root};
  std::vector<Value*> factors;
  Node* erf = GeluOuter(root, op::Erf, factors, m.members);
  if (!erf) return std::nullopt;
  Value* x = factors[0];
  // Erf's argument: x / sqrt2 or x * (1/sqrt2).
  Node* div = ProducerOf(erf->input(0), op::Div);
  Node* mul = ProducerOf(erf->input(0), op::Mul);
  const bool by_div = div && div->input(0) == x && IsScalarConstant(div->input(1), kSqrt2, kScalar);
  const bool by_mul = mul && match::OperandBesideScalar(*mul, 1.0 / kSqrt2, kScalar) == x;
  if (!by_div && !by_mul) return std::nullopt;
  m.members.push_back(by_div ? div : mul);
  m.inputs = {x};
  return m;
}

// 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow(x, 3) or x*x*x -> GeluTanh.
std::optional<Match> MatchGeluTanh(Node* root) {
  if (!root->is(op::Mul)) return std::nullopt;
  Match m{"GeluTanh", {}, {}, {}, root};
  std::vector<Value*> factors;
  Node* tanh = GeluOuter(root, op::Tanh, factors, m.members);
  if (!tanh) return std::nullopt;
  Value* x = factors[0];
  // tanh's argument: {sqrt(2/pi), x + 0.044715 x^3}
  std::vector<Value*> outer;
  Node* u = ProducerOf(tanh->input(0), op::Mul);
  if (!u || !ProductFactors(u, outer, m.members) || outer.size() != 2 || !TakeConstFactor(outer, kSqrt2OverPi))
    return std::nullopt;
  Node* sum = ProducerOf(outer[0], op::Add);
  Value* cubic = sum ? OtherOperand(*sum, x) : nullptr;
  Node* cubic_mul = ProducerOf(cubic, op::Mul);
  if (!cubic_mul) return std::nullopt;
  m.members.push_back(sum);
  // 0.044715 * x^3 as factors, with Pow(x, 3) counted as x, x, x.
  std::vector<Value*> inner;
  if (!ProductFactors(cubic_mul, inner, m.members) || !TakeConstFactor(inner, kGeluCubic)) return std::nullopt;
  int xs = 0;
  for (Value* f : inner) {
    Node* p = ProducerOf(f, op::Pow);
    if (f == x) {
      ++xs;
    } else if (p && p->input(0) == x && IsScalarConstant(p->input(1), 3.0, kScalar)) {
      xs += 3;
      m.members.push_back(p);
    } else if (p && p->input(0) == x && IsScalarConstant(p->input(1), 2.0, kScalar)) {
      xs += 2;
      m.members.push_back(p);
    } else {
      return std::nullopt;
    }
  }
  if (xs != 3) return std::nullopt;
  m.inputs = {x};
  return m;
}

// x * Sigmoid(x), either order -> Silu.
std::optional<Match> MatchSilu(Node* root) {
  if (!root->is(op::Mul)) return std::nullopt;
  for (auto [x, s] : OperandOrders(*root)) {
    Node* sig = ProducerOf(s, op::Sigmoid);
    if (sig && sig->input(0) == x) return Match{"Silu", {x}, {}, {sig, root}, root};
  }
  return std::nullopt;
}

// e = Exp(x - ReduceMax(x, -1)); e / ReduceSum(e, -1) -> Softmax(axis -1).
std::optional<Match> MatchSoftmax(Node* root) {
  if (!root->is(op::Div) || root->inputs().size() != 2) return std::nullopt;
  Match m{"Softmax", {}, {}, {root}, root};
  Value* e = root->input(0);
  Node* exp = ProducerOf(e, op::Exp);
  if (!exp || LastAxisReduceOf(root->input(1), op::ReduceSum, m.members) != e) return std::nullopt;
  Node* sub = ProducerOf(exp->input(0), op::Sub);
  if (!sub || sub->inputs().size() != 2) return std::nullopt;
  Value* x = sub->input(0);
  if (LastAxisReduceOf(sub->input(1), op::ReduceMax, m.members) != x) return std::nullopt;
  m.members.push_back(exp);
  m.members.push_back(sub);
  m.inputs = {x};
  m.attrs = {{"axis", int64_t{-1}}};
  return m;
}

// x when `v` = rotate_half(x) = Concat(Neg(Slice(x, d/2..d)), Slice(x, 0..d/2), axis -1).
Value* RotateHalfOf(const Value* v, std::vector<Node*>& members) {
  Node* cat = ProducerOf(v, op::Concat);
  if (!cat || cat->inputs().size() != 2 || !cat->input(0) || !cat->input(1)) return nullptr;
  Node* neg = ProducerOf(cat->input(0), op::Neg);
  Node* hi = neg ? ProducerOf(neg->input(0), op::Slice) : nullptr;
  Node* lo = ProducerOf(cat->input(1), op::Slice);
  if (!hi || !lo || hi->input(0) != lo->input(0)) return nullptr;
  Value* x = lo->input(0);
  if (x->shape().empty() || !match::IsLastAxis(cat->GetInt("axis", 0), x->shape().size())) return nullptr;
  const int64_t d = x->shape().back();
  if (d % 2 != 0 || match::LastAxisSliceRange(*hi) != std::make_pair(d / 2, d) ||
      match::LastAxisSliceRange(*lo) != std::make_pair(int64_t{0}, d / 2))
    return nullptr;
  members.insert(members.end(), {cat, neg, hi, lo});
  return x;
}

// Whether table t (cos / sin) can be a Rope input for x: x's dtype, broadcasting to x's shape.
bool IsRopeTable(const Value* t, const Value* x) {
  return t && t->dtype() == x->dtype() && match::BroadcastsTo(t->shape(), x->shape());
}

// x * cos + rotation(x) * sin, any operand order -> Rope(x, cos, sin){attrs}.
using RotationOf = Value* (*)(const Value*, std::vector<Node*>&);
std::optional<Match> MatchRopeRotating(Node* root, RotationOf rotation, const AttributeMap& attrs) {
  if (!root->is(op::Add)) return std::nullopt;
  for (auto [by_cos, by_sin] : OperandOrders(*root)) {
    Node* mc = ProducerOf(by_cos, op::Mul);
    Node* ms = ProducerOf(by_sin, op::Mul);
    if (!mc || !ms) continue;
    for (auto [rotated, sin] : OperandOrders(*ms)) {
      Match m{"Rope", {}, attrs, {root, mc, ms}, root};
      Value* x = rotation(rotated, m.members);
      if (!x) continue;
      Value* cos = OtherOperand(*mc, x);
      if (!IsRopeTable(cos, x) || !IsRopeTable(sin, x)) continue;
      m.inputs = {x, cos, sin};
      return m;
    }
  }
  return std::nullopt;
}

// x * cos + rotate_half(x) * sin -> Rope(x, cos, sin).
std::optional<Match> MatchRope(Node* root) { return MatchRopeRotating(root, RotateHalfOf, {}); }

// x when `v` = rotate_every_two(x) as GPT-J writes it: the pairs (-x[2i+1], x[2i]) stacked and
// viewed back as x, Reshape(Concat(Unsqueeze(Neg(x[..., 1::2]), -1), Unsqueeze(x[..., 0::2], -1))).
Value* RotateEveryTwoOf(const Value* v, std::vector<Node*>& members) {
  Node* view = ProducerOf(v, op::Reshape);
  Node* cat = view ? ProducerOf(view->input(0), op::Concat) : nullptr;
  if (!cat || cat->inputs().size() != 2) return nullptr;
  const Value* stacked = cat->output();
  if (stacked->shape().empty() || stacked->shape().back() != 2 ||
      !match::IsLastAxis(cat->GetInt("axis", 0), stacked->shape().size()))
    return nullptr;
  Node* u_odd = ProducerOf(cat->input(0), op::Unsqueeze);
  Node* u_even = ProducerOf(cat->input(1), op::Unsqueeze);
  Node* neg = u_odd ? ProducerOf(u_odd->input(0), op::Neg) : nullptr;
  Node* odd = neg ? ProducerOf(neg->input(0), op::Slice) : nullptr;
  Node* even = u_even ? ProducerOf(u_even->input(0), op::Slice) : nullptr;
  if (!odd || !even || odd->input(0) != even->input(0)) return nullptr;
  Value* x = odd->input(0);
  Shape unsq = neg->output()->shape();
  unsq.push_back(1);
  if (u_odd->output()->shape() != unsq || u_even->output()->shape() != unsq || view->output()->shape() != x->shape() ||
      match::LastAxisEveryOther(*odd) != 1 || match::LastAxisEveryOther(*even) != 0)
    return nullptr;
  members.insert(members.end(), {view, cat, u_odd, u_even, neg, odd, even});
  return x;
}

// x * cos + rotate_every_two(x) * sin -> Rope(x, cos, sin){interleaved = 1}.
std::optional<Match> MatchInterleavedRope(Node* root) {
  return MatchRopeRotating(root, RotateEveryTwoOf, {{"interleaved", int64_t{1}}});
}

// Partial rotary (GPT-NeoX, Phi: the first r of d values rotated, the rest passed through):
// Concat(Rope(Slice(x, 0:r), cos, sin), Slice(x, r:d)) on the last axis
// -> Rope(x, cos, sin){rotary_dim = r}.
std::optional<Match> MatchPartialRope(Node* root) {
  if (!root->is(op::Concat) || root->inputs().size() != 2) return std::nullopt;
  Node* rope = ProducerOf(root->input(0), op::Rope);
  Node* pass = ProducerOf(root->input(1), op::Slice);
  if (!rope || !pass || rope->GetInt("rotary_dim", 0) != 0) return std::nullopt;
  Node* rot = ProducerOf(rope->input(0), op::Slice);
  if (!rot || rot->input(0) != pass->input(0)) return std::nullopt;
  Value* x = rot->input(0);
  if (x->shape().empty() || !match::IsLastAxis(root->GetInt("axis", 0), x->shape().size())) return std::nullopt;
  const int64_t d = x->shape().back();
  const auto rot_range = match::LastAxisSliceRange(*rot);
  if (!rot_range || rot_range->first != 0) return std::nullopt;
  const int64_t r = rot_range->second;
  if (r <= 0 || r >= d || r % 2 != 0 || match::LastAxisSliceRange(*pass) != std::make_pair(r, d)) return std::nullopt;
  Match m{"Rope", {x, rope->input(1), rope->input(2)}, {{"rotary_dim", r}}, {root, rope, rot, pass}, root};
  if (rope->GetInt("interleaved", 0) != 0) m.attrs["interleaved"] = int64_t{1};
  return m;
}

using Matcher = std::optional<Match> (*)(Node*);
// LayerNorm before RMSNorm: a LayerNorm's core d / sqrt(mean(d^2) + eps) is also an RMSNorm of
// d = x - mean(x), and the larger pattern should win.
constexpr Matcher kMatchers[] = {MatchLayerNorm, MatchRmsNorm, MatchGeluErf, MatchGeluTanh,
                                 MatchSilu,      MatchSoftmax, MatchRope,    MatchInterleavedRope,
                                 MatchPartialRope};

// ---- acceptance and rewrite ----

// The legality checks shared by every pattern (see the note at the top).
bool Acceptable(Match& m) {
  std::sort(m.members.begin(), m.members.end());
  m.members.erase(std::unique(m.members.begin(), m.members.end()), m.members.end());
  const Value* x = m.inputs.empty() ? nullptr : m.inputs[0];
  const Value* out = m.root->output();
  if (!x || !IsFloat(x->dtype()) || out->dtype() != x->dtype() || out->shape() != x->shape()) return false;
  if (m.root->outputs().size() != 1) return false;
  const std::set<const Node*> inside(m.members.begin(), m.members.end());
  for (const Node* n : m.members) {
    for (const Value* o : n->outputs()) {
      if (o->dtype() != x->dtype()) return false;
      if (n != m.root && match::IsUsedOutside(o, inside)) return false;
    }
  }
  return true;
}

// The new node's name: the members' common scope + op ("/input_norm/RMSNorm"), else the last
// member's name + "_" + op in lower case ("/Add_1_rope"); made unique among the graph's nodes.
std::string NodeName(const Graph& g, const std::vector<Node*>& ordered, const std::string& op) {
  std::string prefix = ordered.front()->name();
  for (const Node* n : ordered) {
    size_t k = 0;
    while (k < prefix.size() && k < n->name().size() && prefix[k] == n->name()[k]) ++k;
    prefix.resize(k);
  }
  const size_t slash = prefix.rfind('/');
  prefix = slash == std::string::npos ? "" : prefix.substr(0, slash + 1);
  std::string lower = op;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string name = prefix.size() > 1 ? prefix + op : ordered.back()->name() + "_" + lower;
  std::set<std::string> taken;
  for (const auto& n : g.nodes()) taken.insert(n->name());
  const std::string base = name;
  for (int i = 1; taken.count(name); ++i) name = StrCat(base, "_", i);
  return name;
}

// Replaces the match by one node; false (graph untouched) if the new node's inference refuses
// its inputs, which the matchers are meant to rule out.
Result<bool> Rewrite(Graph& g, Match& m) {
  std::map<const Node*, size_t> position;
  for (const auto& n : g.nodes()) position.emplace(n.get(), position.size());
  std::vector<Node*> ordered = m.members;
  std::sort(ordered.begin(), ordered.end(), [&](Node* a, Node* b) { return position[a] < position[b]; });
  std::string from;
  for (const Node* n : ordered) from += (from.empty() ? "" : ", ") + n->name();
  m.attrs["canonicalized_from"] = from;
  if (m.unit_scale_dim >= 0) {
    GF_ASSIGN_OR_RETURN(Tensor ones, Tensor::FromFloats(m.inputs[0]->dtype(), {m.unit_scale_dim},
                                                        std::vector<float>(m.unit_scale_dim, 1.f)));
    GF_ASSIGN_OR_RETURN(m.inputs[1], g.AddConstant(g.FreshName(m.root->name() + "_unit_scale"),
                                                   std::make_shared<const Tensor>(std::move(ones))));
  }
  Value* old = m.root->output();
  auto node = g.AddNode(m.op, m.inputs, m.attrs, NodeName(g, ordered, m.op), 1);
  if (!node.ok()) {
    g.RemoveDeadNodes();  // the unit-scale constant, if one was made
    return false;
  }
  Value* out = (*node)->output();
  if (out->dtype() != old->dtype() || out->shape() != old->shape()) {
    const std::string what = StrCat((*node)->Describe(), " computes ", out->TypeString(), " in place of '",
                                    old->name(), "' ", old->TypeString());
    g.RemoveNode(*node);
    return Internal(what);
  }
  const std::string name = old->name();
  g.ReplaceAllUsesWith(old, out);
  GF_RETURN_IF_ERROR(g.RenameValue(old, g.FreshName(name + "_decomposed")));
  GF_RETURN_IF_ERROR(g.RenameValue(out, name));
  return true;
}

}  // namespace

namespace {

// A linear layer exported as Gemm (nn.Linear on 2-D input: Gemm(A, W, b, transB=1)) with
// constant weights becomes MatMul(A, W^T folded) + Add(b): the projection FuseGemm groups
// horizontally and the bias add an epilogue it absorbs (with whatever elementwise ops follow,
// which FuseElementwise joins to the add first). Only alpha = 1, transA = 0 and a constant bias
// with beta = 1 (or none): anything else keeps the Gemm.
Result<int> SplitLinearGemms(Graph& g) {
  std::vector<Node*> gemms;
  for (const auto& n : g.nodes())
    if (n->is(op::Gemm)) gemms.push_back(n.get());
  int split = 0;
  for (Node* n : gemms) {
    Value* a = n->input(0);
    Value* w = n->input(1);
    Value* c = n->input(2);
    if (!w->constant() || !IsFloat(a->dtype()) || w->dtype() != a->dtype()) continue;
    if (n->GetInt("transA", 0) != 0 || n->GetFloat("alpha", 1.f) != 1.f) continue;
    if (c && (!c->constant() || n->GetFloat("beta", 1.f) != 1.f)) continue;
    std::shared_ptr<const Tensor> weights = w->constant();
    if (n->GetInt("transB", 0) != 0) {  // fold the transpose: [N, K] -> [K, N]
      const Tensor* sources[] = {weights.get()};
      GF_ASSIGN_OR_RETURN(weights, DeriveTensor(g.prepared_store(), sources, "transpose [N,K] -> [K,N]",
                                                [&]() -> Result<Tensor> {
        const int64_t nn = w->shape()[0], kk = w->shape()[1];
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(w->dtype(), {kk, nn}));
        const size_t es = DTypeSize(w->dtype());
        const auto* src = static_cast<const std::byte*>(w->constant()->data());
        auto* dst = static_cast<std::byte*>(t.data());
        for (int64_t i = 0; i < nn; ++i)
          for (int64_t j = 0; j < kk; ++j) std::memcpy(dst + (j * nn + i) * es, src + (i * kk + j) * es, es);
        return t;
      }));
    }
    GF_ASSIGN_OR_RETURN(Value * wk, g.AddConstant(g.FreshName(w->name() + "_kn"), weights));
    GF_ASSIGN_OR_RETURN(Node * mm, g.AddNode("MatMul", {a, wk}, {}, n->name()));
    Value* out = mm->output();
    if (c) {
      GF_ASSIGN_OR_RETURN(Node * add, g.AddNode("Add", {out, c}, {}, n->name() + "/bias"));
      out = add->output();
    }
    if (out->shape() != n->output()->shape()) return Internal("Gemm '", n->name(), "': split form has another shape");
    const std::string name = n->output()->name();
    g.ReplaceAllUsesWith(n->output(), out);
    g.RemoveNode(n);
    GF_RETURN_IF_ERROR(g.RenameValue(out, name));
    ++split;
  }
  if (split) {
    g.RemoveDeadNodes();
    GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("Canonicalize"));
  }
  return split;
}

}  // namespace

namespace {

// Whether node n returns its input 0 unchanged: a Cast to the dtype it already has (exporters
// write them around norms and softmaxes that upcast in mixed precision), a Concat of one input,
// an Identity, an Expand to the shape it has, a Mul by a scalar 1 (transformers' RoPE
// attention_scaling) that broadcasts nothing.
bool IsIdentityNode(const Node& n) {
  if (n.inputs().empty() || n.outputs().size() != 1 || !n.input(0)) return false;
  const Value* in = n.input(0);
  const Value* out = n.output();
  if (in->dtype() != out->dtype() || in->shape() != out->shape()) return false;
  if (n.inputs().size() == 1) return n.is(op::Cast) || n.is(op::Concat) || n.is(op::Identity);
  if (n.inputs().size() == 2 && n.is(op::Expand)) return true;
  return n.inputs().size() == 2 && n.is(op::Mul) && IsScalarConstant(n.input(1), 1.0, kScalar);
}

// Gather(data, indices, axis) whose indices are the constant 0, 1, ..., n-1 (n = data's dim
// `axis`, every dim before it 1) reads data in order: a view, written Reshape. transformers'
// masks gather the rows of a flattened [B*S, 1] mask with batch * S + arange(S).
bool IsInOrderGather(const Node& n) {
  if (!n.is(op::Gather) || n.inputs().size() != 2 || !n.input(0) || !n.input(1)) return false;
  const Shape& data = n.input(0)->shape();
  int64_t axis = n.GetInt("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(data.size());
  if (axis < 0 || axis >= static_cast<int64_t>(data.size())) return false;
  for (int64_t i = 0; i < axis; ++i)
    if (data[static_cast<size_t>(i)] != 1) return false;
  const std::optional<std::vector<int64_t>> idx = match::IntConstant(n.input(1));
  if (!idx || static_cast<int64_t>(idx->size()) != data[static_cast<size_t>(axis)]) return false;
  for (size_t i = 0; i < idx->size(); ++i)
    if ((*idx)[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// Identity nodes go: their readers read input 0. One whose result is a graph output stays (the
// output must keep its name and its own buffer). In-order Gathers become Reshapes.
Result<int> RemoveIdentities(Graph& g) {
  std::vector<Node*> identities, gathers;
  for (const auto& n : g.nodes()) {
    if (n->output(0)->is_graph_output()) continue;
    if (IsIdentityNode(*n)) identities.push_back(n.get());
    else if (IsInOrderGather(*n)) gathers.push_back(n.get());
  }
  for (Node* n : identities) {
    g.ReplaceAllUsesWith(n->output(), n->input(0));
    g.RemoveNode(n);
  }
  for (Node* n : gathers) {
    const Shape& s = n->output()->shape();
    GF_ASSIGN_OR_RETURN(Value * shape, match::AddIntsConstant(g, n->name() + "_shape", {s.begin(), s.end()}));
    GF_ASSIGN_OR_RETURN(Node * r, g.AddNode("Reshape", {n->input(0), shape}, {}, n->name()));
    GF_RETURN_IF_ERROR(match::ReplaceKeepingName(g, n, r->output()));
  }
  if (!gathers.empty()) {
    g.RemoveDeadNodes();
    GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("Canonicalize"));
  }
  return static_cast<int>(identities.size() + gathers.size());
}

// Whether n's results may differ between two runs on the same inputs (a random op).
bool IsRandom(const Node& n) {
  const Result<OpKind> kind = OpFromName(n.op());
  return kind.ok() && GetOpInfo(*kind).cls == OpClass::kRandom;
}

// Common subexpressions: a node that computes what an earlier node computes (the same op on the
// same input values, with equal attributes) goes, its readers reading the earlier node's
// results. Exporters write one per layer what every layer shares: the RoPE tables of the
// positions (Cos / Sin), the attention mask built from attention_mask; they are then built
// once per model. Random ops and nodes whose results are graph outputs stay.
Result<int> MergeDuplicates(Graph& g) {
  // Small constants stand for their contents (each op of an importer's conversion makes its own
  // axes / shape constants): the first of equal ones represents them all.
  std::map<std::string, const Value*> by_contents;
  auto representative = [&](const Value* v) {
    if (!v || !v->constant() || v->constant()->nbytes() > 256) return v;
    const Tensor& t = *v->constant();
    std::string key = StrCat(DTypeName(t.dtype()), ShapeToString(t.shape()), ":");
    key.append(static_cast<const char*>(t.data()), t.nbytes());
    return by_contents.emplace(std::move(key), v).first->second;
  };
  std::map<std::pair<std::string, std::vector<const Value*>>, std::vector<Node*>> seen;
  std::vector<Node*> order;
  for (const auto& n : g.nodes()) order.push_back(n.get());
  int merged = 0;
  for (Node* n : order) {
    if (IsRandom(*n)) continue;
    std::vector<const Value*> ins;
    for (const Value* v : n->inputs()) ins.push_back(representative(v));
    std::vector<Node*>& same_inputs = seen[{n->op(), std::move(ins)}];
    Node* same = nullptr;
    for (Node* c : same_inputs)
      if (c->attrs() == n->attrs() && c->outputs().size() == n->outputs().size()) same = c;
    bool output = false;
    for (const Value* o : n->outputs()) output |= o->is_graph_output();
    if (!same || output) {
      same_inputs.push_back(n);
      continue;
    }
    for (size_t k = 0; k < n->outputs().size(); ++k) g.ReplaceAllUsesWith(n->output(k), same->output(k));
    g.RemoveNode(n);
    ++merged;
  }
  if (merged > 0) GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("Canonicalize"));
  return merged;
}

// A swap of the last two dims written through a 3-D view, as the dynamo exporter writes K^T of
// scaled_dot_product_attention:
//   Reshape(x [L.., a, b] -> [N, a, b]) -> Transpose(perm 0,2,1) -> Reshape(-> [M.., b, a])
// with prod L = prod M = N is Transpose(x viewed as [M.., a, b], perm swapping the last two):
// a view the attention pass reads through (GQA's repeat_kv, [B,KV,R,T,d] -> [B,H,T,d]) and one
// Transpose. The two inner values must be read by the next step alone.
Result<int> UnfoldViewedTransposes(Graph& g) {
  std::vector<Node*> found;
  for (const auto& n : g.nodes()) {
    Node* r2 = n.get();
    if (!r2->is(op::Reshape)) continue;
    Node* t = match::SingleUseProducer(r2->input(0), op::Transpose);
    if (!t || t->GetInts("perm") != std::vector<int64_t>{0, 2, 1} || t->output()->is_graph_output()) continue;
    Node* r1 = match::SingleUseProducer(t->input(0), op::Reshape);
    if (!r1 || r1->output()->is_graph_output()) continue;
    const Shape& x = r1->input(0)->shape();
    const Shape& y = r2->output()->shape();
    if (x.size() < 3 || y.size() < 3) continue;
    const int64_t a = x[x.size() - 2], b = x.back();
    int64_t lead = 1, lead_y = 1;
    for (size_t i = 0; i + 2 < x.size(); ++i) lead *= x[i];
    for (size_t i = 0; i + 2 < y.size(); ++i) lead_y *= y[i];
    if (r1->output()->shape() != Shape{lead, a, b} || lead_y != lead || y[y.size() - 2] != b || y.back() != a)
      continue;
    found.push_back(r2);
  }
  for (Node* r2 : found) {
    Node* r1 = r2->input(0)->producer()->input(0)->producer();
    Value* x = r1->input(0);
    Shape viewed = r2->output()->shape();
    std::swap(viewed[viewed.size() - 2], viewed.back());
    if (viewed != x->shape()) {
      GF_ASSIGN_OR_RETURN(Value * shape, match::AddIntsConstant(g, r1->name() + "_shape", {viewed.begin(), viewed.end()}));
      GF_ASSIGN_OR_RETURN(Node * view, g.AddNode("Reshape", {x, shape}, {}, g.FreshName(r1->name() + "_view")));
      x = view->output();
    }
    std::vector<int64_t> perm(viewed.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[perm.size() - 2], perm.back());
    GF_ASSIGN_OR_RETURN(Node * t, g.AddNode("Transpose", {x}, {{"perm", perm}}, g.FreshName(r2->name() + "_transpose")));
    GF_RETURN_IF_ERROR(match::ReplaceKeepingName(g, r2, t->output()));
  }
  if (!found.empty()) {
    g.RemoveDeadNodes();
    GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("Canonicalize"));
  }
  return static_cast<int>(found.size());
}

}  // namespace

Result<int> Canonicalize(Graph& g) {
  GF_ASSIGN_OR_RETURN(int rewritten, RemoveIdentities(g));
  GF_ASSIGN_OR_RETURN(int merged, MergeDuplicates(g));
  GF_ASSIGN_OR_RETURN(int unpacked, SimplifyViewChains(g));
  GF_ASSIGN_OR_RETURN(int unfolded, UnfoldViewedTransposes(g));
  rewritten += merged + unpacked + unfolded;
  GF_ASSIGN_OR_RETURN(int split, SplitLinearGemms(g));
  rewritten += split;
  // Every rewrite replaces at least two nodes by one, so there are fewer rewrites than nodes;
  // the bound only guards that argument.
  const size_t max_rewrites = g.num_nodes();
  for (bool changed = true; changed && static_cast<size_t>(rewritten) < max_rewrites;) {
    changed = false;
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    for (auto it = order.rbegin(); it != order.rend() && !changed; ++it) {
      for (Matcher matcher : kMatchers) {
        std::optional<Match> m = matcher(*it);
        if (!m || !Acceptable(*m)) continue;
        GF_ASSIGN_OR_RETURN(changed, Rewrite(g, *m));
        if (changed) break;
      }
    }
    if (changed) {
      ++rewritten;
      g.RemoveDeadNodes();
      GF_RETURN_IF_ERROR(g.TopologicalSort().WithContext("Canonicalize"));
    }
  }
  return rewritten;
}

}  // namespace graphfuse

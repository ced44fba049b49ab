#include "passes/match.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ir/op_registry.h"
#include "ir/schemas/data_movement.h"

namespace graphfuse::match {

Node* ProducerOf(const Value* v, op::Id op) {
  return v && v->producer() && v->producer()->is(op) ? v->producer() : nullptr;
}

bool HasSingleUse(const Value* v) { return v && v->uses().size() == 1 && !v->is_graph_output(); }

const Use* SingleUse(const Value* v) { return HasSingleUse(v) ? &v->uses().front() : nullptr; }

Node* SingleUseProducer(const Value* v, op::Id op) {
  return HasSingleUse(v) ? ProducerOf(v, op) : nullptr;
}

bool IsUsedOutside(const Value* v, const Node* reader) {
  if (v->is_graph_output()) return true;
  for (const Use& u : v->uses())
    if (u.node != reader) return true;
  return false;
}

bool IsUsedOutside(const Value* v, const std::set<const Node*>& nodes) {
  if (v->is_graph_output()) return true;
  for (const Use& u : v->uses())
    if (!nodes.count(u.node)) return true;
  return false;
}

std::set<const Node*> ReachableFrom(const std::vector<const Node*>& from, const std::set<const Node*>& stop) {
  std::set<const Node*> seen;
  std::vector<const Node*> work(from.begin(), from.end());
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    for (const Value* o : n->outputs())
      for (const Use& u : o->uses())
        if (!stop.count(u.node) && seen.insert(u.node).second) work.push_back(u.node);
  }
  return seen;
}

bool IsElementwiseOp(const Node& n) {
  const OpSchema* s = FindSchema(n.op());
  return s && s->elementwise;
}

std::optional<double> ScalarConstant(const Value* v, ScalarRule rule) {
  if (!v || !v->constant() || v->numel() != 1) return std::nullopt;
  if (v->dtype() == DType::kBool || (!rule.integers && !IsFloat(v->dtype()))) return std::nullopt;
  if (rule.max_rank >= 0 && v->shape().size() > static_cast<size_t>(rule.max_rank)) return std::nullopt;
  return v->constant()->GetAsDouble(0);
}

bool IsScalarConstant(const Value* v, double c, ScalarRule rule) {
  const std::optional<double> got = ScalarConstant(v, rule);
  if (!got) return false;
  const float want = static_cast<float>(c);
  if (std::fabs(static_cast<float>(*got) - want) <= kScalarRelTol * std::fabs(want)) return true;
  // A narrow constant holds c as its dtype rounds it (sqrt(2) in bf16 is 1.4140625).
  if (v->dtype() == DType::kBF16) return static_cast<float>(*got) == BF16BitsToF32(F32ToBF16Bits(want));
  if (v->dtype() == DType::kF16) return static_cast<float>(*got) == F16BitsToF32(F32ToF16Bits(want));
  return false;
}

std::optional<std::vector<int64_t>> IntConstant(const Value* v) {
  if (!v || !v->constant()) return std::nullopt;
  const Tensor& t = *v->constant();
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kI64) std::copy_n(t.data_as<int64_t>(), out.size(), out.begin());
  else if (t.dtype() == DType::kI32) std::copy_n(t.data_as<int32_t>(), out.size(), out.begin());
  else return std::nullopt;
  return out;
}

std::optional<std::vector<float>> F32Constant(const Value* v) {
  if (!v || !v->constant() || v->dtype() != DType::kF32) return std::nullopt;
  const Tensor& t = *v->constant();
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

OperandOrders::OperandOrders(const Node& n) {
  if (n.inputs().size() != 2) return;
  orders_ = {Pair{n.input(0), n.input(1)}, Pair{n.input(1), n.input(0)}};
  count_ = 2;
}

Value* OtherOperand(const Node& n, const Value* v) {
  if (n.inputs().size() != 2) return nullptr;
  if (n.input(0) == v) return n.input(1);
  if (n.input(1) == v) return n.input(0);
  return nullptr;
}

Value* OperandBesideScalar(const Node& n, double c, ScalarRule rule) {
  for (auto [x, k] : OperandOrders(n))
    if (IsScalarConstant(k, c, rule)) return x;
  return nullptr;
}

bool HasOperands(const Node& n, const Value* a, const Value* b) {
  for (auto [x, y] : OperandOrders(n))
    if (x == a && y == b) return true;
  return false;
}

bool SameData(const Value* a, const Value* b) {
  if (a == b) return true;
  if (!a || !b || !a->constant() || !b->constant()) return false;
  const Tensor &x = *a->constant(), &y = *b->constant();
  return x.dtype() == y.dtype() && x.shape() == y.shape() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

bool IsLastAxis(int64_t axis, size_t rank) {
  return rank > 0 && (axis == -1 || axis == static_cast<int64_t>(rank) - 1);
}

std::optional<std::pair<int64_t, int64_t>> LastAxisSliceRange(const Node& n) {
  const Value* x = n.input(0);
  if (!n.is(op::Slice) || !x || x->shape().empty()) return std::nullopt;
  auto starts = IntConstant(n.input(1)), ends = IntConstant(n.input(2));
  std::optional<std::vector<int64_t>> axes, steps;
  if (n.input(3)) axes = IntConstant(n.input(3));
  if (n.input(4)) steps = IntConstant(n.input(4));
  if (!starts || !ends || (n.input(3) && !axes) || (n.input(4) && !steps)) return std::nullopt;
  auto p = schemas::ComputeSlice(x->shape(), *starts, *ends, axes.value_or(std::vector<int64_t>{}),
                                 steps.value_or(std::vector<int64_t>{}), axes.has_value(), steps.has_value(), n.name());
  if (!p.ok()) return std::nullopt;
  const size_t last = x->shape().size() - 1;
  for (size_t i = 0; i < x->shape().size(); ++i)
    if (p->step[i] != 1 || (i != last && p->out[i] != x->shape()[i])) return std::nullopt;
  return std::make_pair(p->start[last], p->start[last] + p->out[last]);
}

std::optional<int64_t> LastAxisEveryOther(const Node& n) {
  const Value* x = n.input(0);
  if (!n.is(op::Slice) || !x || x->shape().empty() || !n.input(4)) return std::nullopt;
  auto starts = IntConstant(n.input(1)), ends = IntConstant(n.input(2));
  std::optional<std::vector<int64_t>> axes, steps = IntConstant(n.input(4));
  if (n.input(3)) axes = IntConstant(n.input(3));
  if (!starts || !ends || (n.input(3) && !axes) || !steps) return std::nullopt;
  auto p = schemas::ComputeSlice(x->shape(), *starts, *ends, axes.value_or(std::vector<int64_t>{}), *steps,
                                 axes.has_value(), true, n.name());
  if (!p.ok()) return std::nullopt;
  const size_t last = x->shape().size() - 1;
  for (size_t i = 0; i < last; ++i)
    if (p->step[i] != 1 || p->out[i] != x->shape()[i]) return std::nullopt;
  const int64_t d = x->shape()[last];
  if (p->step[last] != 2 || d % 2 != 0 || p->start[last] > 1 || p->out[last] != d / 2) return std::nullopt;
  return p->start[last];
}

Result<Value*> AddIntsConstant(Graph& g, const std::string& name, const std::vector<int64_t>& v) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {static_cast<int64_t>(v.size())}));
  std::copy(v.begin(), v.end(), t.data_as<int64_t>());
  return g.AddConstant(g.FreshName(name), std::make_shared<const Tensor>(std::move(t)));
}

Status ReplaceKeepingName(Graph& g, Node* n, Value* now) {
  const std::string name = n->output()->name();
  g.ReplaceAllUsesWith(n->output(), now);
  g.RemoveNode(n);
  return g.RenameValue(now, name);
}

bool BroadcastsTo(const Shape& s, const Shape& to) {
  if (s.size() > to.size()) return false;
  const Shape both[2] = {s, to};
  const Result<Shape> r = BroadcastShapes(both);
  return r.ok() && *r == to;
}

}  // namespace graphfuse::match

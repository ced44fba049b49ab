// Einsum lowered to Transpose / ReduceSum / Reshape / MatMul / Mul (see einsum.h).
#include "onnx/einsum.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace graphfuse::onnx_import {
namespace {

// A label is a letter's character code, or kEllipsisLabel + j for dim j of the broadcast
// ellipsis (all operands' ellipses right-aligned, as numpy broadcasts them).
constexpr int kEllipsisToken = -1;
constexpr int kEllipsisLabel = 1000;

std::string LabelName(int label) {
  if (label >= kEllipsisLabel) return StrCat("...[", label - kEllipsisLabel, "]");
  return std::string(1, static_cast<char>(label));
}

// The letters of one term, with kEllipsisToken where "..." stands.
Result<std::vector<int>> Tokenize(const std::string& term, const std::string& where) {
  std::vector<int> tokens;
  for (size_t i = 0; i < term.size(); ++i) {
    const char c = term[i];
    if (std::isalpha(static_cast<unsigned char>(c))) {
      tokens.push_back(c);
    } else if (term.compare(i, 3, "...") == 0) {
      if (std::count(tokens.begin(), tokens.end(), kEllipsisToken))
        return InvalidArgument(where, ": term '", term, "' has two ellipses");
      tokens.push_back(kEllipsisToken);
      i += 2;
    } else {
      return InvalidArgument(where, ": term '", term, "' holds '", std::string(1, c),
                             "' (labels are letters and '...')");
    }
  }
  return tokens;
}

// Tokens with the ellipsis expanded to the last `ell` of the `total` ellipsis labels.
std::vector<int> Expand(const std::vector<int>& tokens, int64_t ell, int64_t total) {
  std::vector<int> labels;
  for (int t : tokens) {
    if (t != kEllipsisToken) {
      labels.push_back(t);
      continue;
    }
    for (int64_t j = total - ell; j < total; ++j) labels.push_back(kEllipsisLabel + static_cast<int>(j));
  }
  return labels;
}

bool Has(const std::vector<int>& labels, int l) { return std::find(labels.begin(), labels.end(), l) != labels.end(); }

// An operand on its way through the steps: the value, and the label and size of each dim.
struct Operand {
  int id;
  std::vector<int> labels;
  Shape shape;

  int64_t SizeOf(int l) const {
    for (size_t d = 0; d < labels.size(); ++d)
      if (labels[d] == l) return shape[d];
    return 1;
  }
};

class Lowering {
 public:
  explicit Lowering(int num_inputs) : next_id_(num_inputs) {}

  // Sums over the dims whose label `keep` rejects.
  template <class Keep>
  void SumOut(Operand& x, Keep keep) {
    std::vector<int64_t> axes;
    std::vector<int> labels;
    Shape shape;
    for (size_t d = 0; d < x.labels.size(); ++d) {
      if (keep(x.labels[d])) labels.push_back(x.labels[d]), shape.push_back(x.shape[d]);
      else axes.push_back(static_cast<int64_t>(d));
    }
    if (axes.empty()) return;
    Add(x, {"ReduceSum", {x.id}, {{"axes", axes}, {"keepdims", int64_t{0}}}, {}});
    x.labels = std::move(labels), x.shape = std::move(shape);
  }

  // Transposes x so that its dims come in the order of `order` (a permutation of its labels).
  void Permute(Operand& x, const std::vector<int>& order) {
    std::vector<int64_t> perm;
    Shape shape;
    for (int l : order) {
      const auto at = std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin();
      perm.push_back(at);
      shape.push_back(x.shape[at]);
    }
    bool identity = true;
    for (size_t d = 0; d < perm.size(); ++d) identity &= perm[d] == static_cast<int64_t>(d);
    if (identity) return;
    Add(x, {"Transpose", {x.id}, {{"perm", perm}}, {}});
    x.labels = order, x.shape = std::move(shape);
  }

  // Reshapes x to `shape` (the labels no longer describe the dims: the caller resets them).
  void Reshape(Operand& x, const Shape& shape) {
    if (shape == x.shape) return;
    Add(x, {"Reshape", {x.id}, {}, shape});
    x.shape = shape;
  }

  // A binary step (MatMul, Mul) of a and b; the result's labels and shape are the caller's.
  Operand Binary(const std::string& op, const Operand& a, const Operand& b, std::vector<int> labels, Shape shape) {
    Operand out{0, std::move(labels), std::move(shape)};
    Add(out, {op, {a.id, b.id}, {}, {}});
    return out;
  }

  std::vector<EinsumStep> Take() { return std::move(steps_); }

 private:
  void Add(Operand& x, EinsumStep step) {
    steps_.push_back(std::move(step));
    x.id = next_id_++;
  }

  int next_id_;
  std::vector<EinsumStep> steps_;
};

Shape SizesOf(const Operand& x, const std::vector<int>& labels) {
  Shape s;
  for (int l : labels) s.push_back(x.SizeOf(l));
  return s;
}

int64_t ProductOf(const Shape& s) {
  int64_t p = 1;
  for (int64_t d : s) p *= d;
  return p;
}

Shape Concat(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

Result<std::vector<EinsumStep>> LowerEinsum(const std::string& equation, const std::vector<Shape>& shapes) {
  const std::string where = StrCat("Einsum equation '", equation, "'");
  std::string eq;
  for (char c : equation)
    if (!std::isspace(static_cast<unsigned char>(c))) eq += c;
  const size_t arrow = eq.find("->");
  const bool explicit_out = arrow != std::string::npos;
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms(1);
  for (char c : lhs) {
    if (c == ',') terms.emplace_back();
    else terms.back() += c;
  }
  if (terms.size() != shapes.size())
    return InvalidArgument(where, " has ", terms.size(), " operand terms for ", shapes.size(), " inputs");
  if (shapes.size() > 2)
    return Unimplemented(where, ": ", shapes.size(), " operands are not supported (one or two)");

  // Each operand's labels, its ellipsis right-aligned within the widest one.
  std::vector<std::vector<int>> tokens;
  std::vector<int64_t> ell_rank;
  int64_t ell_total = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    GF_ASSIGN_OR_RETURN(std::vector<int> t, Tokenize(terms[i], where));
    const int64_t letters = static_cast<int64_t>(t.size()) - (Has(t, kEllipsisToken) ? 1 : 0);
    const int64_t rank = static_cast<int64_t>(shapes[i].size());
    const int64_t ell = Has(t, kEllipsisToken) ? rank - letters : 0;
    if (ell < 0 || (!Has(t, kEllipsisToken) && letters != rank))
      return InvalidArgument(where, ": term '", terms[i], "' does not fit input ", i, " of shape ",
                             ShapeToString(shapes[i]));
    tokens.push_back(std::move(t));
    ell_rank.push_back(ell);
    ell_total = std::max(ell_total, ell);
  }
  std::vector<Operand> ops;
  std::map<int, int64_t> size;  // each label's size, broadcast over the ellipsis
  for (size_t i = 0; i < tokens.size(); ++i) {
    Operand x{static_cast<int>(i), Expand(tokens[i], ell_rank[i], ell_total), shapes[i]};
    for (size_t d = 0; d < x.labels.size(); ++d) {
      const int l = x.labels[d];
      if (std::count(x.labels.begin(), x.labels.end(), l) > 1)
        return Unimplemented(where, ": label '", LabelName(l), "' repeats in operand ", i,
                             " (a diagonal), which is not supported");
      auto [it, fresh] = size.emplace(l, x.shape[d]);
      if (fresh || it->second == x.shape[d]) continue;
      if (l < kEllipsisLabel || (it->second != 1 && x.shape[d] != 1))
        return InvalidArgument(where, ": label '", LabelName(l), "' is ", it->second, " in one operand and ",
                               x.shape[d], " in operand ", i);
      it->second = std::max(it->second, x.shape[d]);
    }
    ops.push_back(std::move(x));
  }

  // The output's labels: as written, or (implicit) the ellipsis then the letters used once.
  std::vector<int> out;
  if (explicit_out) {
    GF_ASSIGN_OR_RETURN(std::vector<int> t, Tokenize(eq.substr(arrow + 2), where));
    out = Expand(t, ell_total, ell_total);
    for (int l : out) {
      if (!size.count(l)) return InvalidArgument(where, ": output label '", LabelName(l), "' is in no operand");
      if (std::count(out.begin(), out.end(), l) > 1)
        return InvalidArgument(where, ": output label '", LabelName(l), "' repeats");
    }
  } else {
    for (int64_t j = 0; j < ell_total; ++j) out.push_back(kEllipsisLabel + static_cast<int>(j));
    std::map<int, int> uses;
    for (const Operand& x : ops)
      for (int l : x.labels)
        if (l < kEllipsisLabel) ++uses[l];
    for (const auto& [l, n] : uses)
      if (n == 1) out.push_back(l);
  }

  Lowering low(static_cast<int>(shapes.size()));
  auto in_out = [&](int l) { return Has(out, l); };
  if (ops.size() == 1) {
    low.SumOut(ops[0], in_out);
    low.Permute(ops[0], out);
    return low.Take();
  }

  Operand& a = ops[0];
  Operand& b = ops[1];
  low.SumOut(a, [&](int l) { return in_out(l) || Has(b.labels, l); });
  low.SumOut(b, [&](int l) { return in_out(l) || Has(a.labels, l); });
  std::vector<int> batch, m, n, k;
  for (int l : out)
    if (Has(a.labels, l) && Has(b.labels, l)) batch.push_back(l);
  for (int l : a.labels) {
    if (!Has(b.labels, l)) m.push_back(l);
    else if (!in_out(l)) k.push_back(l);
  }
  for (int l : b.labels)
    if (!Has(a.labels, l)) n.push_back(l);
  for (int l : k)
    if (a.SizeOf(l) != b.SizeOf(l))
      return Unimplemented(where, ": the contracted ellipsis dim ", LabelName(l), " is ", a.SizeOf(l),
                           " in one operand and ", b.SizeOf(l),
                           " in the other (a broadcast contraction is not supported)");
  Shape out_batch;
  for (int l : batch) out_batch.push_back(std::max(a.SizeOf(l), b.SizeOf(l)));
  const Shape ms = SizesOf(a, m), ns = SizesOf(b, n);
  auto concat = [](std::vector<int> x, const std::vector<int>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  Operand r{};
  if (k.empty()) {
    // No contraction: an elementwise product of [batch, M, 1...] and [batch, 1..., N] (without
    // batch dims, [N] broadcasts as it is).
    low.Permute(a, concat(batch, m));
    low.Reshape(a, Concat(Concat(SizesOf(a, batch), ms), Shape(n.size(), 1)));
    low.Permute(b, concat(batch, n));
    low.Reshape(b, batch.empty() ? ns : Concat(Concat(SizesOf(b, batch), Shape(m.size(), 1)), ns));
    r = low.Binary("Mul", a, b, concat(concat(batch, m), n), Concat(Concat(out_batch, ms), ns));
  } else if (batch.empty() && !m.empty() && k.size() == 1 && n.size() == 1) {
    // [M..., K] x [K, N] (a projection such as "bsh,hd->bsd"): MatMul takes the leading dims as
    // they are, so the GEMM passes see MatMul(x, W) itself.
    low.Permute(a, concat(m, k));
    low.Permute(b, concat(k, n));
    r = low.Binary("MatMul", a, b, concat(m, n), Concat(ms, ns));
  } else {
    // [batch, M, K] x [batch, K, N] as one (batched) GEMM.
    const int64_t ks = ProductOf(SizesOf(a, k));
    low.Permute(a, concat(concat(batch, m), k));
    low.Reshape(a, Concat(SizesOf(a, batch), {ProductOf(ms), ks}));
    low.Permute(b, concat(concat(batch, k), n));
    low.Reshape(b, Concat(SizesOf(b, batch), {ks, ProductOf(ns)}));
    r = low.Binary("MatMul", a, b, {}, Concat(out_batch, {ProductOf(ms), ProductOf(ns)}));
    low.Reshape(r, Concat(Concat(out_batch, ms), ns));
    r.labels = concat(concat(batch, m), n);
  }
  low.Permute(r, out);
  return low.Take();
}

}  // namespace graphfuse::onnx_import

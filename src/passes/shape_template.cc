#include "passes/shape_template.h"

#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/hash.h"
#include "core/prepared_store.h"

namespace graphfuse {
namespace {

// How a tensor's contents enter the flat form: small integer tensors (shapes, axes) as
// integers that may move; a tensor repeating one value by that value (its size may move); a
// causal mask (below, triangular) by its two values and its diagonal; other small ones by a hash
// of their bytes; large ones (weights) by identity, which plans of a model share (the prepared
// store).
enum class Content { kSmallInts, kFill, kTriangular, kHashed, kIdentity };
constexpr int64_t kSmallInts = 16;
constexpr size_t kHashedBytes = 4096;

// A tensor whose every [R, C] matrix (its last two dims, R and C at least 2, the leading dims
// repeating it) holds `lo` where j - i <= diagonal and `hi` elsewhere, lo != hi: the causal
// masks exporters fold. `diagonal`: how many columns past the main diagonal are lo.
struct Triangle {
  int64_t diagonal = 0;
};
std::optional<Triangle> TriangleOf(const Tensor& t) {
  const Shape& s = t.shape();
  if (s.size() < 2 || s[s.size() - 2] < 2 || s.back() < 2) return std::nullopt;
  const int64_t rows = s[s.size() - 2], cols = s.back();
  const size_t es = DTypeSize(t.dtype());
  const auto* b = static_cast<const char*>(t.data());
  auto at = [&](int64_t k) { return b + k * static_cast<int64_t>(es); };
  const char* lo = at((rows - 1) * cols);  // bottom left
  const char* hi = at(cols - 1);           // top right
  if (std::memcmp(lo, hi, es) == 0) return std::nullopt;
  int64_t diagonal = -1;
  while (diagonal + 1 < cols && std::memcmp(at(diagonal + 1), lo, es) == 0) ++diagonal;
  for (int64_t k = 0; k < t.numel(); ++k) {
    const int64_t i = k / cols % rows, j = k % cols;
    if (std::memcmp(at(k), j - i <= diagonal ? lo : hi, es) != 0) return std::nullopt;
  }
  return Triangle{diagonal};
}

// `diagonal`, when given, receives a triangle's.
Content Classify(const Tensor& t, int64_t* diagonal = nullptr) {
  if (t.dtype() == DType::kI64 && t.numel() <= kSmallInts) return Content::kSmallInts;
  const size_t es = DTypeSize(t.dtype());
  const auto* b = static_cast<const char*>(t.data());
  bool fill = t.numel() >= 2;
  for (int64_t i = 1; fill && i < t.numel(); ++i) fill = std::memcmp(b, b + i * es, es) == 0;
  if (fill) return Content::kFill;
  if (t.nbytes() <= (size_t{64} << 20)) {
    if (const std::optional<Triangle> tri = TriangleOf(t)) {
      if (diagonal) *diagonal = tri->diagonal;
      return Content::kTriangular;
    }
  }
  return t.nbytes() <= kHashedBytes ? Content::kHashed : Content::kIdentity;
}

std::string Hex(const void* p, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<const unsigned char*>(p)[i]);
    s += buf;
  }
  return s;
}

class Flattener {
 public:
  explicit Flattener(FlatGraph& f) : f_(f) {}

  void Graph_(const Graph& g) {
    f_.structure += StrCat("graph ", g.name(), "{");
    for (const Value* v : g.inputs()) {
      f_.structure += StrCat("in ", v->name(), " ", DTypeName(v->dtype()));
      Dims(v->shape());
    }
    for (const Value* c : g.constants()) {
      f_.structure += StrCat("c ", c->name(), " ");
      Tensor_(*c->constant());
    }
    for (const auto& n : g.nodes()) {
      f_.structure += StrCat("n ", n->op(), " ", n->name(), "(");
      for (const Value* in : n->inputs()) f_.structure += StrCat(in ? in->name() : std::string("_"), ",");
      f_.structure += ")->(";
      for (const Value* o : n->outputs()) {
        f_.structure += StrCat(o->name(), " ", DTypeName(o->dtype()));
        Dims(o->shape());
        f_.structure += ",";
      }
      f_.structure += "){";
      for (const auto& [key, a] : n->attrs()) {
        f_.structure += StrCat(key, "=");
        Attr(key, a);
        f_.structure += ";";
      }
      f_.structure += "}";
    }
    f_.structure += "out";
    for (const Value* v : g.outputs()) f_.structure += StrCat(" ", v->name());
    f_.structure += "}";
  }

 private:
  void Dims(const Shape& s) {
    f_.structure += StrCat("[", s.size(), "]");
    f_.ints.insert(f_.ints.end(), s.begin(), s.end());
  }

  void Tensor_(const Tensor& t) {
    f_.structure += DTypeName(t.dtype());
    Dims(t.shape());
    int64_t diagonal = 0;
    const Content content = Classify(t, &diagonal);
    f_.contents.push_back(static_cast<uint8_t>(content));
    switch (content) {
      case Content::kSmallInts:
        f_.structure += " ints";
        f_.ints.insert(f_.ints.end(), t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
        break;
      case Content::kFill: f_.structure += StrCat(" fill ", Hex(t.data(), DTypeSize(t.dtype()))); break;
      case Content::kTriangular: {
        const Shape& s = t.shape();
        const size_t es = DTypeSize(t.dtype());
        const auto* b = static_cast<const char*>(t.data());
        f_.structure += StrCat(" triangle ", Hex(b + (s[s.size() - 2] - 1) * s.back() * static_cast<int64_t>(es), es), " ",
                               Hex(b + (s.back() - 1) * static_cast<int64_t>(es), es));
        f_.ints.push_back(diagonal);
        break;
      }
      case Content::kHashed:
        f_.structure += StrCat(" bytes ", Hash8(std::string_view(static_cast<const char*>(t.data()), t.nbytes())));
        break;
      case Content::kIdentity: f_.structure += StrCat(" ", PreparedStore::Id(&t)); break;
    }
  }

  void Attr(const std::string& key, const Attribute& a) {
    if (const auto* i = std::get_if<int64_t>(&a)) {
      f_.structure += "i";
      f_.ints.push_back(*i);
    } else if (const auto* f = std::get_if<float>(&a)) {
      f_.structure += PreparedStore::Exact(*f);
    } else if (const auto* s = std::get_if<std::string>(&a)) {
      // A kernel's name hashes its sizes; it names the kernel and is no part of what it computes
      // on the CPU (Instantiate gives each instantiated plan a name of its own).
      f_.structure += key == "kernel_name" ? std::string("name") : StrCat("'", *s, "'");
    } else if (const auto* is = std::get_if<std::vector<int64_t>>(&a)) {
      f_.structure += StrCat("is", is->size());
      f_.ints.insert(f_.ints.end(), is->begin(), is->end());
    } else if (const auto* fs = std::get_if<std::vector<float>>(&a)) {
      for (float v : *fs) f_.structure += StrCat(PreparedStore::Exact(v), ",");
    } else if (const auto* t = std::get_if<std::shared_ptr<const Tensor>>(&a)) {
      Tensor_(**t);
    } else if (const auto* g = std::get_if<std::shared_ptr<const Graph>>(&a)) {
      const size_t begin = f_.ints.size(), contents = f_.contents.size();
      Graph_(**g);
      f_.subgraphs.push_back({g->get(), {begin, f_.ints.size()}, {contents, f_.contents.size()}});
    }
  }

  FlatGraph& f_;
};

// Rebuilds a graph of the same structure as `base` with the integers of `ints`, read in the
// order Flattener wrote them.
class Rebuilder {
 public:
  Rebuilder(const std::vector<int64_t>& ints, const std::vector<uint8_t>& contents, int64_t t,
            const std::map<const Graph*, std::pair<size_t, size_t>>& fixed,
            const std::map<const Graph*, std::pair<size_t, size_t>>& moving, bool references)
      : ints_(ints), contents_(contents), t_(t), fixed_(fixed), moving_(moving), references_(references) {}

  Result<std::shared_ptr<Graph>> Graph_(const Graph& base) {
    auto g = std::make_shared<Graph>(base.name());
    g->set_prepared_store(base.prepared_store_shared());
    std::unordered_map<const Value*, Value*> mapped;  // base value -> its counterpart
    for (const Value* v : base.inputs()) {
      GF_ASSIGN_OR_RETURN(Shape s, Dims(v->shape().size()));
      GF_ASSIGN_OR_RETURN(mapped[v], g->AddInput(v->name(), v->dtype(), s));
    }
    for (const Value* c : base.constants()) {
      GF_ASSIGN_OR_RETURN(auto t, Tensor_(c->constant()));
      GF_ASSIGN_OR_RETURN(mapped[c], g->AddConstant(c->name(), std::move(t)));
    }
    for (const auto& n : base.nodes()) {
      std::vector<Value*> inputs;
      for (const Value* in : n->inputs()) {
        auto it = in ? mapped.find(in) : mapped.end();
        if (in && it == mapped.end())
          return Internal("shape template: '", in->name(), "' is not defined before ", n->Describe());
        inputs.push_back(in ? it->second : nullptr);
      }
      std::vector<ValueType> types;
      std::vector<std::string> names;
      for (const Value* o : n->outputs()) {
        GF_ASSIGN_OR_RETURN(Shape s, Dims(o->shape().size()));
        types.push_back({o->dtype(), std::move(s)});
        names.push_back(o->name());
      }
      AttributeMap attrs;
      for (const auto& [key, a] : n->attrs()) {
        if (!references_ && key == "reference") {
          const auto* g = std::get_if<std::shared_ptr<const Graph>>(&a);
          if (auto m = g ? moving_.find(g->get()) : moving_.end(); m != moving_.end()) {
            Skip(m->second);  // left out
            continue;
          }
        }
        GF_ASSIGN_OR_RETURN(attrs[key], Attr(key, a));
      }
      Node* made = g->AddNodeTyped(n->op(), inputs, std::move(attrs), types, n->name(), names);
      for (size_t k = 0; k < n->outputs().size(); ++k) mapped[n->output(k)] = made->output(k);
    }
    for (const Value* v : base.outputs()) GF_RETURN_IF_ERROR(g->MarkOutput(mapped.at(v)));
    return g;
  }

  bool consumed_all() const { return next_ == ints_.size() && next_content_ == contents_.size(); }

 private:
  Result<int64_t> Next() {
    if (next_ >= ints_.size()) return Internal("shape template: fewer integers than the graph holds");
    return ints_[next_++];
  }

  // Passes over a graph attribute not rebuilt: its (integers, constants) in the walk.
  void Skip(const std::pair<size_t, size_t>& held) {
    next_ += held.first;
    next_content_ += held.second;
  }

  Result<Shape> Dims(size_t rank) {
    Shape s;
    for (size_t k = 0; k < rank; ++k) {
      GF_ASSIGN_OR_RETURN(int64_t d, Next());
      if (d < 0) return InvalidArgument("shape template: a dim would be ", d, " at this step");
      s.push_back(d);
    }
    return s;
  }

  Result<std::shared_ptr<const Tensor>> Tensor_(const std::shared_ptr<const Tensor>& base) {
    GF_ASSIGN_OR_RETURN(Shape s, Dims(base->shape().size()));
    if (next_content_ >= contents_.size()) return Internal("shape template: fewer constants than the graph holds");
    switch (static_cast<Content>(contents_[next_content_++])) {
      case Content::kSmallInts: {
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, s));
        if (t.numel() != base->numel()) return Internal("shape template: a small integer tensor changed size");
        for (int64_t i = 0; i < t.numel(); ++i) {
          GF_ASSIGN_OR_RETURN(t.data_as<int64_t>()[i], Next());
        }
        return std::make_shared<const Tensor>(std::move(t));
      }
      case Content::kFill: {
        if (s == base->shape()) return base;
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(base->dtype(), s));
        const size_t es = DTypeSize(base->dtype());
        for (int64_t i = 0; i < t.numel(); ++i) std::memcpy(static_cast<char*>(t.data()) + i * es, base->data(), es);
        return std::make_shared<const Tensor>(std::move(t));
      }
      case Content::kTriangular: {
        GF_ASSIGN_OR_RETURN(int64_t diagonal, Next());
        if (s.size() < 2 || s[s.size() - 2] < 2 || s.back() < 2)
          return InvalidArgument("shape template: a causal mask of ", ShapeToString(s));
        const Shape& bs = base->shape();
        const size_t es = DTypeSize(base->dtype());
        const auto* bb = static_cast<const char*>(base->data());
        const char* lo = bb + (bs[bs.size() - 2] - 1) * bs.back() * static_cast<int64_t>(es);
        const char* hi = bb + (bs.back() - 1) * static_cast<int64_t>(es);
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(base->dtype(), s));
        const int64_t rows = s[s.size() - 2], cols = s.back();
        auto* out = static_cast<char*>(t.data());
        for (int64_t k = 0; k < t.numel(); ++k) {
          const int64_t i = k / cols % rows, j = k % cols;
          std::memcpy(out + k * static_cast<int64_t>(es), j - i <= diagonal ? lo : hi, es);
        }
        return std::make_shared<const Tensor>(std::move(t));
      }
      case Content::kHashed:
      case Content::kIdentity:
        if (s != base->shape()) return Internal("shape template: a constant's data changed size");
        return base;
    }
    return base;
  }

  Result<Attribute> Attr(const std::string& key, const Attribute& a) {
    if (std::holds_alternative<int64_t>(a)) {
      GF_ASSIGN_OR_RETURN(int64_t v, Next());
      return Attribute(v);
    }
    if (const auto* s = std::get_if<std::string>(&a); s && key == "kernel_name")
      return Attribute(StrCat(*s, t_ < 0 ? "_sm" : "_s", t_ < 0 ? -t_ : t_));  // an identifier (CUDA names kernels so)
    if (const auto* is = std::get_if<std::vector<int64_t>>(&a)) {
      std::vector<int64_t> v;
      for (size_t i = 0; i < is->size(); ++i) {
        GF_ASSIGN_OR_RETURN(int64_t x, Next());
        v.push_back(x);
      }
      return Attribute(std::move(v));
    }
    if (const auto* t = std::get_if<std::shared_ptr<const Tensor>>(&a)) {
      GF_ASSIGN_OR_RETURN(auto r, Tensor_(*t));
      return Attribute(std::move(r));
    }
    if (const auto* g = std::get_if<std::shared_ptr<const Graph>>(&a)) {
      if (auto f = fixed_.find(g->get()); f != fixed_.end()) {
        Skip(f->second);  // nothing in it moves: shared as it is
        return a;
      }
      GF_ASSIGN_OR_RETURN(std::shared_ptr<Graph> r, Graph_(**g));
      return Attribute(std::shared_ptr<const Graph>(std::move(r)));
    }
    return a;  // floats, strings: as they were
  }

  const std::vector<int64_t>& ints_;
  const std::vector<uint8_t>& contents_;
  int64_t t_;
  const std::map<const Graph*, std::pair<size_t, size_t>>& fixed_;
  const std::map<const Graph*, std::pair<size_t, size_t>>& moving_;
  bool references_;
  size_t next_ = 0, next_content_ = 0;
};

}  // namespace

FlatGraph Flatten(const Graph& g) {
  FlatGraph f;
  Flattener(f).Graph_(g);
  return f;
}

Result<ShapeTemplate> ShapeTemplate::Fit(std::shared_ptr<const Graph> a, const Graph& b, int64_t delta) {
  if (delta == 0) return InvalidArgument("shape template: two plans of one shape");
  const FlatGraph fa = Flatten(*a), fb = Flatten(b);
  if (fa.structure != fb.structure) return Unimplemented("the plans differ in more than sizes");
  if (fa.ints.size() != fb.ints.size()) return Unimplemented("the plans hold different numbers of sizes");
  ShapeTemplate t;
  t.base_ = std::move(a);
  t.base_ints_ = fa.ints;
  t.contents_ = fa.contents;
  t.slopes_.resize(fa.ints.size());
  for (size_t i = 0; i < fa.ints.size(); ++i) {
    const int64_t d = fb.ints[i] - fa.ints[i];
    if (d % delta != 0) return Unimplemented("a size moved by ", d, " over ", delta, " steps");
    t.slopes_[i] = d / delta;
  }
  // A graph attribute met twice is fixed only if it is at every meeting.
  std::map<const Graph*, bool> moves;
  for (const FlatGraph::Subgraph& sub : fa.subgraphs) {
    bool m = false;
    for (size_t i = sub.ints.first; i < sub.ints.second; ++i) m |= t.slopes_[i] != 0;
    moves[sub.graph] = moves[sub.graph] || m;
  }
  for (const FlatGraph::Subgraph& sub : fa.subgraphs)
    (moves[sub.graph] ? t.moving_subgraphs_ : t.fixed_subgraphs_)[sub.graph] = {
        sub.ints.second - sub.ints.first, sub.contents.second - sub.contents.first};
  return t;
}

Result<std::shared_ptr<Graph>> ShapeTemplate::Instantiate(int64_t t, bool references) const {
  std::vector<int64_t> ints(base_ints_.size());
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = base_ints_[i] + slopes_[i] * t;
  Rebuilder r(ints, contents_, t, fixed_subgraphs_, moving_subgraphs_, references);
  GF_ASSIGN_OR_RETURN(std::shared_ptr<Graph> g, r.Graph_(*base_));
  if (!r.consumed_all()) return Internal("shape template: more integers than the graph holds");
  GF_RETURN_IF_ERROR(g->Verify().WithContext(StrCat("shape template, ", t, " steps from its first plan")));
  return g;
}

}  // namespace graphfuse

#include "ir/text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace graphfuse {
namespace {

bool PlainName(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '-'))
      return false;
  return true;
}

std::string Name(const std::string& s) {
  if (PlainName(s)) return "%" + s;
  std::string q = "%\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string Float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string TensorValues(const Tensor& t, int64_t max_elements) {
  if (t.numel() > max_elements) return StrCat("<", t.numel(), " elements>");
  std::string s = "[";
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i) s += ", ";
    // Integers print exactly (an i64 beyond 2^53 would lose digits through a double).
    if (t.dtype() == DType::kI64) s += std::to_string(t.data_as<int64_t>()[i]);
    else if (t.dtype() == DType::kI32) s += std::to_string(t.data_as<int32_t>()[i]);
    else if (t.dtype() == DType::kBool) s += t.data_as<uint8_t>()[i] ? "1" : "0";
    else s += Float(t.GetAsDouble(i));
  }
  return s + "]";
}

std::string AttrText(const Attribute& a, int64_t max_elements) {
  if (auto* i = std::get_if<int64_t>(&a)) return std::to_string(*i);
  if (auto* f = std::get_if<float>(&a)) return Float(*f);
  if (auto* s = std::get_if<std::string>(&a)) return "\"" + *s + "\"";
  if (auto* is = std::get_if<std::vector<int64_t>>(&a)) {
    std::string s = "[";
    for (size_t k = 0; k < is->size(); ++k) s += (k ? ", " : "") + std::to_string((*is)[k]);
    return s + "]";
  }
  if (auto* fs = std::get_if<std::vector<float>>(&a)) {
    std::string s = "[";
    for (size_t k = 0; k < fs->size(); ++k) s += (k ? ", " : "") + Float((*fs)[k]);
    return s + "]";
  }
  if (auto* body = std::get_if<std::shared_ptr<const Graph>>(&a)) {
    // Nested graphs print indented, one level deeper than the node.
    std::string inner = PrintGraph(**body, PrintOptions{max_elements});
    std::string out;
    for (size_t i = 0; i < inner.size(); ++i) {
      out += inner[i];
      if (inner[i] == '\n' && i + 1 < inner.size()) out += "      ";
    }
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }
  const auto& t = *std::get<std::shared_ptr<const Tensor>>(a);
  return StrCat("<", DTypeName(t.dtype()), ShapeToString(t.shape()), ": ", TensorValues(t, max_elements), ">");
}

}  // namespace

std::string PrintGraph(const Graph& g, const PrintOptions& o) {
  std::string s = "graph @" + g.name() + "(";
  for (size_t i = 0; i < g.inputs().size(); ++i)
    s += StrCat(i ? ", " : "", Name(g.inputs()[i]->name()), ": ", g.inputs()[i]->TypeString());
  s += ") {\n";
  for (const Value* c : g.constants())
    s += StrCat("  ", Name(c->name()), ": ", c->TypeString(), " = const ", TensorValues(*c->constant(), o.max_constant_elements), "\n");
  for (const auto& n : g.nodes()) {
    s += "  ";
    for (size_t k = 0; k < n->outputs().size(); ++k)
      s += StrCat(k ? ", " : "", Name(n->output(k)->name()), ": ", n->output(k)->TypeString());
    s += " = " + n->op() + "(";
    for (size_t k = 0; k < n->inputs().size(); ++k) s += StrCat(k ? ", " : "", n->input(k) ? Name(n->input(k)->name()) : "_");
    s += ")";
    if (!n->attrs().empty()) {
      s += " {";
      bool first = true;
      for (const auto& [k, v] : n->attrs()) {
        s += StrCat(first ? "" : ", ", k, " = ", AttrText(v, o.max_constant_elements));
        first = false;
      }
      s += "}";
    }
    s += "\n";
  }
  s += "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) s += StrCat(i ? ", " : " ", Name(g.outputs()[i]->name()));
  return s + "\n}\n";
}

// ---- parser ------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}

  Result<std::unique_ptr<Graph>> Parse() {
    GF_RETURN_IF_ERROR(Expect("graph"));
    GF_RETURN_IF_ERROR(Expect("@"));
    GF_ASSIGN_OR_RETURN(std::string gname, Ident());
    auto g = std::make_unique<Graph>(gname);
    GF_RETURN_IF_ERROR(Expect("("));
    if (!Peek(")")) {
      do {
        GF_ASSIGN_OR_RETURN(std::string name, ValueName());
        GF_RETURN_IF_ERROR(Expect(":"));
        GF_ASSIGN_OR_RETURN(ValueType type, Type());
        auto v = g->AddInput(name, type.dtype, type.shape);
        if (!v.ok()) return Error(v.status().message());
      } while (Accept(","));
    }
    GF_RETURN_IF_ERROR(Expect(")"));
    GF_RETURN_IF_ERROR(Expect("{"));
    while (!Accept("return")) {
      GF_RETURN_IF_ERROR(Statement(*g));
    }
    if (!Peek("}")) {
      do {
        GF_ASSIGN_OR_RETURN(std::string name, ValueName());
        Value* v = g->FindValue(name);
        if (!v) return Error(StrCat("return of undefined value %", name));
        GF_RETURN_IF_ERROR(g->MarkOutput(v));
      } while (Accept(","));
    }
    GF_RETURN_IF_ERROR(Expect("}"));
    SkipSpace();
    if (pos_ != t_.size()) return Error("text after the closing brace");
    return g;
  }

 private:
  Status Statement(Graph& g) {
    SkipSpace();
    const size_t start = pos_;  // errors about the whole statement point at its start
    std::vector<std::string> names;
    std::vector<std::optional<ValueType>> types;
    do {
      GF_ASSIGN_OR_RETURN(std::string name, ValueName());
      names.push_back(name);
      if (Accept(":")) {
        GF_ASSIGN_OR_RETURN(ValueType t, Type());
        types.push_back(t);
      } else {
        types.push_back(std::nullopt);
      }
    } while (Accept(","));
    GF_RETURN_IF_ERROR(Expect("="));
    if (Accept("const")) {
      if (names.size() != 1 || !types[0]) return Error("a constant needs one name and a type");
      GF_ASSIGN_OR_RETURN(Tensor t, Values(*types[0]));
      auto v = g.AddConstant(names[0], std::make_shared<const Tensor>(std::move(t)));
      return v.ok() ? Status::Ok() : Error(v.status().message());
    }
    GF_ASSIGN_OR_RETURN(std::string op, Ident());
    GF_RETURN_IF_ERROR(Expect("("));
    std::vector<Value*> inputs;
    if (!Peek(")")) {
      do {
        if (Accept("_")) {
          inputs.push_back(nullptr);
          continue;
        }
        GF_ASSIGN_OR_RETURN(std::string in, ValueName());
        Value* v = g.FindValue(in);
        if (!v) return Error(StrCat("use of undefined value %", in));
        inputs.push_back(v);
      } while (Accept(","));
    }
    GF_RETURN_IF_ERROR(Expect(")"));
    AttributeMap attrs;
    if (Accept("{")) {
      do {
        GF_ASSIGN_OR_RETURN(std::string key, Ident());
        GF_RETURN_IF_ERROR(Expect("="));
        GF_ASSIGN_OR_RETURN(Attribute a, AttrValue());
        attrs[key] = std::move(a);
      } while (Accept(","));
      GF_RETURN_IF_ERROR(Expect("}"));
    }
    auto n = g.AddNode(op, inputs, std::move(attrs), "", static_cast<int>(names.size()), names);
    if (!n.ok()) return ErrorAt(start, n.status().message());
    for (size_t k = 0; k < names.size(); ++k) {
      const Value* o = (*n)->output(k);
      if (types[k] && (types[k]->dtype != o->dtype() || types[k]->shape != o->shape()))
        return ErrorAt(start, StrCat("%", names[k], " is written as ", DTypeName(types[k]->dtype), ShapeToString(types[k]->shape),
                            " but ", op, " gives ", o->TypeString()));
    }
    return Status::Ok();
  }

  Result<ValueType> Type() {
    GF_ASSIGN_OR_RETURN(std::string dt, Ident());
    auto dtype = ParseDType(dt);
    if (!dtype.ok()) return Error(dtype.status().message());
    GF_RETURN_IF_ERROR(Expect("["));
    Shape shape;
    if (!Peek("]")) {
      do {
        GF_ASSIGN_OR_RETURN(double d, Number());
        if (d < 0 || d != std::floor(d)) return Error("a dim must be a non-negative integer");
        shape.push_back(static_cast<int64_t>(d));
      } while (Accept(","));
    }
    GF_RETURN_IF_ERROR(Expect("]"));
    return ValueType{*dtype, shape};
  }

  Result<Tensor> Values(const ValueType& type) {
    auto t = Tensor::Empty(type.dtype, type.shape);
    if (!t.ok()) return Error(t.status().message());
    GF_RETURN_IF_ERROR(Expect("["));
    int64_t i = 0;
    if (!Peek("]")) {
      do {
        GF_ASSIGN_OR_RETURN(double v, Number());
        if (i >= t->numel()) return Error(StrCat("more than ", t->numel(), " values"));
        t->SetFromDouble(i++, v);
      } while (Accept(","));
    }
    GF_RETURN_IF_ERROR(Expect("]"));
    if (i != t->numel()) return Error(StrCat("expected ", t->numel(), " values, got ", i));
    return std::move(*t);
  }

  Result<Attribute> AttrValue() {
    SkipSpace();
    if (Accept("<")) {
      GF_ASSIGN_OR_RETURN(ValueType type, Type());
      GF_RETURN_IF_ERROR(Expect(":"));
      GF_ASSIGN_OR_RETURN(Tensor t, Values(type));
      GF_RETURN_IF_ERROR(Expect(">"));
      return Attribute(std::make_shared<const Tensor>(std::move(t)));
    }
    if (pos_ < t_.size() && t_[pos_] == '"') {
      ++pos_;
      std::string s;
      while (pos_ < t_.size() && t_[pos_] != '"') s += t_[pos_++];
      GF_RETURN_IF_ERROR(Expect("\""));
      return Attribute(s);
    }
    if (Accept("[")) {
      std::vector<double> vals;
      bool any_float = false;
      if (!Peek("]")) {
        do {
          const size_t start = (SkipSpace(), pos_);
          GF_ASSIGN_OR_RETURN(double v, Number());
          any_float |= t_.substr(start, pos_ - start).find_first_of(".eEn") != std::string::npos;
          vals.push_back(v);
        } while (Accept(","));
      }
      GF_RETURN_IF_ERROR(Expect("]"));
      if (any_float) return Attribute(std::vector<float>(vals.begin(), vals.end()));
      std::vector<int64_t> ints;
      for (double v : vals) ints.push_back(static_cast<int64_t>(v));
      return Attribute(ints);
    }
    const size_t start = (SkipSpace(), pos_);
    GF_ASSIGN_OR_RETURN(double v, Number());
    if (t_.substr(start, pos_ - start).find_first_of(".eEn") != std::string::npos)
      return Attribute(static_cast<float>(v));
    return Attribute(static_cast<int64_t>(v));
  }

  Result<double> Number() {
    SkipSpace();
    for (const char* word : {"nan", "inf", "-inf"}) {
      if (t_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return word[0] == 'n' ? NAN : (word[0] == '-' ? -INFINITY : INFINITY);
      }
    }
    const char* begin = t_.c_str() + pos_;
    char* end = nullptr;
    const double v = std::strtod(begin, &end);
    if (end == begin) return Error("expected a number");
    pos_ += static_cast<size_t>(end - begin);
    return v;
  }

  Result<std::string> ValueName() {
    GF_RETURN_IF_ERROR(Expect("%"));
    if (pos_ < t_.size() && t_[pos_] == '"') {
      ++pos_;
      std::string s;
      while (pos_ < t_.size() && t_[pos_] != '"') {
        if (t_[pos_] == '\\' && pos_ + 1 < t_.size()) ++pos_;
        s += t_[pos_++];
      }
      GF_RETURN_IF_ERROR(Expect("\""));
      return s;
    }
    std::string s;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || std::strchr("_./-", t_[pos_])))
      s += t_[pos_++];
    if (s.empty()) return Error("expected a value name after %");
    return s;
  }

  Result<std::string> Ident() {
    SkipSpace();
    std::string s;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) s += t_[pos_++];
    if (s.empty()) return Error("expected a name");
    return s;
  }

  void SkipSpace() {
    for (;;) {
      while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      if (pos_ < t_.size() && t_[pos_] == '#') {  // comment to end of line
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
        continue;
      }
      return;
    }
  }
  bool Peek(const char* tok) {
    SkipSpace();
    return t_.compare(pos_, std::strlen(tok), tok) == 0;
  }
  bool Accept(const char* tok) {
    if (!Peek(tok)) return false;
    // Keywords must not run into an identifier ("return" vs "returned").
    const size_t len = std::strlen(tok);
    if (std::isalpha(static_cast<unsigned char>(tok[0])) && pos_ + len < t_.size() &&
        (std::isalnum(static_cast<unsigned char>(t_[pos_ + len])) || t_[pos_ + len] == '_'))
      return false;
    pos_ += len;
    return true;
  }
  Status Expect(const char* tok) {
    if (Accept(tok)) return Status::Ok();
    return Error(StrCat("expected '", tok, "'"));
  }
  Status Error(const std::string& what) const { return ErrorAt(pos_, what); }
  Status ErrorAt(size_t at, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return InvalidArgument("IR text ", line, ":", col, ": ", what);
  }

  const std::string& t_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::unique_ptr<Graph>> ParseGraph(const std::string& text) { return Parser(text).Parse(); }

}  // namespace graphfuse

#include "runtime/signature.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace graphfuse {
namespace {

std::string DimString(const DeclDim& d) { return d.fixed() ? std::to_string(d.value) : d.param.empty() ? "?" : d.param; }

// Physical memory in bytes (0 when unknown: nothing is refused then).
int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

// Checks `shape` against the declaration and records its named dims in `symbols` (`origin`
// remembers which input first gave each, for the message when a later one disagrees).
Status MatchShape(const TensorDecl& d, const Shape& shape, std::map<std::string, int64_t>* symbols,
                  std::map<std::string, std::string>* origin) {
  const std::string what = StrCat("input '", d.name, "'");
  if (shape.size() != d.dims.size())
    return InvalidArgument(what, " has rank ", shape.size(), " (shape ", ShapeToString(shape), ") but the model declares ",
                           DeclString(d), " (rank ", d.dims.size(), ")");
  for (size_t k = 0; k < shape.size(); ++k) {
    const DeclDim& dim = d.dims[k];
    if (shape[k] < 0) return InvalidArgument(what, ": dim ", k, " is negative (", shape[k], ")");
    if (dim.fixed() && shape[k] != dim.value)
      return InvalidArgument(what, ": dim ", k, " is ", shape[k], " but the model fixes it at ", dim.value, " (",
                             DeclString(d), ")");
    if (dim.fixed() || dim.param.empty()) continue;
    auto [it, inserted] = symbols->emplace(dim.param, shape[k]);
    if (inserted) {
      (*origin)[dim.param] = StrCat(what, " dim ", k);
    } else if (it->second != shape[k]) {
      return InvalidArgument(what, ": dim ", k, " ('", dim.param, "') is ", shape[k], " but ", (*origin)[dim.param],
                             " gave '", dim.param, "' = ", it->second, " (one symbolic dim takes one size per call)");
    }
  }
  GF_RETURN_IF_ERROR(CheckFitsInMemory(what, d.dtype, shape));
  return Status::Ok();
}

void AppendKeyShape(std::string* key, DType t, const Shape& s) {
  *key += DTypeName(t);
  *key += ShapeToString(s);
}

}  // namespace

std::string DeclString(const TensorDecl& d) {
  std::string s = StrCat(DTypeName(d.dtype), "[");
  for (size_t k = 0; k < d.dims.size(); ++k) {
    if (k) s += ",";
    s += DimString(d.dims[k]);
  }
  return s + "]";
}

bool IsStaticSignature(std::span<const TensorDecl> decls) {
  for (const TensorDecl& d : decls) {
    if (d.values_shape_plan) return false;
    for (const DeclDim& dim : d.dims)
      if (!dim.fixed()) return false;
  }
  return true;
}

Result<InputBinding> BindInputs(std::span<const TensorDecl> decls, std::span<const TensorView> inputs) {
  if (inputs.size() != decls.size())
    return InvalidArgument("the model takes ", decls.size(), " inputs, ", inputs.size(), " were given");
  InputBinding b;
  std::map<std::string, std::string> origin;
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorDecl& d = decls[i];
    const TensorView& t = inputs[i];
    if (t.dtype != d.dtype)
      return InvalidArgument("input '", d.name, "' is ", DTypeName(t.dtype), ShapeToString(t.shape),
                             " but the model declares ", DeclString(d));
    GF_RETURN_IF_ERROR(MatchShape(d, t.shape, &b.symbols, &origin));
    b.shapes.push_back(t.shape);
    if (!b.key.empty()) b.key += ';';
    AppendKeyShape(&b.key, t.dtype, t.shape);
    if (!d.values_shape_plan) {
      b.values.push_back(nullptr);
      continue;
    }
    const int64_t n = t.numel();
    if (n > kMaxShapeValueElements)
      return InvalidArgument("input '", d.name, "' has ", n, " elements, but its values become a shape (", d.value_use,
                             "), which graphfuse plans for per call: at most ", kMaxShapeValueElements, " elements");
    GF_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(t.dtype, t.shape));
    GF_RETURN_IF_ERROR(CopyView(t, copy.view()));  // t may be a strided view
    b.key += "={";
    char buf[32];
    for (int64_t k = 0; k < n; ++k) {
      std::snprintf(buf, sizeof buf, "%s%.17g", k ? "," : "", copy.GetAsDouble(k));
      b.key += buf;
    }
    b.key += "}";
    b.values.push_back(std::make_shared<const Tensor>(std::move(copy)));
  }
  return b;
}

Result<InputBinding> BindShapes(std::span<const TensorDecl> decls, const std::map<std::string, Shape>& flags) {
  // Which flags name an input, which a dim; anything else is a typo worth naming.
  std::map<std::string, int64_t> dim_flags;
  for (const auto& [name, shape] : flags) {
    bool is_input = false, is_param = false;
    for (const TensorDecl& d : decls) {
      is_input |= d.name == name;
      for (const DeclDim& dim : d.dims) is_param |= !dim.fixed() && dim.param == name;
    }
    if (is_input) continue;
    if (!is_param) {
      std::string known;
      for (const TensorDecl& d : decls) known += StrCat(known.empty() ? "" : ", ", d.name, " ", DeclString(d));
      return InvalidArgument("--shape ", name, ": the model has no input or symbolic dim of that name (inputs: ", known,
                             ")");
    }
    if (shape.size() != 1)
      return InvalidArgument("--shape ", name, "=", ShapeToString(shape), ": '", name,
                             "' is a symbolic dim, which takes one size (--shape ", name, "=16)");
    dim_flags[name] = shape[0];
  }
  // Shapes: inputs given whole first, so that their symbolic dims size the inputs given by
  // dim names or not at all (--shape x=2x16 sizes an attention_mask[batch, seq] too).
  std::vector<Shape> shapes(decls.size());
  std::map<std::string, int64_t> known = dim_flags;
  for (size_t i = 0; i < decls.size(); ++i) {
    auto it = flags.find(decls[i].name);
    if (it == flags.end()) continue;
    shapes[i] = it->second;
    for (size_t k = 0; k < decls[i].dims.size() && k < shapes[i].size(); ++k)
      if (!decls[i].dims[k].fixed() && !decls[i].dims[k].param.empty())
        known.emplace(decls[i].dims[k].param, shapes[i][k]);
  }
  InputBinding b;
  std::map<std::string, std::string> origin;
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorDecl& d = decls[i];
    Shape& shape = shapes[i];
    if (!flags.count(d.name)) {
      std::string missing;
      for (const DeclDim& dim : d.dims) {
        if (dim.fixed()) {
          shape.push_back(dim.value);
        } else if (auto p = known.find(dim.param); !dim.param.empty() && p != known.end()) {
          shape.push_back(p->second);
        } else {
          missing += StrCat(missing.empty() ? "" : ", ", dim.param.empty() ? "an unnamed dim" : "'" + dim.param + "'");
          shape.push_back(-1);
        }
      }
      if (!missing.empty())
        return InvalidArgument("input '", d.name, "' ", DeclString(d), " has symbolic dims: give ", missing,
                               " with --shape (--shape ", d.name, "=D0x", "D1... or --shape DIM=N)");
    }
    if (d.values_shape_plan)
      return InvalidArgument("input '", d.name, "': its values become a shape (", d.value_use,
                             "), so the plan needs its values, not only its shape (give them with --data)");
    GF_RETURN_IF_ERROR(MatchShape(d, shape, &b.symbols, &origin).WithContext("--shape"));
    if (!b.key.empty()) b.key += ';';
    AppendKeyShape(&b.key, d.dtype, shape);
    b.shapes.push_back(shape);
    b.values.push_back(nullptr);
  }
  // A dim flag that an input's whole shape contradicts.
  for (const auto& [name, size] : dim_flags)
    if (auto it = b.symbols.find(name); it != b.symbols.end() && it->second != size)
      return InvalidArgument("--shape ", name, "=", size, ": ", origin[name], " gives '", name, "' = ", it->second);
  return b;
}

Status ParseShapeFlag(const std::string& text, std::map<std::string, Shape>* flags) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    return InvalidArgument("--shape '", text, "': expected NAME=D0xD1x... (an input's shape) or DIM=N (a symbolic dim)");
  const std::string name = text.substr(0, eq), dims = text.substr(eq + 1);
  Shape shape;
  if (!dims.empty() && dims != "[]") {
    size_t pos = 0;
    while (pos <= dims.size()) {
      const size_t x = dims.find('x', pos);
      const std::string part = dims.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
      char* end = nullptr;
      const long long v = part.empty() ? -1 : std::strtoll(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || v < 0 || v > (int64_t{1} << 40))
        return InvalidArgument("--shape '", text, "': '", part, "' is not a dim (a whole number from 0 to 2^40)");
      shape.push_back(v);
      if (x == std::string::npos) break;
      pos = x + 1;
    }
  }
  if (!flags->emplace(name, shape).second) return InvalidArgument("--shape ", name, " is given twice");
  return Status::Ok();
}

Status CheckFitsInMemory(const std::string& what, DType dtype, const Shape& shape) {
  auto n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext(what);
  static const int64_t kMemory = PhysicalMemoryBytes();
  const double bytes = static_cast<double>(*n) * static_cast<double>(DTypeSize(dtype));
  if (kMemory > 0 && bytes > static_cast<double>(kMemory))
    return InvalidArgument(what, " is ", DTypeName(dtype), ShapeToString(shape), ": ", bytes / (1 << 30),
                           " GiB, more than this machine's memory (", static_cast<double>(kMemory) / (1 << 30), " GiB)");
  return Status::Ok();
}

}  // namespace graphfuse

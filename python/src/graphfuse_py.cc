// graphfuse's Python extension module (graphfuse._graphfuse): a compiled ONNX model as a
// session object taking and returning numpy arrays. python/graphfuse/__init__.py builds the
// onnxruntime-shaped API (InferenceSession, NodeArg) on top of it.
//
// Inputs are read in place: each array is wrapped in a TensorView over its own buffer (run:
// the Python layer passes C-contiguous, native-order arrays; run_into, io_binding's: any
// strides). Outputs are the Tensors Run allocates, handed to numpy without a copy, or the
// caller's bound arrays. Run and compilation release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/model.h"
#include "graphfuse/profiling.h"
#include "graphfuse/progress.h"
#include "graphfuse/target.h"

namespace nb = nanobind;
namespace gf = graphfuse;

namespace {

using InputArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
// io_binding's arrays: any strides (NumPy views of a larger buffer: a KV cache kept in place).
using BoundInput = nb::ndarray<nb::ro, nb::device::cpu>;
using BoundOutput = nb::ndarray<nb::device::cpu>;

// One exception type per StatusCode (index = the code), all under graphfuse.Error.
PyObject* g_errors[static_cast<int>(gf::StatusCode::kInternal) + 1] = {};

[[noreturn]] void Raise(const gf::Status& status) {
  PyErr_SetString(g_errors[static_cast<int>(status.code())], status.message().c_str());
  throw nb::python_error();
}

void RegisterErrors(nb::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc("graphfuse.Error", "Any error graphfuse reports.", PyExc_Exception, nullptr);
  m.attr("Error") = nb::steal(base);
  struct Kind {
    gf::StatusCode code;
    const char* name;
    PyObject* builtin;  // the built-in exception it also is, so `except ValueError` catches it
    const char* doc;
  };
  const Kind kinds[] = {
      {gf::StatusCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError,
       "Malformed input: a model, an input's dtype or shape, an option."},
      {gf::StatusCode::kUnimplemented, "Unimplemented", PyExc_NotImplementedError,
       "Valid input that graphfuse does not support."},
      {gf::StatusCode::kResourceExhausted, "ResourceExhausted", PyExc_MemoryError,
       "An allocation that is absurd or failed."},
      {gf::StatusCode::kNotFound, "NotFound", PyExc_LookupError, "A file, op, target or name that does not exist."},
      {gf::StatusCode::kInternal, "Internal", PyExc_RuntimeError, "Should not happen; reported rather than crashing."},
  };
  for (const Kind& k : kinds) {
    nb::object bases = nb::make_tuple(nb::handle(base), nb::handle(k.builtin));
    std::string qualified = std::string("graphfuse.") + k.name;
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), k.doc, bases.ptr(), nullptr);
    if (!type) throw nb::python_error();
    m.attr(k.name) = nb::steal(type);
    g_errors[static_cast<int>(k.code)] = type;
  }
  g_errors[static_cast<int>(gf::StatusCode::kOk)] = PyExc_RuntimeError;  // never raised
}

std::optional<gf::DType> FromDlpack(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return std::nullopt;
  switch (static_cast<Code>(t.code)) {
    case Code::Float:
      if (t.bits == 32) return gf::DType::kF32;
      if (t.bits == 16) return gf::DType::kF16;
      break;
    case Code::Bfloat:
      if (t.bits == 16) return gf::DType::kBF16;
      break;
    case Code::Int:
      if (t.bits == 32) return gf::DType::kI32;
      if (t.bits == 64) return gf::DType::kI64;
      break;
    case Code::Bool:
      if (t.bits == 8) return gf::DType::kBool;
      break;
    default:
      break;
  }
  return std::nullopt;
}

nb::dlpack::dtype ToDlpack(gf::DType t) {
  using Code = nb::dlpack::dtype_code;
  auto make = [](Code code, int bits) { return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1}; };
  switch (t) {
    case gf::DType::kF32: return make(Code::Float, 32);
    case gf::DType::kF16: return make(Code::Float, 16);
    case gf::DType::kBF16: return make(Code::Bfloat, 16);
    case gf::DType::kI32: return make(Code::Int, 32);
    case gf::DType::kI64: return make(Code::Int, 64);
    case gf::DType::kBool: return make(Code::Bool, 8);
  }
  return make(Code::Float, 32);
}

// The element type as onnxruntime's NodeArg.type writes it.
const char* OrtTypeName(gf::DType t) {
  switch (t) {
    case gf::DType::kF32: return "tensor(float)";
    case gf::DType::kF16: return "tensor(float16)";
    case gf::DType::kBF16: return "tensor(bfloat16)";
    case gf::DType::kI32: return "tensor(int32)";
    case gf::DType::kI64: return "tensor(int64)";
    case gf::DType::kBool: return "tensor(bool)";
  }
  return "tensor(unknown)";
}

// numpy's name for a DLPack type, for errors about arrays graphfuse cannot take.
std::string DlpackName(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = "type";
  switch (static_cast<Code>(t.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: kind = "bool"; break;
    default: break;
  }
  return gf::StrCat(kind, static_cast<int>(t.bits));
}

// (name, shape, type) with symbolic dims as their names (None when unnamed), as NodeArg has them.
nb::tuple InfoTuple(const gf::TensorInfo& info) {
  nb::list shape;
  for (size_t k = 0; k < info.shape.size(); ++k) {
    if (info.shape[k] >= 0) {
      shape.append(nb::int_(info.shape[k]));
    } else if (k < info.dim_params.size() && !info.dim_params[k].empty()) {
      shape.append(nb::str(info.dim_params[k].c_str()));
    } else {
      shape.append(nb::none());
    }
  }
  return nb::make_tuple(nb::str(info.name.c_str()), shape, nb::str(OrtTypeName(info.dtype)));
}

// Hands a Tensor to numpy without a copy (the array owns it). bf16, which numpy lacks, comes
// back as float32 (exact).
nb::object ToNumpy(gf::Tensor tensor) {
  if (tensor.dtype() == gf::DType::kBF16) {
    auto f32 = gf::Tensor::Empty(gf::DType::kF32, tensor.shape());
    if (!f32.ok()) Raise(f32.status());
    const uint16_t* src = tensor.data_as<uint16_t>();
    float* dst = f32->data_as<float>();
    for (int64_t i = 0; i < tensor.numel(); ++i) dst[i] = gf::BF16BitsToF32(src[i]);
    tensor = std::move(*f32);
  }
  std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  auto* owned = new gf::Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<gf::Tensor*>(p); });
  // numpy wants a non-null pointer even for an empty array.
  static char empty_buffer[gf::kTensorAlignment];
  void* data = owned->numel() == 0 ? static_cast<void*>(empty_buffer) : owned->data();
  nb::ndarray<nb::numpy> array(data, shape.size(), shape.data(), owner, nullptr, ToDlpack(owned->dtype()));
  return nb::cast(array, nb::rv_policy::reference);
}

nb::dict ReportDict(const gf::Plan& plan) {
  const gf::FusionReport& r = plan.report();
  nb::list groups;
  for (const gf::FusedGroupInfo& g : r.groups) {
    nb::dict d;
    d["name"] = g.name;
    d["kind"] = g.kind;
    d["kernel_name"] = g.kernel_name;
    d["nodes"] = nb::cast(g.nodes);
    d["recomputed"] = nb::cast(g.recomputed);
    d["epilogue"] = g.epilogue;
    groups.append(d);
  }
  nb::list refusals;
  for (const gf::FusionRefusal& f : r.refusals) {
    nb::dict d;
    d["producer"] = f.producer;
    d["consumer"] = f.consumer;
    d["code"] = f.code;
    d["message"] = f.message;
    refusals.append(d);
  }
  nb::dict planning;
  planning["import_ms"] = plan.planning_time().import_ms;
  planning["passes_ms"] = plan.planning_time().passes_ms;
  planning["compile_ms"] = plan.planning_time().compile_ms;
  planning["gemm_tuning_ms"] = plan.planning_time().gemm_tuning_ms;
  nb::dict out;
  out["signature"] = plan.signature();
  out["kernels_before"] = r.kernels_before;
  out["kernels_after"] = r.kernels_after;
  out["launches_per_run"] = plan.launches_per_run();
  out["groups"] = groups;
  out["refusals"] = refusals;
  nb::list choices;
  for (const gf::KernelChoice& c : plan.kernel_choices()) {
    nb::dict e;
    e["node"] = c.node;
    e["op"] = c.op;
    e["how"] = c.how;
    choices.append(e);
  }
  out["kernel_choices"] = choices;
  out["planning_ms"] = planning;
  out["from_template"] = plan.from_template();
  // The inputs and outputs a bound strided array is read or written in place (a KV cache).
  nb::list in_place_inputs, in_place_outputs;
  for (size_t i = 0; i < plan.inputs().size(); ++i)
    if (plan.takes_strided(false, i)) in_place_inputs.append(plan.inputs()[i].name);
  for (size_t i = 0; i < plan.outputs().size(); ++i)
    if (plan.takes_strided(true, i)) in_place_outputs.append(plan.outputs()[i].name);
  out["in_place_inputs"] = in_place_inputs;
  out["in_place_outputs"] = in_place_outputs;
  return out;
}

class Session {
 public:
  // `model`: the serialized ModelProto (bytes) or a path (str); `external_data_folder`: where a
  // model given as bytes keeps its external data files.
  Session(nb::object model, const std::string& backend, int threads, bool fusion, int plan_cache_capacity,
          int device, bool cuda_graph, bool emulate, const std::string& dtype, bool shape_classes,
          const std::string& external_data_folder) {
    gf::TargetOptions target_options;
    target_options.cpu.threads = threads;
    target_options.cuda.device = device;
    target_options.cuda.graph = cuda_graph;
    target_options.cuda.emulate = emulate;
    gf::CompileOptions options;
    options.fusion.enabled = fusion;
    options.plan_cache_capacity = plan_cache_capacity;
    options.shape_classes = shape_classes;
    gf::Result<gf::DType> compute = gf::ParseDType(dtype);
    if (!compute.ok()) Raise(compute.status().WithContext("dtype"));
    options.dtype = *compute;
    std::optional<std::string> path;
    std::string_view bytes;
    if (nb::isinstance<nb::bytes>(model)) {
      nb::bytes b = nb::borrow<nb::bytes>(model);
      bytes = std::string_view(b.c_str(), b.size());
    } else {
      path = nb::cast<std::string>(model);
    }
    gf::Status status = [&] {
      nb::gil_scoped_release release;  // `model` stays referenced by the caller meanwhile
      return Load(path, bytes, external_data_folder, backend, target_options, options);
    }();
    if (!status.ok()) Raise(status);
  }

  nb::list Inputs() const { return Infos(compiled_->inputs()); }
  nb::list Outputs() const { return Infos(compiled_->outputs()); }
  std::string backend() const { return backend_; }
  bool is_static() const { return is_static_; }

  // One array per model input, in the model's order.
  nb::list Run(const std::vector<InputArray>& arrays) const {
    std::vector<gf::TensorView> views = Views(arrays);
    std::shared_ptr<gf::TraceRecorder> trace = trace_;  // kept while the run records into it
    gf::Result<std::vector<gf::Tensor>> outputs = [&] {
      nb::gil_scoped_release release;  // `arrays` keeps every buffer alive
      return compiled_->Run(views, trace.get());
    }();
    if (!outputs.ok()) Raise(outputs.status());
    nb::list result;
    for (gf::Tensor& t : *outputs) result.append(ToNumpy(std::move(t)));
    return result;
  }

  // io_binding's run: inputs of any strides; each output written into its bound array (any
  // strides: a present over its past's buffer is written in place where the plan takes it so)
  // or, where None, into a new array. Per output: the new array, or None where the caller's
  // array was filled.
  nb::list RunInto(const std::vector<BoundInput>& arrays, const std::vector<std::optional<BoundOutput>>& bound) const {
    std::vector<gf::TensorView> in = Views(arrays);
    gf::Result<std::shared_ptr<const gf::Plan>> plan = [&] {
      nb::gil_scoped_release release;
      return compiled_->PlanFor(in);
    }();
    if (!plan.ok()) Raise(plan.status());
    const std::vector<gf::TensorInfo>& infos = (*plan)->outputs();
    if (bound.size() != infos.size())
      Raise(gf::InvalidArgument("the model gives ", infos.size(), " outputs, ", bound.size(), " were bound"));
    std::vector<gf::Tensor> owned(infos.size());
    std::vector<gf::TensorView> out;
    for (size_t i = 0; i < infos.size(); ++i) {
      if (!bound[i]) {
        gf::Result<gf::Tensor> t = gf::Tensor::Empty(infos[i].dtype, infos[i].shape);
        if (!t.ok()) Raise(t.status());
        owned[i] = std::move(*t);
        out.push_back(owned[i].view());
        continue;
      }
      const BoundOutput& a = *bound[i];
      std::optional<gf::DType> dtype = FromDlpack(a.dtype());
      if (!dtype || *dtype != infos[i].dtype)
        Raise(gf::InvalidArgument("output '", infos[i].name, "' is bound to an array of ", DlpackName(a.dtype()),
                                  ", but the model gives ", OrtTypeName(infos[i].dtype)));
      out.push_back(View(a, *dtype));
    }
    std::shared_ptr<gf::TraceRecorder> trace = trace_;
    const gf::Status status = [&] {
      nb::gil_scoped_release release;  // the caller's binding keeps every array alive
      return compiled_->Run(in, out, trace.get());
    }();
    if (!status.ok()) Raise(status);
    nb::list result;
    for (size_t i = 0; i < infos.size(); ++i) result.append(bound[i] ? nb::none() : ToNumpy(std::move(owned[i])));
    return result;
  }

  // The fusion report of the plan for these inputs (planned now if need be), or with no
  // inputs of the latest plan (None before the first run of a model with symbolic dims).
  nb::object Explain(const std::optional<std::vector<InputArray>>& arrays) const {
    std::shared_ptr<const gf::Plan> plan;
    if (arrays) {
      std::vector<gf::TensorView> views = Views(*arrays);
      gf::Result<std::shared_ptr<const gf::Plan>> planned = [&] {
        nb::gil_scoped_release release;
        return compiled_->PlanFor(views);
      }();
      if (!planned.ok()) Raise(planned.status());
      plan = *planned;
    } else {
      plan = compiled_->plan();
    }
    if (!plan) return nb::none();
    nb::dict out = ReportDict(*plan);
    // The model's side: how many plans its shapes took, and the weights they share.
    const gf::PlanCacheStats s = compiled_->cache_stats();
    out["plans_made"] = s.plans_made;
    out["shape_classes"] = s.shape_classes;
    out["prepared_bytes"] = s.prepared_bytes;
    return out;
  }

  // Profiling (onnxruntime's enable_profiling / end_profiling): every later run recorded as
  // Chrome-trace JSON (graphfuse/profiling.h) until EndProfiling writes it to `path`.
  void StartProfiling() {
    if (!trace_) trace_ = std::make_shared<gf::TraceRecorder>();
  }
  // Writes the trace to `path` and stops profiling; the number of events written.
  int64_t EndProfiling(const std::string& path) {
    if (!trace_) Raise(gf::InvalidArgument("end_profiling: profiling is not enabled for this session"));
    const gf::Status st = trace_->WriteFile(path);
    if (!st.ok()) Raise(st);
    const int64_t events = trace_->events();
    trace_.reset();
    return events;
  }
  bool profiling() const { return trace_ != nullptr; }

  // What the model says about itself (ModelProto's producer, domain, version, doc strings and
  // metadata_props), under onnxruntime's ModelMetadata names.
  nb::dict Metadata() const {
    const gf::ModelMetadata& m = compiled_->metadata();
    nb::dict d;
    d["producer_name"] = m.producer_name;
    d["producer_version"] = m.producer_version;
    d["domain"] = m.domain;
    d["description"] = m.description;
    d["graph_name"] = m.graph_name;
    d["graph_description"] = m.graph_description;
    d["version"] = m.version;
    nb::dict custom;
    for (const auto& [k, v] : m.custom) custom[nb::str(k.c_str())] = v;
    d["custom_metadata_map"] = custom;
    return d;
  }

  nb::dict CacheStats() const {
    gf::PlanCacheStats s = compiled_->cache_stats();
    nb::dict d;
    d["hits"] = s.hits;
    d["plans_made"] = s.plans_made;
    d["evictions"] = s.evictions;
    d["size"] = s.size;
    d["capacity"] = s.capacity;
    d["planning_ms"] = s.planning_ms;
    d["last_planning_ms"] = s.last_planning_ms;
    d["shape_classes"] = s.shape_classes;
    d["plans_from_template"] = s.plans_from_template;
    d["plans_ahead"] = s.plans_ahead;
    d["prepared_entries"] = s.prepared_entries;
    d["prepared_bytes"] = s.prepared_bytes;
    return d;
  }

 private:
  gf::Status Load(const std::optional<std::string>& path, std::string_view bytes, const std::string& folder,
                  const std::string& backend, const gf::TargetOptions& target_options,
                  const gf::CompileOptions& options) {
    GF_ASSIGN_OR_RETURN(gf::Model model,
                        path ? gf::Model::FromOnnxFile(*path) : gf::Model::FromOnnxBytes(bytes, "model", folder));
    is_static_ = model.is_static();
    GF_ASSIGN_OR_RETURN(std::unique_ptr<gf::Target> target, gf::MakeTarget(backend, target_options));
    backend_ = std::string(target->name());
    GF_ASSIGN_OR_RETURN(compiled_, gf::CompiledModel::Compile(std::move(model), std::move(target), options));
    return gf::Status::Ok();
  }

  static nb::list Infos(const std::vector<gf::TensorInfo>& infos) {
    nb::list list;
    for (const gf::TensorInfo& info : infos) list.append(InfoTuple(info));
    return list;
  }

  // A view over the array's own buffer, with its strides where it is not C-contiguous.
  template <class Array>
  static gf::TensorView View(const Array& a, gf::DType dtype) {
    gf::TensorView v;
    v.dtype = dtype;
    v.shape.resize(a.ndim());
    for (size_t k = 0; k < a.ndim(); ++k) v.shape[k] = static_cast<int64_t>(a.shape(k));
    v.data = const_cast<void*>(static_cast<const void*>(a.data()));
    v.strides.resize(a.ndim());
    for (size_t k = 0; k < a.ndim(); ++k) v.strides[k] = a.stride(static_cast<size_t>(k));
    if (v.contiguous()) v.strides.clear();
    return v;
  }

  // Views over the arrays' own buffers; an array of a type graphfuse lacks is refused naming
  // the input (a type graphfuse has but the model does not declare is refused by Run).
  template <class Array>
  std::vector<gf::TensorView> Views(const std::vector<Array>& arrays) const {
    const std::vector<gf::TensorInfo>& inputs = compiled_->inputs();
    std::vector<gf::TensorView> views;
    views.reserve(arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) {
      const auto& a = arrays[i];
      const std::string name = i < inputs.size() ? inputs[i].name : gf::StrCat("#", i);
      std::optional<gf::DType> dtype = FromDlpack(a.dtype());
      if (!dtype) {
        std::string expected = i < inputs.size() ? OrtTypeName(inputs[i].dtype) : "a graphfuse type";
        Raise(gf::InvalidArgument("input '", name, "': an array of ", DlpackName(a.dtype()), ", expected ", expected));
      }
      views.push_back(View(a, *dtype));
    }
    return views;
  }

  std::unique_ptr<gf::CompiledModel> compiled_;
  // Set while profiling; runs record into it (TraceRecorder is thread-safe).
  std::shared_ptr<gf::TraceRecorder> trace_;
  std::string backend_;
  bool is_static_ = false;
};

}  // namespace

NB_MODULE(_graphfuse, m) {
  m.doc() = "graphfuse's compiled core; use the graphfuse package (InferenceSession).";
  RegisterErrors(m);
  m.def("target_names", &gf::TargetNames, "The backends this build has: 'cpu', and 'cuda' when built with CUDA.");
  // The progress sink (graphfuse/progress.h) as a Python callable taking a str, or None. It is
  // called with the GIL taken, from whichever thread compiles; an exception it raises is printed
  // as unraisable (compiling goes on). One slot holds the current callable, replaced under the
  // GIL; the slot itself is never freed, so that no reference is dropped after the interpreter
  // has finalized.
  m.def(
      "set_progress",
      [](nb::object fn) {
        static nb::object* const slot = new nb::object(nb::none());
        *slot = std::move(fn);
        if (slot->is_none()) {
          gf::SetProgressSink({});
          return;
        }
        gf::SetProgressSink([](std::string_view line) {
          nb::gil_scoped_acquire gil;
          if (slot->is_none()) return;  // cleared after this line was on its way
          try {
            (*slot)(nb::str(line.data(), line.size()));
          } catch (nb::python_error& e) {
            e.discard_as_unraisable("graphfuse progress callback");
          }
        });
      },
      nb::arg("fn").none(), "Calls fn(line) before each long step of compiling; None: silent (the default).");

  nb::class_<Session>(m, "Session")
      .def(nb::init<nb::object, const std::string&, int, bool, int, int, bool, bool, const std::string&, bool, const std::string&>(),
           nb::arg("model"), nb::arg("backend") = "cpu", nb::arg("threads") = 0, nb::arg("fusion") = true,
           nb::arg("plan_cache_capacity") = 16, nb::arg("device") = 0, nb::arg("cuda_graph") = false,
           nb::arg("emulate") = false, nb::arg("dtype") = "f32", nb::arg("shape_classes") = true,
           nb::arg("external_data_folder") = "")
      .def("inputs", &Session::Inputs, "(name, shape, type) per input, as the model declares them.")
      .def("outputs", &Session::Outputs, "(name, shape, type) per output, as the model declares them.")
      .def("run", &Session::Run, nb::arg("arrays"), "Runs on one array per input (model order); every output.")
      .def("run_into", &Session::RunInto, nb::arg("arrays"), nb::arg("outputs"),
           "Runs on arrays of any strides into the bound output arrays (None: a new one, returned).")
      .def("explain", &Session::Explain, nb::arg("arrays") = nb::none(), "The fusion report as a dict.")
      .def("cache_stats", &Session::CacheStats)
      .def("start_profiling", &Session::StartProfiling, "Records every later run (Chrome-trace JSON).")
      .def("end_profiling", &Session::EndProfiling, nb::arg("path"),
           "Writes the runs recorded since start_profiling to path and stops; the events written.")
      .def_prop_ro("profiling", &Session::profiling)
      .def("metadata", &Session::Metadata, "The model's metadata (producer, domain, version, doc strings, props).")
      .def_prop_ro("backend", &Session::backend)
      .def_prop_ro("is_static", &Session::is_static);
}

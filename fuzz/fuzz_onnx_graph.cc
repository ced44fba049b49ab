// Structure-aware libFuzzer target: the fuzz input drives a generator of small, well-formed
// ONNX protobufs (random registry ops, inputs, constants and attributes), which then go through
// ImportOnnxBytes and, when they import and stay small, through Execute. Byte-level mutation
// of whole protobufs (fuzz_onnx_import.cc) rarely gets past the parser; this target reaches the
// op conversions, every op's shape inference and the kernels with hostile attributes and
// constant inputs (out-of-range axes, negative dims, INT64 extremes, empty tensors).
//
// Any crash, sanitizer report or hang is a bug: such models must come back as a Status.
#include <fuzzer/FuzzedDataProvider.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_target.h"
#include "graphfuse/cpu.h"
#include "ir/op_registry.h"
#include "onnx/import.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"

namespace {

// Values larger than this are not executed: the model may legitimately ask for huge tensors.
constexpr int64_t kMaxExecBytes = int64_t{16} << 20;

const char* const kExtraOps[] = {"Constant", "Clip", "Cast", "CastLike", "Dropout", "Max", "Min", "Sum", "Mean",
                                 "LessOrEqual", "GreaterOrEqual", "Xor", "PRelu", "HardSwish", "Pow", "Gelu",
                                 "Split", "If", "NoSuchOp"};
const char* const kAttrNames[] = {"axis", "axes", "perm", "keepdims", "epsilon", "transA", "transB", "alpha",
                                  "beta", "start", "end", "split", "num_outputs", "noop_with_empty_axes",
                                  "allowzero", "stash_type", "to", "value", "approximate", "seed", "training",
                                  "value_float", "value_int", "value_ints", "value_floats", "ratio"};
const int32_t kDTypes[] = {onnx::TensorProto::FLOAT, onnx::TensorProto::INT64, onnx::TensorProto::INT32,
                           onnx::TensorProto::BOOL, onnx::TensorProto::FLOAT16, onnx::TensorProto::BFLOAT16,
                           onnx::TensorProto::DOUBLE};

int64_t SomeInt(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange(0, 9)) {
    case 0: return std::numeric_limits<int64_t>::max();
    case 1: return std::numeric_limits<int64_t>::min();
    case 2: return p.ConsumeIntegral<int64_t>();
    case 3: return int64_t{1} << p.ConsumeIntegralInRange(20, 62);
    default: return p.ConsumeIntegralInRange<int64_t>(-4, 6);
  }
}

float SomeFloat(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange(0, 7)) {
    case 0: return std::numeric_limits<float>::infinity();
    case 1: return std::numeric_limits<float>::quiet_NaN();
    case 2: return p.ConsumeFloatingPoint<float>();
    default: return p.ConsumeFloatingPointInRange<float>(-2.f, 2.f);
  }
}

std::vector<int64_t> SomeShape(FuzzedDataProvider& p) {
  std::vector<int64_t> s(p.ConsumeIntegralInRange(0, 4));
  for (auto& d : s) d = p.ConsumeIntegralInRange(0, 10) == 0 ? SomeInt(p) : p.ConsumeIntegralInRange(0, 5);
  return s;
}

void FillTensor(FuzzedDataProvider& p, onnx::TensorProto* t, const std::string& name) {
  t->set_name(name);
  t->set_data_type(kDTypes[p.ConsumeIntegralInRange<size_t>(0, std::size(kDTypes) - 1)]);
  // Mostly small, valid shapes (1-D i64 vectors are what shape inputs look like).
  std::vector<int64_t> shape;
  if (p.ConsumeBool()) {
    shape = {p.ConsumeIntegralInRange<int64_t>(0, 5)};
    if (p.ConsumeBool()) t->set_data_type(onnx::TensorProto::INT64);
  } else {
    shape = SomeShape(p);
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_dims(d);
    n = (d >= 0 && d <= 64 && n <= 4096) ? n * d : -1;
  }
  if (n < 0 || p.ConsumeIntegralInRange(0, 20) == 0) n = p.ConsumeIntegralInRange(0, 8);  // a wrong count
  for (int64_t i = 0; i < n; ++i) {
    switch (t->data_type()) {
      case onnx::TensorProto::FLOAT: t->add_float_data(SomeFloat(p)); break;
      case onnx::TensorProto::INT64: t->add_int64_data(SomeInt(p)); break;
      case onnx::TensorProto::DOUBLE: t->add_double_data(SomeFloat(p)); break;
      default: t->add_int32_data(p.ConsumeIntegralInRange(-3, 70000)); break;
    }
  }
  if (p.ConsumeIntegralInRange(0, 8) == 0) {  // raw_data instead, of a random length
    t->clear_float_data();
    t->clear_int64_data();
    t->clear_int32_data();
    t->set_raw_data(p.ConsumeBytesAsString(p.ConsumeIntegralInRange(0, 64)));
  }
}

void AddAttribute(FuzzedDataProvider& p, onnx::NodeProto* node) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(kAttrNames[p.ConsumeIntegralInRange<size_t>(0, std::size(kAttrNames) - 1)]);
  switch (p.ConsumeIntegralInRange(0, 6)) {
    case 0:
    case 1:
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(SomeInt(p));
      break;
    case 2:
      a->set_type(onnx::AttributeProto::INTS);
      for (int k = p.ConsumeIntegralInRange(0, 5); k > 0; --k) a->add_ints(SomeInt(p));
      break;
    case 3:
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(SomeFloat(p));
      break;
    case 4:
      a->set_type(onnx::AttributeProto::FLOATS);
      for (int k = p.ConsumeIntegralInRange(0, 5); k > 0; --k) a->add_floats(SomeFloat(p));
      break;
    case 5:
      a->set_type(onnx::AttributeProto::TENSOR);
      FillTensor(p, a->mutable_t(), "");
      break;
    default:
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(p.ConsumeBool() ? "tanh" : p.ConsumeRandomLengthString(8));
      break;
  }
}

std::string BuildModel(FuzzedDataProvider& p, const std::vector<std::string>& ops) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(p.ConsumeIntegralInRange(12, 18));
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("fuzz");
  std::vector<std::string> values;
  for (int i = p.ConsumeIntegralInRange(1, 3); i > 0; --i) {
    auto* in = g->add_input();
    in->set_name("in" + std::to_string(i));
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(kDTypes[p.ConsumeIntegralInRange<size_t>(0, 4)]);
    auto* shape = tt->mutable_shape();
    for (int64_t d : SomeShape(p)) shape->add_dim()->set_dim_value(d);
    values.push_back(in->name());
  }
  for (int i = p.ConsumeIntegralInRange(0, 3); i > 0; --i) {
    const std::string name = "c" + std::to_string(i);
    FillTensor(p, g->add_initializer(), name);
    values.push_back(name);
  }
  for (int i = 0, n = p.ConsumeIntegralInRange(1, 4); i < n; ++i) {
    onnx::NodeProto* node = g->add_node();
    node->set_op_type(ops[p.ConsumeIntegralInRange<size_t>(0, ops.size() - 1)]);
    if (p.ConsumeBool()) node->set_name("n" + std::to_string(i));
    for (int k = p.ConsumeIntegralInRange(0, 5); k > 0; --k)
      node->add_input(p.ConsumeIntegralInRange(0, 9) == 0 ? ""
                                                          : values[p.ConsumeIntegralInRange<size_t>(0, values.size() - 1)]);
    for (int k = p.ConsumeIntegralInRange(0, 4); k > 0; --k) AddAttribute(p, node);
    for (int k = p.ConsumeIntegralInRange(1, 3); k > 0; --k) {
      const std::string out = "v" + std::to_string(i) + "_" + std::to_string(k);
      node->add_output(p.ConsumeIntegralInRange(0, 9) == 0 ? "" : out);
      values.push_back(out);
    }
  }
  for (int k = p.ConsumeIntegralInRange(1, 2); k > 0; --k)
    g->add_output()->set_name(values[p.ConsumeIntegralInRange<size_t>(0, values.size() - 1)]);
  return m.SerializeAsString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const graphfuse::OpSchema* s : graphfuse::AllSchemas()) v.push_back(s->name);
    for (const char* o : kExtraOps) v.push_back(o);
    return v;
  }();
  FuzzedDataProvider p(data, size);
  const std::string bytes = BuildModel(p, ops);
  auto g = graphfuse::ImportOnnxBytes(bytes, "fuzz.onnx");
  if (!g.ok()) {
    if (g.status().message().empty()) __builtin_trap();
    return 0;
  }
  // Execute only graphs whose every value is small (zeros as inputs).
  const graphfuse::Graph& graph = **g;
  for (const auto& n : graph.nodes())
    for (const graphfuse::Value* v : n->outputs())
      if (v->numel() < 0 || v->numel() > kMaxExecBytes / 8) return 0;
  std::vector<graphfuse::Tensor> inputs;
  std::vector<graphfuse::TensorView> views;
  for (const graphfuse::Value* in : graph.inputs()) {
    if (in->numel() > kMaxExecBytes / 8) return 0;
    auto t = graphfuse::Tensor::Empty(in->dtype(), in->shape());
    if (!t.ok()) return 0;
    std::memset(t->data(), 0, t->nbytes());
    inputs.push_back(std::move(t).value());
  }
  for (const graphfuse::Tensor& t : inputs) views.push_back(t.view());
  auto out = graphfuse::Execute(graph, views, graphfuse::CpuContext{});
  if (!out.ok() && out.status().message().empty()) __builtin_trap();
  // The same graph through every fusion pass, then run fused: a pass may refuse or fail with
  // a message, never crash, and a graph that ran unfused must still run.
  graphfuse::PipelineOptions fuse_all;
  auto passes = graphfuse::RunPipeline(**g, graphfuse::cpu::DefaultCpuTarget(), fuse_all);
  if (!passes.ok()) {
    if (passes.status().message().empty()) __builtin_trap();
    return 0;
  }
  auto fused = graphfuse::Execute(**g, views, graphfuse::CpuContext{});
  if (!fused.ok() && fused.status().message().empty()) __builtin_trap();
  if (out.ok() && !fused.ok()) __builtin_trap();  // fusion broke a graph that ran
  return 0;
}

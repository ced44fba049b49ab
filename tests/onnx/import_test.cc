// ONNX importer: hand-built ModelProtos for each conversion and each refusal, checked for the
// IR they produce or the error (code + the file, node and op it names).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>

#include "cpu/cpu_target.h"
#include "graphfuse/cpu.h"
#include "onnx/import.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"
#include "model_builder.h"

namespace graphfuse {
namespace {


void SetFloat(onnx::NodeProto* n, const std::string& k, float v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
void SetInt(onnx::NodeProto* n, const std::string& k, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

const Node* OnlyNode(const Graph& g) {
  EXPECT_EQ(g.num_nodes(), 1u);
  return g.nodes().front().get();
}

std::vector<float> RunF32(const Graph& g, const std::vector<float>& x) {
  auto in = Tensor::FromFloats(DType::kF32, g.inputs()[0]->shape(), x);
  EXPECT_TRUE(in.ok());
  std::vector<TensorView> views{in->view()};
  auto out = Execute(g, views, CpuContext{});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  std::vector<float> r;
  if (!out.ok()) return r;
  for (int64_t i = 0; i < (*out)[0].numel(); ++i) r.push_back(static_cast<float>((*out)[0].GetAsDouble(i)));
  return r;
}

#define EXPECT_ERROR(result, want_code, ...)                                              \
  do {                                                                               \
    auto r_ = (result);                                                              \
    ASSERT_FALSE(r_.ok());                                                           \
    EXPECT_EQ(r_.status().code(), want_code) << r_.status().ToString();                 \
    for (const char* s_ : {__VA_ARGS__})                                             \
      EXPECT_NE(r_.status().message().find(s_), std::string::npos)                   \
          << "'" << s_ << "' not in: " << r_.status().message();                     \
  } while (0)

TEST(OnnxImport, KeepsNamesAndGeneratesMissingNodeNames) {
  ModelBuilder b;
  b.Input("x", {2, 3});
  b.Node("Relu", {"x"}, {"r"});
  b.Node("Neg", {"r"}, {"y"}, "negate");
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ((*g)->num_nodes(), 2u);
  EXPECT_EQ((*g)->nodes().front()->name(), "Relu_0");
  EXPECT_EQ((*g)->nodes().back()->name(), "negate");
  EXPECT_EQ((*g)->outputs()[0]->name(), "y");
  EXPECT_NE((*g)->FindValue("r"), nullptr);
  EXPECT_EQ(RunF32(**g, {-1, 2, -3, 4, 0, 5}), (std::vector<float>{0, -2, 0, -4, 0, -5}));
}

void SetInts(onnx::NodeProto* n, const std::string& k, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// Softmax before opset 13 normalizes over the input coerced to 2-D at `axis` (default 1): over
// every axis from there on at once; at the last axis it is today's Softmax.
TEST(OnnxImport, OldSoftmaxNormalizesOverTheTrailingAxesTogether) {
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[i] = std::sin(0.7 * i) * 3;
  for (int64_t axis : {int64_t{1}, int64_t{-1}, int64_t{0}}) {
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      ModelBuilder b(11);
      b.Input("x", {2, 3, 4});
      auto* n = b.Node(op, {"x"}, {"y"});
      SetInt(n, "axis", axis);
      b.Output("y");
      auto g = b.Import();
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{2, 3, 4}));
      const std::vector<float> y = RunF32(**g, x);
      ASSERT_EQ(y.size(), 24u);
      const int64_t a = axis < 0 ? axis + 3 : axis;
      const int64_t inner = a == 0 ? 24 : a == 1 ? 12 : 4;  // the coerced row: dims a.. together
      for (int64_t r = 0; r < 24 / inner; ++r) {
        double sum = 0;
        for (int64_t i = 0; i < inner; ++i) sum += std::exp(double{x[r * inner + i]});
        for (int64_t i = 0; i < inner; ++i) {
          const double p = std::exp(double{x[r * inner + i]}) / sum;
          const double want = std::string(op) == "Softmax" ? p : std::log(p);
          EXPECT_NEAR(y[r * inner + i], want, 2e-6 * (1 + std::fabs(want))) << op << " axis " << axis << " at " << r * inner + i;
        }
      }
    }
  }
}

// Clip before opset 11 and Slice before opset 10 carry as attributes what later opsets take as
// inputs; Split from opset 18 takes num_outputs.
TEST(OnnxImport, OldAndNewAttributeForms) {
  {
    ModelBuilder b(10);
    b.Input("x", {4});
    auto* n = b.Node("Clip", {"x"}, {"y"});
    SetFloat(n, "min", -0.5f);
    SetFloat(n, "max", 1.5f);
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(RunF32(**g, {-2.f, 0.25f, 1.f, 9.f}), (std::vector<float>{-0.5f, 0.25f, 1.f, 1.5f}));
  }
  {
    ModelBuilder b(9);
    b.Input("x", {2, 4});
    auto* n = b.Node("Slice", {"x"}, {"y"});
    SetInts(n, "starts", {1});
    SetInts(n, "ends", {3});
    SetInts(n, "axes", {1});
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{2, 2}));
    EXPECT_EQ(RunF32(**g, {0, 1, 2, 3, 4, 5, 6, 7}), (std::vector<float>{1, 2, 5, 6}));
  }
  {
    ModelBuilder b(18);
    b.Input("x", {6});
    auto* n = b.Node("Split", {"x"}, {"a", "b", "c"});
    SetInt(n, "num_outputs", 3);
    b.Output("a");
    b.Output("c");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_EQ((*g)->outputs().size(), 2u);
    EXPECT_EQ((*g)->outputs()[1]->shape(), (Shape{2}));
  }
}

// Opsets before 7: binary ops broadcast B along A's dims from `axis` (broadcast=1), Cast names
// its type, Reshape takes its shape as an attribute, and legacy consumed_inputs is ignored.
TEST(OnnxImport, OpsetsBefore7) {
  {
    ModelBuilder b(6);
    b.Input("x", {2, 3, 2});
    b.FloatInit("bias", {3}, {10, 20, 30});
    auto* n = b.Node("Add", {"x", "bias"}, {"y"});
    SetInt(n, "broadcast", 1);
    SetInt(n, "axis", 1);
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(RunF32(**g, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}),
              (std::vector<float>{10, 11, 22, 23, 34, 35, 16, 17, 28, 29, 40, 41}));
  }
  {
    ModelBuilder b(6);
    b.Input("x", {2, 3});
    b.FloatInit("s", {3}, {1, 2, 3});
    auto* n = b.Node("Mul", {"x", "s"}, {"y"});
    SetInt(n, "broadcast", 1);  // no axis: s is x's suffix
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(RunF32(**g, {1, 1, 1, 2, 2, 2}), (std::vector<float>{1, 2, 3, 2, 4, 6}));
  }
  {
    ModelBuilder b(6);
    b.Input("x", {2, 3});
    b.FloatInit("s", {4}, {1, 2, 3, 4});
    auto* n = b.Node("Add", {"x", "s"}, {"y"}, "bad_axis");
    SetInt(n, "broadcast", 1);
    SetInt(n, "axis", 2);
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'bad_axis' (Add)", "broadcast axis 2");
  }
  {
    ModelBuilder b(4);
    b.Input("x", {2, 3});
    auto* r = b.Node("Reshape", {"x"}, {"r"});
    SetInts(r, "shape", {3, 2});
    SetInts(r, "consumed_inputs", {0});
    auto* c = b.Node("Cast", {"r"}, {"y"});
    auto* to = c->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::STRING);
    to->set_s("INT32");
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->TypeString(), "i32[3,2]");
    EXPECT_EQ(RunF32(**g, {1.5f, -2.5f, 3, 4, 5, 6}), (std::vector<float>{1, -2, 3, 4, 5, 6}));
  }
}

// Opsets 22 to 24 changed the ops graphfuse runs only in the element types they allow (bf16 for
// the activations at 22; 4- and 8-bit floats for the data movement ops at 23 and 24, where
// Cast also gained round_mode, which applies to float8e8m0 alone): their models import as the
// same ops. The ops they added are refused by name until they are mapped.
TEST(OnnxImport, Opsets22To24ImportTheirOpsAndNameTheNewOnes) {
  for (int64_t opset : {22, 23, 24}) {
    ModelBuilder b(opset);
    b.Input("x", {2, 3});
    b.Node("Softplus", {"x"}, {"s"});
    b.Node("Transpose", {"s"}, {"t"});
    auto* cast = b.Node("Cast", {"t"}, {"y"});
    auto* to = cast->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx::TensorProto::FLOAT16);
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << "opset " << opset << ": " << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{3, 2})) << "opset " << opset;
    EXPECT_EQ((*g)->outputs()[0]->dtype(), DType::kF16) << "opset " << opset;
  }
  for (const char* op : {"TensorScatter"}) {  // (Attention, RotaryEmbedding, RMSNormalization, Swish convert)
    ModelBuilder b(24);
    b.Input("x", {2, 3});
    b.Node(op, {"x", "x", "x"}, {"y"}, "n");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "m.onnx", op);
  }
}

TEST(OnnxImport, RefusesWhatItCannotParseOrRun) {
  EXPECT_ERROR(ImportOnnxBytes("\xff\xff\xff garbage", "bad.onnx"), StatusCode::kInvalidArgument, "bad.onnx",
               "not a valid ONNX model (protobuf parse failed)");
  EXPECT_ERROR(ImportOnnxFile("/nonexistent/model.onnx"), StatusCode::kNotFound, "/nonexistent/model.onnx");
  for (int64_t opset : {0, 25}) {  // outside 1..24
    ModelBuilder b(opset);
    b.Input("x", {2});
    b.Node("Relu", {"x"}, {"y"});
    b.Output("y");
    const std::string what = StrCat("opset ", opset);
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "m.onnx", what.c_str());
  }
  {
    ModelBuilder b;
    auto* in = b.Input("x", {});
    in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("N");
    b.Node("Relu", {"x"}, {"y"});
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "dynamic dim 'N' of input 'x'");
  }
  {
    ModelBuilder b;
    b.Input("x", {2});
    b.Node("Det", {"x"}, {"y"}, "n0");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "m.onnx", "node 'n0' (Det)", "op not supported");
  }
  {
    ModelBuilder b;
    b.Input("x", {2});
    auto* n = b.Node("If", {"x"}, {"y"}, "branch");
    n->add_attribute()->set_name("then_branch");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "node 'branch' (If)");
  }
  {
    ModelBuilder b;
    b.Input("x", {2});
    b.Node("Relu", {"x"}, {"y"})->set_domain("com.microsoft");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kUnimplemented, "Relu_0", "com.microsoft");
  }
  {
    ModelBuilder b;
    b.Input("x", {2});
    b.Node("Relu", {"undefined"}, {"y"});
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'Relu_0' (Relu)", "'undefined' is not defined");
  }
  {
    ModelBuilder b;
    b.Input("x", {2});
    b.Node("Relu", {"x"}, {"y"});
    b.Output("y");
    b.g().mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "output 'y' is declared INT64");
  }
}

TEST(OnnxImport, InitializersFromEveryField) {
  ModelBuilder b;
  b.Input("x", {2});
  b.FloatInit("w_float", {2}, {1.5f, -2.f});
  auto* raw = b.g().add_initializer();
  raw->set_name("w_raw");
  raw->set_data_type(onnx::TensorProto::FLOAT);
  raw->add_dims(2);
  const float rv[2] = {3.f, 4.f};
  raw->set_raw_data(std::string(reinterpret_cast<const char*>(rv), sizeof rv));
  auto* i64 = b.g().add_initializer();
  i64->set_name("w_i64");
  i64->set_data_type(onnx::TensorProto::INT64);
  i64->add_dims(2);
  i64->add_int64_data(7);
  i64->add_int64_data(-8);
  auto* f16 = b.g().add_initializer();
  f16->set_name("w_f16");
  f16->set_data_type(onnx::TensorProto::FLOAT16);
  f16->add_int32_data(F32ToF16Bits(0.5f));
  auto* bl = b.g().add_initializer();
  bl->set_name("w_bool");
  bl->set_data_type(onnx::TensorProto::BOOL);
  bl->add_dims(2);
  bl->add_int32_data(0);
  bl->add_int32_data(5);
  b.Node("Add", {"x", "w_float"}, {"a"});
  b.Node("Mul", {"a", "w_raw"}, {"y"});
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Graph& gr = **g;
  EXPECT_EQ(gr.FindValue("w_i64")->constant()->data_as<int64_t>()[1], -8);
  EXPECT_EQ(gr.FindValue("w_f16")->constant()->GetAsDouble(0), 0.5);
  EXPECT_EQ(gr.FindValue("w_f16")->shape(), Shape{});
  EXPECT_EQ(gr.FindValue("w_bool")->constant()->data_as<uint8_t>()[1], 1);
  EXPECT_EQ(RunF32(gr, {1, 1}), (std::vector<float>{7.5f, -4.f}));
}

TEST(OnnxImport, RefusesMalformedInitializers) {
  auto with_init = [](auto&& edit) {
    ModelBuilder b;
    b.Input("x", {2});
    edit(b.FloatInit("w", {2}, {1, 2}));
    b.Node("Add", {"x", "w"}, {"y"});
    b.Output("y");
    return b.Import();
  };
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) { t->add_float_data(3); }), StatusCode::kInvalidArgument,
               "initializer 'w'", "needs 2 values");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) {
                 t->clear_float_data();
                 t->set_raw_data("abc");
               }),
               StatusCode::kInvalidArgument, "initializer 'w'", "raw_data");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) { t->set_dims(0, -2); }), StatusCode::kInvalidArgument,
               "initializer 'w'", "negative");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) {
                 t->clear_float_data();
                 t->set_dims(0, int64_t{1} << 62);
                 t->add_dims(0);
               }),
               StatusCode::kInvalidArgument, "initializer 'w'", "dim 0");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) {
                 t->clear_float_data();
                 t->set_dims(0, int64_t{1} << 40);
                 t->add_dims(int64_t{1} << 40);
               }),
               StatusCode::kInvalidArgument, "initializer 'w'");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) {
                 t->set_data_location(onnx::TensorProto::EXTERNAL);
                 auto* e = t->add_external_data();
                 e->set_key("location");
                 e->set_value("w.bin");
               }),
               StatusCode::kInvalidArgument, "initializer 'w'", "both in the model and in an external file");
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) {
                 t->clear_float_data();
                 t->set_data_location(onnx::TensorProto::EXTERNAL);
                 auto* e = t->add_external_data();
                 e->set_key("location");
                 e->set_value("w.bin");
               }),
               StatusCode::kInvalidArgument, "initializer 'w'", "'w.bin'");  // bytes without a folder
  EXPECT_ERROR(with_init([](onnx::TensorProto* t) { t->set_data_type(onnx::TensorProto::DOUBLE); }),
               StatusCode::kUnimplemented, "initializer 'w'", "DOUBLE");
}

TEST(OnnxImport, ClipBoundsBecomeAttributes) {
  ModelBuilder b(13);
  b.Input("x", {4});
  b.FloatInit("lo", {}, {-1.f});
  b.FloatInit("hi", {}, {2.f});
  b.Node("Clip", {"x", "lo", "hi"}, {"y"}, "clip");
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Node* n = OnlyNode(**g);
  EXPECT_EQ(n->op(), "Clip");
  EXPECT_EQ(n->inputs().size(), 1u);
  EXPECT_EQ(n->GetFloat("alpha", 0), -1.f);
  EXPECT_EQ(n->GetFloat("beta", 0), 2.f);
  EXPECT_EQ(RunF32(**g, {-5, 0.5f, 3, 1}), (std::vector<float>{-1, 0.5f, 2, 1}));

  ModelBuilder open;  // no bounds: -inf / +inf; only max given
  open.Input("x", {2});
  open.FloatInit("hi", {}, {0.f});
  open.Node("Clip", {"x", "", "hi"}, {"y"});
  open.Output("y");
  auto g2 = open.Import();
  ASSERT_TRUE(g2.ok()) << g2.status().ToString();
  EXPECT_TRUE(std::isinf(OnlyNode(**g2)->GetFloat("alpha", 0)));
  EXPECT_EQ(RunF32(**g2, {-3, 3}), (std::vector<float>{-3, 0}));

}

// Runs g on the given inputs (as doubles, in the inputs' dtypes); returns output 0 as doubles.
std::vector<double> RunAll(const Graph& g, const std::vector<std::vector<double>>& ins) {
  std::vector<Tensor> ts;
  for (size_t k = 0; k < ins.size(); ++k) {
    Tensor t = Tensor::Empty(g.inputs()[k]->dtype(), g.inputs()[k]->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, ins[k][static_cast<size_t>(i)]);
    ts.push_back(std::move(t));
  }
  std::vector<TensorView> views;
  for (const Tensor& t : ts) views.push_back(t.view());
  auto out = Execute(g, views, CpuContext{});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  std::vector<double> r;
  if (out.ok())
    for (int64_t i = 0; i < (*out)[0].numel(); ++i) r.push_back((*out)[0].GetAsDouble(i));
  return r;
}

std::vector<std::string> Ops(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) ops.push_back(n->op());
  return ops;
}

TEST(OnnxImport, ClipWithBoundsAtRunTimeOrOnIntegers) {
  {  // bounds as graph inputs: Max then Min, the last named as the ONNX node
    ModelBuilder b(13);
    b.Input("x", {5});
    b.Input("lo", {});
    b.Input("hi", {});
    b.Node("Clip", {"x", "lo", "hi"}, {"y"}, "c");
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ops(**g), (std::vector<std::string>{"Max", "Min"}));
    EXPECT_EQ((*g)->nodes().back()->name(), "c");
    const double nan = std::nan("");
    EXPECT_EQ(RunAll(**g, {{-5, 0.5, 3, 1, -1}, {-1}, {2}}), (std::vector<double>{-1, 0.5, 2, 1, -1}));
    // min > max: every output is max (ONNX); NaN in x stays NaN.
    const auto r = RunAll(**g, {{-5, 0.5, 3, nan, 7}, {4}, {2}});
    EXPECT_EQ(r[0], 2);
    EXPECT_EQ(r[1], 2);
    EXPECT_EQ(r[2], 2);
    EXPECT_TRUE(std::isnan(r[3]));
    EXPECT_EQ(r[4], 2);
  }
  {  // only max, at run time
    ModelBuilder b(13);
    b.Input("x", {3});
    b.Input("hi", {});
    b.Node("Clip", {"x", "", "hi"}, {"y"});
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ops(**g), (std::vector<std::string>{"Min"}));
    EXPECT_EQ(RunAll(**g, {{-3, 0, 3}, {1}}), (std::vector<double>{-3, 0, 1}));
  }
  {  // int64 data with constant bounds
    ModelBuilder b(13);
    b.Input("x", {4}, onnx::TensorProto::INT64);
    for (auto [name, v] : {std::pair{"lo", int64_t{-2}}, std::pair{"hi", int64_t{3}}}) {
      auto* t = b.g().add_initializer();
      t->set_name(name);
      t->set_data_type(onnx::TensorProto::INT64);
      t->add_int64_data(v);
    }
    b.Node("Clip", {"x", "lo", "hi"}, {"y"});
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(RunAll(**g, {{-9, -2, 2, 9}}), (std::vector<double>{-2, -2, 2, 3}));
  }
  {  // a NaN bound propagates (numpy.clip), where the attribute form would not
    ModelBuilder b(13);
    b.Input("x", {2});
    b.FloatInit("lo", {}, {std::nanf("")});
    b.Node("Clip", {"x", "lo"}, {"y"});
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (double v : RunAll(**g, {{-1, 1}})) EXPECT_TRUE(std::isnan(v));
  }
  {  // a bound of another type, or of several values, is malformed
    ModelBuilder b(13);
    b.Input("x", {2});
    b.Input("lo", {}, onnx::TensorProto::INT64);
    b.Node("Clip", {"x", "lo"}, {"y"}, "c");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'c' (Clip)", "min ('lo') is i64[]", "'x' is f32[2]");
    ModelBuilder w(13);
    w.Input("x", {2});
    w.Input("hi", {2});
    w.Node("Clip", {"x", "", "hi"}, {"y"}, "c");
    w.Output("y");
    EXPECT_ERROR(w.Import(), StatusCode::kInvalidArgument, "node 'c' (Clip)", "max ('hi') must hold one value",
                 "f32[2]");
  }
}

// A scalar operand that arrives at run time does not stop fusion: Add, then Clip's Max and Min
// with bounds from graph inputs, run as one kernel with the unfused results.
TEST(OnnxImport, ClipWithRunTimeBoundsFuses) {
  ModelBuilder b(13);
  b.Input("x", {4, 64});
  b.Input("r", {4, 64});
  b.Input("lo", {});
  b.Input("hi", {});
  b.Node("Add", {"x", "r"}, {"s"});
  b.Node("Clip", {"s", "lo", "hi"}, {"y"});
  b.Output("y");
  auto unfused = b.Import();
  auto fused = b.Import();
  ASSERT_TRUE(unfused.ok() && fused.ok());
  PipelineOptions off, on;
  off.fusion.enabled = false;
  FusionReport rep;
  on.fusion_report = &rep;
  ASSERT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
  ASSERT_TRUE(RunPipeline(**fused, cpu::DefaultCpuTarget(), on).ok());
  EXPECT_EQ(rep.kernels_before, 3);
  EXPECT_EQ(rep.kernels_after, 1);
  std::vector<double> x(256), r(256);
  for (int i = 0; i < 256; ++i) x[i] = std::sin(i) * 3, r[i] = std::cos(i * 0.7);
  const auto a = RunAll(**unfused, {x, r, {-0.5}, {1.25}});
  EXPECT_EQ(a, RunAll(**fused, {x, r, {-0.5}, {1.25}}));
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i], std::min(std::max(double(float(x[i]) + float(r[i])), -0.5), 1.25)) << i;
}

TEST(OnnxImport, PowOnIntegers) {
  {  // i64 ** i32: the exponent cast to i64, exact integer powers
    ModelBuilder b(13);
    b.Input("x", {4}, onnx::TensorProto::INT64);
    b.Input("y", {4}, onnx::TensorProto::INT32);
    b.Node("Pow", {"x", "y"}, {"z"}, "p");
    b.Output("z");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ops(**g), (std::vector<std::string>{"Cast", "Pow"}));
    EXPECT_EQ(RunAll(**g, {{3, -2, 7, 2}, {4, 3, 0, 40}}), (std::vector<double>{81, -8, 1, 1099511627776.0}));
  }
  {  // i32 ** f32: the power of reals, truncated toward zero to i32
    ModelBuilder b(13);
    b.Input("x", {3}, onnx::TensorProto::INT32);
    b.Input("y", {3});
    b.Node("Pow", {"x", "y"}, {"z"}, "p");
    b.Output("z");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->dtype(), DType::kI32);
    EXPECT_EQ(RunAll(**g, {{4, 10, -8}, {0.5, 1.5, 1.0 / 3}}), (std::vector<double>{2, 31, 0}));
  }
}

// TopK before opset 10 takes k as an attribute; from 10 as a constant input (both outputs).
TEST(OnnxImport, TopKOldAndNewForms) {
  for (int64_t opset : {9, 11}) {
    ModelBuilder b(opset);
    b.Input("x", {2, 4});
    auto* n = b.Node("TopK", opset < 10 ? std::vector<std::string>{"x"} : std::vector<std::string>{"x", "k"},
                     {"values", "indices"}, "top");
    if (opset < 10) SetInt(n, "k", 2);
    else b.g().add_initializer()->CopyFrom([] {
        onnx::TensorProto k;
        k.set_name("k");
        k.set_data_type(onnx::TensorProto::INT64);
        k.add_dims(1);
        k.add_int64_data(2);
        return k;
      }());
    b.Output("values");
    b.Output("indices");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[1]->dtype(), DType::kI64);
    Tensor x = Tensor::FromFloats(DType::kF32, {2, 4}, {1, 5, 5, 2, -1, -3, 0, 7}).value();
    std::vector<TensorView> views{x.view()};
    auto out = Execute(**g, views, CpuContext{});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const double values[] = {5, 5, 7, 0}, indices[] = {1, 2, 3, 2};  // ties: the lower index first
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ((*out)[0].GetAsDouble(i), values[i]) << "opset " << opset << " at " << i;
      EXPECT_EQ((*out)[1].GetAsDouble(i), indices[i]) << "opset " << opset << " at " << i;
    }
  }
}

// Pad before opset 11 carries pads and value as attributes; from 11 they are inputs (an i32
// tensor pads in the value's dtype), and from 18 axes may name the padded dims.
TEST(OnnxImport, PadOldAndNewForms) {
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  {
    ModelBuilder b(10);
    b.Input("x", {2, 3}, onnx::TensorProto::INT32);
    auto* n = b.Node("Pad", {"x"}, {"y"});
    SetInts(n, "pads", {0, 1, 1, 0});
    SetFloat(n, "value", 9);
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{3, 4}));
    EXPECT_EQ(RunAll(**g, {x}), (std::vector<double>{9, 1, 2, 3, 9, 4, 5, 6, 9, 9, 9, 9}));
  }
  {
    ModelBuilder b(18);
    b.Input("x", {2, 3});
    auto* pads = b.g().add_initializer();
    pads->set_name("pads");
    pads->set_data_type(onnx::TensorProto::INT64);
    pads->add_dims(2);
    for (int64_t v : {2, 1}) pads->add_int64_data(v);
    auto* axes = b.g().add_initializer();
    axes->set_name("axes");
    axes->set_data_type(onnx::TensorProto::INT64);
    axes->add_dims(1);
    axes->add_int64_data(-1);
    auto* n = b.Node("Pad", {"x", "pads", "", "axes"}, {"y"});
    auto* mode = n->add_attribute();
    mode->set_name("mode");
    mode->set_type(onnx::AttributeProto::STRING);
    mode->set_s("reflect");
    b.Output("y");
    auto g = b.Import();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{2, 6}));
    EXPECT_EQ(RunAll(**g, {x}), (std::vector<double>{3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5}));
  }
}

// numpy.einsum by brute force over every assignment of the labels (an explicit equation of
// letters; a dim of 1 broadcasts against the label's size elsewhere). Also returns per output
// element the sum of |products|, the scale of the rounding error.
std::vector<double> RefEinsum(const std::string& eq, const std::vector<std::vector<double>>& ops,
                              const std::vector<Shape>& shapes, std::vector<double>* scale) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms(1);
  for (char c : eq.substr(0, arrow)) {
    if (c == ',') terms.emplace_back();
    else terms.back().push_back(c);
  }
  const std::string out = eq.substr(arrow + 2);
  std::string labels;
  std::vector<int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t d = 0; d < terms[i].size(); ++d) {
      const size_t at = labels.find(terms[i][d]);
      if (at == std::string::npos) labels += terms[i][d], size.push_back(shapes[i][d]);
      else size[at] = std::max(size[at], shapes[i][d]);
    }
  int64_t total = 1, out_n = 1;
  for (int64_t n : size) total *= n;
  for (char c : out) out_n *= size[labels.find(c)];
  std::vector<double> r(static_cast<size_t>(out_n), 0.0);
  scale->assign(r.size(), 0.0);
  std::vector<int64_t> value(labels.size());
  for (int64_t a = 0; a < total; ++a) {
    int64_t rem = a;
    for (size_t l = labels.size(); l-- > 0;) value[l] = rem % size[l], rem /= size[l];
    double prod = 1;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < terms[i].size(); ++d)
        off = off * shapes[i][d] + (shapes[i][d] == 1 ? 0 : value[labels.find(terms[i][d])]);
      prod *= ops[i][static_cast<size_t>(off)];
    }
    int64_t o = 0;
    for (char c : out) o = o * size[labels.find(c)] + value[labels.find(c)];
    r[o] += prod;
    (*scale)[o] += std::fabs(prod);
  }
  return r;
}

onnx::NodeProto* EinsumNode(ModelBuilder& b, const std::string& eq, size_t inputs) {
  std::vector<std::string> ins;
  for (size_t i = 0; i < inputs; ++i) ins.push_back(StrCat("x", i));
  auto* n = b.Node("Einsum", ins, {"y"}, "einsum");
  auto* a = n->add_attribute();
  a->set_name("equation");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(eq);
  return n;
}

// Einsum becomes MatMul / Mul / Transpose / ReduceSum / Reshape: the attention forms are a
// (transposed) MatMul and nothing else; every form, unfused and fused, against numpy's einsum.
TEST(OnnxImport, EinsumLowersToExistingOps) {
  struct Case {
    std::string eq, ref;  // ref: the same with the ellipsis spelled as letters, explicit output
    std::vector<Shape> shapes;
    std::vector<std::string> ops;  // empty: not checked
  };
  const std::vector<Case> cases = {
      {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}, {"Transpose", "MatMul"}},
      {"bhqk,bhkd->bhqd", "bhqk,bhkd->bhqd", {{2, 3, 4, 6}, {2, 3, 6, 5}}, {"MatMul"}},
      {"bij,bjk->bik", "bij,bjk->bik", {{3, 4, 5}, {3, 5, 2}}, {"MatMul"}},
      {"ij,jk->ik", "ij,jk->ik", {{4, 5}, {5, 3}}, {"MatMul"}},
      {"ij,jk", "ij,jk->ik", {{4, 5}, {5, 3}}, {"MatMul"}},
      {"ij,kj->ik", "ij,kj->ik", {{4, 5}, {3, 5}}, {"Transpose", "MatMul"}},
      {"bsh,hd->bsd", "bsh,hd->bsd", {{2, 3, 4}, {4, 5}}, {"MatMul"}},
      {"bsh,dh->bsd", "bsh,dh->bsd", {{2, 3, 4}, {5, 4}}, {"Transpose", "MatMul"}},
      {"bhs,hd->bsd", "bhs,hd->bsd", {{2, 4, 3}, {4, 5}}, {}},
      {"bqhd,bkhd->bhqk", "bqhd,bkhd->bhqk", {{2, 4, 3, 5}, {2, 6, 3, 5}}, {}},
      {"...ij,...jk->...ik", "abij,bjk->abik", {{2, 3, 4, 5}, {3, 5, 6}}, {}},
      {"...ij,...jk->...ik", "abij,bjk->abik", {{2, 1, 4, 5}, {3, 5, 6}}, {}},
      {"...ij,...jk", "abij,bjk->abik", {{2, 3, 4, 5}, {3, 5, 6}}, {}},
      {"ij->ji", "ij->ji", {{3, 4}}, {"Transpose"}},
      {"ij->i", "ij->i", {{3, 4}}, {"ReduceSum"}},
      {"ij->", "ij->", {{3, 4}}, {"ReduceSum"}},
      {"ijk->kj", "ijk->kj", {{2, 3, 4}}, {"ReduceSum", "Transpose"}},
      {"ij->ij", "ij->ij", {{3, 4}}, {"Identity"}},
      {"i,i->", "i,i->", {{5}, {5}}, {}},
      {"i,i->i", "i,i->i", {{5}, {5}}, {"Mul"}},
      {"i,j->ij", "i,j->ij", {{4}, {3}}, {"Reshape", "Mul"}},
      {"ij,ij->ij", "ij,ij->ij", {{3, 4}, {3, 4}}, {"Mul"}},
      {"ijk,ik->j", "ijk,ik->j", {{2, 3, 4}, {2, 4}}, {}},
      {"bij,bkj->bki", "bij,bkj->bki", {{2, 3, 4}, {2, 5, 4}}, {}},
      {"ab,cd->dacb", "ab,cd->dacb", {{2, 3}, {4, 5}}, {}},
      {"ijk,jl->il", "ijk,jl->il", {{2, 3, 4}, {3, 5}}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(StrCat("Einsum '", c.eq, "'"));
    ModelBuilder b(12);
    std::vector<std::vector<double>> ins;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      b.Input(StrCat("x", i), c.shapes[i]);
      std::vector<double> v(static_cast<size_t>(std::accumulate(c.shapes[i].begin(), c.shapes[i].end(), int64_t{1},
                                                                std::multiplies<int64_t>())));
      for (size_t k = 0; k < v.size(); ++k)
        v[k] = static_cast<float>(std::sin(1.3 * static_cast<double>(k + 7 * i)) + 0.1);
      ins.push_back(v);
    }
    EinsumNode(b, c.eq, c.shapes.size());
    b.Output("y");
    auto unfused = b.Import();
    auto fused = b.Import();
    ASSERT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString();
    if (!c.ops.empty()) {
      EXPECT_EQ(Ops(**unfused), c.ops);
    }
    EXPECT_EQ((*unfused)->nodes().back()->name(), "einsum");
    PipelineOptions off;
    off.fusion.enabled = false;
    ASSERT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
    ASSERT_TRUE(RunPipeline(**fused, cpu::DefaultCpuTarget(), PipelineOptions{}).ok());
    std::vector<double> scale;
    const std::vector<double> want = RefEinsum(c.ref, ins, c.shapes, &scale);
    for (const Graph* g : {unfused->get(), fused->get()}) {
      const std::vector<double> got = RunAll(*g, ins);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_LE(std::fabs(got[k] - want[k]), 1e-6 * scale[k] + 1e-30) << "element " << k;
    }
  }
}

// Attention written with Einsum (scores, scale, softmax, context) lowers to the MatMul form
// the attention pass matches: one FusedAttention, equal to the unfused plan.
TEST(OnnxImport, EinsumAttentionFusesIntoFusedAttention) {
  ModelBuilder b(13);
  const Shape s = {1, 2, 8, 4};
  for (const char* x : {"q", "k", "v"}) b.Input(x, s);
  auto* scores = b.Node("Einsum", {"q", "k"}, {"s"}, "scores");
  auto* a = scores->add_attribute();
  a->set_name("equation"), a->set_type(onnx::AttributeProto::STRING), a->set_s("bhqd,bhkd->bhqk");
  b.FloatInit("scale", {}, {0.5f});
  b.Node("Mul", {"s", "scale"}, {"s1"});
  SetInt(b.Node("Softmax", {"s1"}, {"p"}), "axis", -1);
  auto* context = b.Node("Einsum", {"p", "v"}, {"o"}, "context");
  a = context->add_attribute();
  a->set_name("equation"), a->set_type(onnx::AttributeProto::STRING), a->set_s("bhqk,bhkd->bhqd");
  b.Output("o");
  auto unfused = b.Import();
  auto fused = b.Import();
  ASSERT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString();
  PipelineOptions off, on;
  off.fusion.enabled = false;
  FusionReport rep;
  on.fusion_report = &rep;
  ASSERT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
  ASSERT_TRUE(RunPipeline(**fused, cpu::DefaultCpuTarget(), on).ok());
  ASSERT_EQ(rep.groups.size(), 1u);
  EXPECT_EQ(rep.groups[0].kind, "attention");
  EXPECT_EQ(rep.kernels_after, 1);
  std::vector<std::vector<double>> ins(3, std::vector<double>(64));
  for (size_t i = 0; i < 3; ++i)
    for (size_t k = 0; k < 64; ++k) ins[i][k] = std::sin(0.37 * static_cast<double>(k + 64 * i));
  const auto want = RunAll(**unfused, ins), got = RunAll(**fused, ins);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5) << k;
}

onnx::TensorProto* I64Init(ModelBuilder& b, const std::string& name, const std::vector<int64_t>& v) {
  auto* t = b.g().add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
  return t;
}

std::vector<float> Wave(size_t n, double f, double amp = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(amp * std::sin(f * static_cast<double>(i) + 0.3));
  return v;
}

// A decoder layer's attention written with opset 23's own ops: RMSNormalization, q / k / v
// projections split into heads, RotaryEmbedding of the heads, Attention with grouped-query heads
// and is_causal. It fuses as the patterns they replace do: one FusedAttention that applies RoPE
// itself (no Rope kernel), the norm and the projections beside it, equal to the unfused plan.
TEST(OnnxImport, Opset23AttentionRopeAndRmsNormFuseLikeThePatternsTheyReplace) {
  ModelBuilder b(23);
  const int64_t S = 8, E = 32, H = 4, KV = 2, D = 8;
  b.Input("x", {1, S, E});
  std::vector<float> w_norm = Wave(E, 0.7, 0.2);
  for (float& w : w_norm) w += 1.0f;
  b.FloatInit("w_norm", {E}, w_norm);
  SetFloat(b.Node("RMSNormalization", {"x", "w_norm"}, {"xn"}, "norm"), "epsilon", 1e-6f);
  b.FloatInit("cos", {1, S, D / 2}, Wave(S * D / 2, 0.11));
  b.FloatInit("sin", {1, S, D / 2}, Wave(S * D / 2, 0.23));
  I64Init(b, "perm_shape_q", {1, S, H, D});
  I64Init(b, "perm_shape_kv", {1, S, KV, D});
  for (const auto& [t, heads] : std::vector<std::pair<std::string, int64_t>>{{"q", H}, {"k", KV}, {"v", KV}}) {
    b.FloatInit("w_" + t, {E, heads * D}, Wave(static_cast<size_t>(E * heads * D), 0.05 + 0.01 * heads, 0.3));
    b.Node("MatMul", {"xn", "w_" + t}, {t + "2"});
    b.Node("Reshape", {t + "2", heads == H ? "perm_shape_q" : "perm_shape_kv"}, {t + "3"});
    SetInts(b.Node("Transpose", {t + "3"}, {t + "4"}), "perm", {0, 2, 1, 3});
  }
  b.Node("RotaryEmbedding", {"q4", "cos", "sin"}, {"qr"}, "rope_q");
  b.Node("RotaryEmbedding", {"k4", "cos", "sin"}, {"kr"}, "rope_k");
  SetInt(b.Node("Attention", {"qr", "kr", "v4"}, {"o4"}, "attention"), "is_causal", 1);
  SetInts(b.Node("Transpose", {"o4"}, {"o3"}), "perm", {0, 2, 1, 3});
  I64Init(b, "out_shape", {1, S, E});
  b.Node("Reshape", {"o3", "out_shape"}, {"y"});
  b.Output("y");
  auto unfused = b.Import();
  auto fused = b.Import();
  ASSERT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString();
  PipelineOptions off, on;
  off.fusion.enabled = false;
  ASSERT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
  ASSERT_TRUE(RunPipeline(**fused, cpu::DefaultCpuTarget(), on).ok());
  const std::vector<std::string> ops = Ops(**fused);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "FusedAttention"), 1) << ::testing::PrintToString(ops);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Rope"), 0) << ::testing::PrintToString(ops);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "MatMul"), 0) << ::testing::PrintToString(ops);
  std::vector<std::vector<double>> ins(1, std::vector<double>(static_cast<size_t>(S * E)));
  for (size_t k = 0; k < ins[0].size(); ++k) ins[0][k] = std::sin(0.37 * static_cast<double>(k)) + 0.1;
  const auto want = RunAll(**unfused, ins), got = RunAll(**fused, ins);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5) << k;
}

// Attention's inputs and attributes that do not fit are refused with what is wrong.
TEST(OnnxImport, Opset23AttentionRefusesWhatDoesNotFit) {
  {
    ModelBuilder b(23);
    for (const char* x : {"q", "k", "v"}) b.Input(x, {1, 8, 32});
    b.Node("Attention", {"q", "k", "v"}, {"y"}, "attention");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'attention' (Attention)",
                 "3-D Q, K, V need q_num_heads and kv_num_heads");
  }
  {
    ModelBuilder b(23);
    b.Input("q", {1, 4, 8, 8});
    b.Input("k", {1, 3, 8, 8});
    b.Input("v", {1, 3, 8, 8});
    b.Node("Attention", {"q", "k", "v"}, {"y"}, "attention");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'attention' (Attention)", "with KV dividing H");
  }
  {
    ModelBuilder b(23);
    for (const char* x : {"q", "k", "v"}) b.Input(x, {1, 2, 8, 8});
    b.Input("past_k", {1, 2, 4, 8});
    b.Node("Attention", {"q", "k", "v", "", "past_k"}, {"y"}, "attention");
    b.Output("y");
    EXPECT_ERROR(b.Import(), StatusCode::kInvalidArgument, "node 'attention' (Attention)",
                 "past_key and past_value come together");
  }
}

TEST(OnnxImport, EinsumRefusesWhatItDoesNotLower) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
    StatusCode code;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"ii->i", {{3, 3}}, StatusCode::kUnimplemented,
            "Einsum equation 'ii->i': label 'i' repeats in operand 0 (a diagonal)"},
           {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}, StatusCode::kUnimplemented, "3 operands are not supported"},
           {"ij->k", {{2, 3}}, StatusCode::kInvalidArgument, "output label 'k' is in no operand"},
           {"ij,jk->ik", {{2, 3}, {4, 5}}, StatusCode::kInvalidArgument,
            "label 'j' is 3 in one operand and 4 in operand 1"},
           {"ijk->i", {{2, 3}}, StatusCode::kInvalidArgument, "term 'ijk' does not fit input 0 of shape [2,3]"},
           {"i1->i", {{2, 3}}, StatusCode::kInvalidArgument, "term 'i1' holds '1'"},
           {"...i,...i->i", {{1, 4}, {3, 4}}, StatusCode::kUnimplemented, "a broadcast contraction is not supported"},
       }) {
    ModelBuilder b(12);
    for (size_t i = 0; i < c.shapes.size(); ++i) b.Input(StrCat("x", i), c.shapes[i]);
    EinsumNode(b, c.eq, c.shapes.size());
    b.Output("y");
    EXPECT_ERROR(b.Import(), c.code, "node 'einsum' (Einsum)", c.message.c_str());
  }
}

// LayerNormalization's optional outputs: InvStdDev asked for without Mean (an empty name).
TEST(OnnxImport, LayerNormalizationStatisticsOutputs) {
  ModelBuilder b(17);
  b.Input("x", {2, 5});
  b.FloatInit("g", {5}, {1, 2, 3, 4, 5});
  b.Node("LayerNormalization", {"x", "g"}, {"y", "", "inv"}, "ln");
  b.Output("y");
  b.Output("inv");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ((*g)->outputs().size(), 2u);
  EXPECT_EQ((*g)->outputs()[1]->shape(), (Shape{2, 1}));
  std::vector<float> x(10);
  for (int i = 0; i < 10; ++i) x[i] = static_cast<float>(std::sin(i * 1.7) * 3);
  Tensor xt = Tensor::FromFloats(DType::kF32, {2, 5}, x).value();
  std::vector<TensorView> views{xt.view()};
  auto out = Execute(**g, views, CpuContext{});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 5; ++i) mean += x[r * 5 + i] / 5.0;
    for (int i = 0; i < 5; ++i) var += (x[r * 5 + i] - mean) * (x[r * 5 + i] - mean) / 5.0;
    const double inv = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR((*out)[1].GetAsDouble(r), inv, 1e-5 * inv);
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR((*out)[0].GetAsDouble(r * 5 + i), (x[r * 5 + i] - mean) * inv * (i + 1), 1e-5 * (i + 1));
  }
}

TEST(OnnxImport, CastMapsTheOnnxEnum) {
  ModelBuilder b;
  b.Input("x", {2});
  SetInt(b.Node("Cast", {"x"}, {"y"}), "to", onnx::TensorProto::FLOAT16);
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(OnlyNode(**g)->GetInt("to", -1), static_cast<int64_t>(DType::kF16));
  EXPECT_EQ((*g)->outputs()[0]->dtype(), DType::kF16);

  ModelBuilder d;
  d.Input("x", {2});
  SetInt(d.Node("Cast", {"x"}, {"y"}, "c"), "to", onnx::TensorProto::DOUBLE);
  d.Output("y");
  EXPECT_ERROR(d.Import(), StatusCode::kUnimplemented, "node 'c' (Cast)", "DOUBLE");
}

TEST(OnnxImport, DropoutIsInferenceIdentity) {
  ModelBuilder b;
  b.Input("x", {3});
  b.FloatInit("ratio", {}, {0.25f});
  auto* mode = b.g().add_initializer();
  mode->set_name("mode");
  mode->set_data_type(onnx::TensorProto::BOOL);
  mode->add_int32_data(0);
  b.Node("Dropout", {"x", "ratio", "mode"}, {"y"});
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(OnlyNode(**g)->GetInt("training", 1), 0);
  EXPECT_EQ(RunF32(**g, {1, 2, 3}), (std::vector<float>{1, 2, 3}));

  // In inference nothing is dropped: the mask output is all true.
  ModelBuilder mask;
  mask.Input("x", {3});
  mask.Node("Dropout", {"x"}, {"y", "m"}, "d");
  mask.Output("m");
  auto gm = mask.Import();
  ASSERT_TRUE(gm.ok()) << gm.status().ToString();
  EXPECT_EQ((*gm)->outputs()[0]->TypeString(), "bool[3]");
  const Tensor x3 = Tensor::FromFloats(DType::kF32, {3}, {1, 2, 3}).value();
  std::vector<TensorView> in3{x3.view()};
  auto m = Execute(**gm, in3, CpuContext{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ((*m)[0].GetAsDouble(i), 1.0);

  ModelBuilder train;
  train.Input("x", {3});
  auto* t = train.g().add_initializer();
  t->set_name("mode");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  train.Node("Dropout", {"x", "", "mode"}, {"y"}, "d");
  train.Output("y");
  EXPECT_ERROR(train.Import(), StatusCode::kUnimplemented, "node 'd' (Dropout)", "training");
}

TEST(OnnxImport, AlphaBetaDefaultsAreOnnxs) {
  ModelBuilder b;
  b.Input("x", {2});
  b.Node("LeakyRelu", {"x"}, {"a"});
  b.Node("HardSigmoid", {"a"}, {"h"});
  SetFloat(b.Node("Elu", {"h"}, {"y"}), "alpha", 0.5f);
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto it = (*g)->nodes().begin();
  EXPECT_FLOAT_EQ((*it)->GetFloat("alpha", 0), 0.01f);
  ++it;
  EXPECT_FLOAT_EQ((*it)->GetFloat("alpha", 0), 0.2f);
  EXPECT_FLOAT_EQ((*it)->GetFloat("beta", 0), 0.5f);
  ++it;
  EXPECT_FLOAT_EQ((*it)->GetFloat("alpha", 0), 0.5f);
}

TEST(OnnxImport, VariadicAndComposedOps) {
  ModelBuilder b;
  b.Input("x", {3});
  b.FloatInit("b", {3}, {1, 2, 3});
  b.FloatInit("c", {1}, {10});
  b.Node("Sum", {"x", "b", "c"}, {"s"});
  b.Node("Mean", {"s", "x"}, {"y"});
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // s = x + b + 10; y = (s + x) / 2
  EXPECT_EQ(RunF32(**g, {2, 4, 6}), (std::vector<float>{7.5f, 10.f, 12.5f}));
  EXPECT_NE((*g)->FindValue("s"), nullptr);

  ModelBuilder le;
  le.Input("x", {3});
  le.FloatInit("z", {}, {0.f});
  le.Node("LessOrEqual", {"x", "z"}, {"y"});
  le.Output("y");
  auto g2 = le.Import();
  ASSERT_TRUE(g2.ok()) << g2.status().ToString();
  EXPECT_EQ((*g2)->outputs()[0]->dtype(), DType::kBool);
  EXPECT_EQ(RunF32(**g2, {-1, 0, NAN}), (std::vector<float>{1, 1, 0}));
}

// Shape -> Gather -> Concat -> Reshape (how exporters write a flatten) folds while importing, so
// the Reshape sees a constant shape; the pipeline then leaves one kernel.
TEST(OnnxImport, ShapeSubgraphsFoldAtLoadTime) {
  ModelBuilder b;
  b.Input("x", {2, 3, 4});
  auto* i0 = b.g().add_initializer();
  i0->set_name("i0");
  i0->set_data_type(onnx::TensorProto::INT64);
  i0->add_dims(1);
  i0->add_int64_data(0);
  auto* m1 = b.g().add_initializer();
  m1->set_name("minus1");
  m1->set_data_type(onnx::TensorProto::INT64);
  m1->add_dims(1);
  m1->add_int64_data(-1);
  b.Node("Shape", {"x"}, {"shape"});
  SetInt(b.Node("Gather", {"shape", "i0"}, {"batch"}), "axis", 0);
  SetInt(b.Node("Concat", {"batch", "minus1"}, {"target"}), "axis", 0);
  b.Node("Reshape", {"x", "target"}, {"flat"});
  b.Node("Relu", {"flat"}, {"y"});
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE((*g)->FindValue("target")->constant());
  EXPECT_EQ((*g)->outputs()[0]->shape(), (Shape{2, 12}));
  ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget()).ok());
  EXPECT_EQ((*g)->num_nodes(), 2u);  // the Reshape view and the Relu
  ExecStats st;
  Tensor x = Tensor::Empty(DType::kF32, {2, 3, 4}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = static_cast<float>(i) - 11.5f;
  TensorView xv = x.view();
  auto out = Execute(**g, {&xv, 1}, CpuContext{}, &st);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(st.kernels_launched, 1);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ((*out)[0].data_as<float>()[i], std::max(0.f, i - 11.5f));
}

TEST(OnnxImport, ConstantNodesBecomeConstants) {
  ModelBuilder b;
  b.Input("x", {2});
  auto* c = b.Node("Constant", {}, {"k"});
  auto* a = c->add_attribute();
  a->set_name("value_floats");
  a->set_type(onnx::AttributeProto::FLOATS);
  a->add_floats(2);
  a->add_floats(3);
  b.Node("Mul", {"x", "k"}, {"y"});
  b.Output("y");
  auto g = b.Import();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->num_nodes(), 1u);
  ASSERT_NE((*g)->FindValue("k")->constant(), nullptr);
  EXPECT_EQ(RunF32(**g, {1, 2}), (std::vector<float>{2, 6}));
}

TEST(OnnxImport, TensorProtoFilesRoundTrip) {
  auto t = Tensor::FromFloats(DType::kBF16, {2, 2}, {1, -2, 0.5f, 8});
  ASSERT_TRUE(t.ok());
  const std::string path = (std::filesystem::temp_directory_path() / "gf_onnx_import_test.pb").string();
  ASSERT_TRUE(WriteTensorProtoFile(path, *t, "t").ok());
  std::string name;
  auto back = ReadTensorProtoFile(path, &name);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(name, "t");
  EXPECT_EQ(back->dtype(), DType::kBF16);
  EXPECT_EQ(back->shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back->GetAsDouble(i), t->GetAsDouble(i));
  std::remove(path.c_str());
  EXPECT_ERROR(ReadTensorProtoFile("/nonexistent.pb"), StatusCode::kNotFound, "/nonexistent.pb");
}

}  // namespace
}  // namespace graphfuse

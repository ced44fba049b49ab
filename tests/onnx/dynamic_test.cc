// Models with symbolic dims and inputs whose values become shapes, through the public API (and
// shape-class templates, passes/shape_template.h):
// a plan per input signature, kept in an LRU cache; contradicting inputs refused before any
// planning. Outputs are checked against a float64 reference computed here and, for the fused
// plan, against the unfused one on the same inputs.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "graphfuse/model.h"
#include "ir/text.h"
#include "onnx/import.h"
#include "passes/shape_template.h"
#include "runtime/signature.h"

namespace graphfuse {
namespace {

constexpr int64_t kHidden = 8;

void AddInput(onnx::GraphProto& g, const std::string& name, int32_t type, const std::vector<std::string>& dims) {
  auto* tt = g.add_input()->mutable_type()->mutable_tensor_type();
  g.mutable_input(g.input_size() - 1)->set_name(name);
  tt->set_elem_type(type);
  auto* shape = tt->mutable_shape();
  for (const std::string& d : dims) {
    auto* dim = shape->add_dim();
    if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0]))) dim->set_dim_value(std::stoll(d));
    else if (!d.empty()) dim->set_dim_param(d);  // "" leaves the dim unnamed
  }
}

void AddNode(onnx::GraphProto& g, const std::string& op, const std::vector<std::string>& ins,
             const std::vector<std::string>& outs) {
  auto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(outs[0] + "_node");
  for (const auto& i : ins) n->add_input(i);
  for (const auto& o : outs) n->add_output(o);
}

void AddInitializer(onnx::GraphProto& g, const std::string& name, const std::vector<int64_t>& dims,
                    const std::vector<float>& f, const std::vector<int64_t>& i = {}) {
  auto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(f.empty() ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  for (float v : f) t->add_float_data(v);
  for (int64_t v : i) t->add_int64_data(v);
}

std::vector<float> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(n);
  for (float& v : w) v = u(rng);
  return w;
}

// y[b, s*8] = Reshape(relu(x @ W + B) * mask[..., None], [Shape(x)[0], -1]): a GEMM with an
// epilogue, a mask broadcast through Unsqueeze, and the shape arithmetic exporters write.
std::string MaskedGemmModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto& g = *m.mutable_graph();
  g.set_name("masked_gemm");
  AddInput(g, "x", onnx::TensorProto::FLOAT, {"batch", "seq", "8"});
  AddInput(g, "mask", onnx::TensorProto::FLOAT, {"batch", "seq"});
  AddInitializer(g, "W", {kHidden, kHidden}, Weights(kHidden * kHidden, 1));
  AddInitializer(g, "B", {kHidden}, Weights(kHidden, 2));
  AddInitializer(g, "zero", {1}, {}, {0});
  AddInitializer(g, "minus_one", {1}, {}, {-1});
  AddNode(g, "MatMul", {"x", "W"}, {"mm"});
  AddNode(g, "Add", {"mm", "B"}, {"a"});
  AddNode(g, "Relu", {"a"}, {"r"});
  AddNode(g, "Unsqueeze", {"mask", "minus_one"}, {"mask3"});
  AddNode(g, "Mul", {"r", "mask3"}, {"rm"});
  AddNode(g, "Shape", {"x"}, {"sx"});
  AddNode(g, "Gather", {"sx", "zero"}, {"b"});
  AddNode(g, "Concat", {"b", "minus_one"}, {"shape"});
  g.mutable_node(g.node_size() - 1)->add_attribute()->set_name("axis");
  g.mutable_node(g.node_size() - 1)->mutable_attribute(0)->set_type(onnx::AttributeProto::INT);
  g.mutable_node(g.node_size() - 1)->mutable_attribute(0)->set_i(0);
  AddNode(g, "Reshape", {"rm", "shape"}, {"y"});
  g.add_output()->set_name("y");
  auto* ot = g.mutable_output(0)->mutable_type()->mutable_tensor_type();
  ot->set_elem_type(onnx::TensorProto::FLOAT);
  ot->mutable_shape()->add_dim()->set_dim_param("batch");
  ot->mutable_shape()->add_dim();
  return m.SerializeAsString();
}

// z = Relu(Reshape(x, s)) with s a graph input: its values become the shape.
std::string ValueShapeModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto& g = *m.mutable_graph();
  g.set_name("value_shape");
  AddInput(g, "x", onnx::TensorProto::FLOAT, {"n", "4"});
  AddInput(g, "s", onnx::TensorProto::INT64, {"2"});
  AddNode(g, "Reshape", {"x", "s"}, {"y"});
  AddNode(g, "Relu", {"y"}, {"z"});
  g.add_output()->set_name("z");
  g.mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m.SerializeAsString();
}

Tensor Random(DType t, const Shape& s, uint32_t seed) {
  Tensor x = Tensor::Empty(t, s).value();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x.SetFromDouble(i, u(rng));
  return x;
}

// The masked GEMM model in float64.
std::vector<double> Reference(const Tensor& x, const Tensor& mask) {
  const std::vector<float> w = Weights(kHidden * kHidden, 1), b = Weights(kHidden, 2);
  const int64_t rows = x.numel() / kHidden;
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kHidden; ++j) {
      double acc = b[j];
      for (int64_t k = 0; k < kHidden; ++k) acc += x.GetAsDouble(r * kHidden + k) * double{w[k * kHidden + j]};
      y[r * kHidden + j] = std::max(acc, 0.0) * mask.GetAsDouble(r);
    }
  return y;
}

struct Compiled {
  std::unique_ptr<CompiledModel> fused, unfused;
};

// A CPU target of one thread (null, with the failure reported, if it cannot be made).
std::shared_ptr<const Target> OneThreadCpu() {
  auto target = MakeTarget("cpu", {.cpu = {.threads = 1}});
  EXPECT_TRUE(target.ok()) << target.status().ToString();
  return target.ok() ? std::shared_ptr<const Target>(std::move(*target)) : nullptr;
}

// The corpus's small LLaMA exported with a KV cache (tests/models/hf/llama_ts_kv).
std::string LlamaKvPath() { return std::string(GF_MODELS_DIR) + "/hf/llama_ts_kv/model.onnx"; }

Compiled CompileBoth(const std::string& bytes, int capacity = 16) {
  std::shared_ptr<const Target> cpu = OneThreadCpu();
  CompileOptions fused_options, unfused_options;
  fused_options.plan_cache_capacity = unfused_options.plan_cache_capacity = capacity;
  unfused_options.fusion.enabled = false;
  auto f = CompiledModel::Compile(Model::FromOnnxBytes(bytes, "m.onnx").value(), cpu, fused_options);
  auto u = CompiledModel::Compile(Model::FromOnnxBytes(bytes, "m.onnx").value(), cpu, unfused_options);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(u.ok()) << u.status().ToString();
  return {std::move(*f), std::move(*u)};
}

TEST(DynamicShapes, ModelDeclaresItsSymbolicDims) {
  auto model = Model::FromOnnxBytes(MaskedGemmModel(), "m.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_FALSE(model->is_static());
  ASSERT_EQ(model->inputs().size(), 2u);
  EXPECT_EQ(model->inputs()[0].shape, (Shape{-1, -1, 8}));
  EXPECT_EQ(model->inputs()[0].dim_params, (std::vector<std::string>{"batch", "seq", ""}));
  EXPECT_FALSE(model->inputs()[0].values_shape_plan);
  ASSERT_EQ(model->outputs().size(), 1u);
  EXPECT_EQ(model->outputs()[0].dim_params, (std::vector<std::string>{"batch", ""}));
  // A static import refuses it, naming the dim.
  auto g = ImportOnnxBytes(MaskedGemmModel(), "m.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("dynamic dim 'batch' of input 'x'"), std::string::npos) << g.status().ToString();
}

// Every shape gets its own plan, fused and unfused agree with each other and with float64, and
// the fused GEMM keeps its epilogue (the mask multiply included) at every shape.
TEST(DynamicShapes, RunsOnEveryShapeThatSatisfiesTheModel) {
  Compiled c = CompileBoth(MaskedGemmModel());
  EXPECT_EQ(c.fused->plan(), nullptr) << "nothing is planned before the first call";
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {2, 5}, {3, 7}, {1, 16}};
  uint32_t seed = 10;
  for (auto [batch, seq] : shapes) {
    const Tensor x = Random(DType::kF32, {batch, seq, kHidden}, seed++);
    Tensor mask = Random(DType::kF32, {batch, seq}, seed++);
    for (int64_t i = 1; i < mask.numel(); i += 3) mask.SetFromDouble(i, 0.0);  // masked positions
    const TensorView in[] = {x.view(), mask.view()};
    auto yf = c.fused->Run(in);
    auto yu = c.unfused->Run(in);
    ASSERT_TRUE(yf.ok()) << yf.status().ToString();
    ASSERT_TRUE(yu.ok()) << yu.status().ToString();
    ASSERT_EQ(yf->at(0).shape(), (Shape{batch, seq * kHidden}));
    const std::vector<double> want = Reference(x, mask);
    double peak = 0;
    for (int64_t i = 0; i < yf->at(0).numel(); ++i) {
      peak = std::max(peak, std::fabs(want[i]));
      EXPECT_NEAR(yf->at(0).GetAsDouble(i), want[i], 1e-5 * (1 + std::fabs(want[i]))) << batch << "x" << seq << " @" << i;
      EXPECT_NEAR(yf->at(0).GetAsDouble(i), yu->at(0).GetAsDouble(i), 1e-5 * (1 + std::fabs(want[i])));
    }
    EXPECT_GT(peak, 0.1);
    const std::shared_ptr<const Plan> plan = c.fused->plan();
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(plan->report().kernels_after, 1) << plan->signature() << ": one fused GEMM with its epilogue";
    EXPECT_EQ(plan->inputs()[0].shape, (Shape{batch, seq, kHidden}));
    EXPECT_GT(plan->planning_time().total_ms(), 0.0);
  }
  EXPECT_EQ(c.fused->cache_stats().plans_made, static_cast<int64_t>(shapes.size()));
  EXPECT_EQ(c.fused->cache_stats().hits, 0);
}

// A second call with a shape already seen finds its plan: no planning, the same Plan object.
TEST(DynamicShapes, AKnownShapeCostsNoPlanning) {
  Compiled c = CompileBoth(MaskedGemmModel());
  const Tensor x = Random(DType::kF32, {2, 3, kHidden}, 1), mask = Random(DType::kF32, {2, 3}, 2);
  const TensorView in[] = {x.view(), mask.view()};
  auto first = c.fused->Run(in);
  ASSERT_TRUE(first.ok());
  const std::shared_ptr<const Plan> plan = c.fused->plan();
  const PlanCacheStats before = c.fused->cache_stats();
  EXPECT_EQ(before.plans_made, 1);
  for (int i = 0; i < 5; ++i) {
    auto again = c.fused->Run(in);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(std::memcmp(again->at(0).data(), first->at(0).data(), first->at(0).nbytes()), 0);
  }
  const PlanCacheStats after = c.fused->cache_stats();
  EXPECT_EQ(after.plans_made, 1);
  EXPECT_EQ(after.hits, 5);
  EXPECT_EQ(after.planning_ms, before.planning_ms);
  EXPECT_EQ(c.fused->plan(), plan);
}

// With room for 2 plans: A, B, A, C drops B (the least recently used); A is still a hit and B
// is planned again.
TEST(DynamicShapes, TheCacheDropsTheLeastRecentlyUsedPlan) {
  Compiled c = CompileBoth(MaskedGemmModel(), /*capacity=*/2);
  auto run = [&](int64_t seq) {
    const Tensor x = Random(DType::kF32, {1, seq, kHidden}, 3), mask = Random(DType::kF32, {1, seq}, 4);
    const TensorView in[] = {x.view(), mask.view()};
    ASSERT_TRUE(c.fused->Run(in).ok());
  };
  run(1), run(2), run(1), run(3);
  PlanCacheStats s = c.fused->cache_stats();
  EXPECT_EQ(s.plans_made, 3);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.size, 2);
  run(1);
  EXPECT_EQ(c.fused->cache_stats().plans_made, 3) << "seq 1 was used more recently than seq 2";
  run(2);
  EXPECT_EQ(c.fused->cache_stats().plans_made, 4) << "seq 2 was dropped";
  CompileOptions no_cache;
  no_cache.plan_cache_capacity = 0;
  EXPECT_FALSE(
      CompiledModel::Compile(Model::FromOnnxBytes(MaskedGemmModel()).value(), MakeTarget("cpu").value(), no_cache)
          .ok());
}

// Inputs that contradict the model are refused with InvalidArgument naming the input and the
// dim, and nothing is planned for them; the model stays usable.
TEST(DynamicShapes, ContradictionsAreRefusedBeforePlanning) {
  Compiled c = CompileBoth(MaskedGemmModel());
  auto refuse = [&](const Tensor& x, const Tensor& mask, std::vector<std::string> words) {
    const TensorView in[] = {x.view(), mask.view()};
    auto r = c.fused->Run(in);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& w : words) EXPECT_NE(r.status().message().find(w), std::string::npos) << r.status().ToString();
  };
  const Tensor mask = Random(DType::kF32, {2, 3}, 1);
  refuse(Random(DType::kF32, {2, 3}, 2), mask, {"input 'x'", "rank 2", "f32[batch,seq,8]"});
  refuse(Random(DType::kF32, {2, 3, 9}, 2), mask, {"input 'x'", "dim 2 is 9", "fixes it at 8"});
  refuse(Random(DType::kF32, {2, 4, 8}, 2), mask, {"input 'mask'", "'seq'", "is 3", "= 4"});
  refuse(Random(DType::kF16, {2, 3, 8}, 2), mask, {"input 'x'", "f16"});
  // A dim far beyond memory: refused from the shape alone (no data is read).
  {
    const TensorView huge{DType::kF32, {1 << 20, 1 << 20, 8}, nullptr};
    const TensorView m{DType::kF32, {1 << 20, 1 << 20}, nullptr};
    const TensorView in[] = {huge, m};
    auto r = c.fused->PlanFor(in);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("more than this machine's memory"), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(c.fused->cache_stats().plans_made, 0);
  const Tensor x = Random(DType::kF32, {2, 3, 8}, 5);
  const TensorView in[] = {x.view(), mask.view()};
  EXPECT_TRUE(c.fused->Run(in).ok());
}

// An input whose values become a shape: the plan is made for its values, one per set seen.
TEST(DynamicShapes, ValuesThatBecomeShapesSelectThePlan) {
  auto model = Model::FromOnnxBytes(ValueShapeModel(), "v.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE(model->inputs()[1].values_shape_plan);
  EXPECT_FALSE(model->inputs()[0].values_shape_plan);
  Compiled c = CompileBoth(ValueShapeModel());
  const Tensor x = Random(DType::kF32, {6, 4}, 9);
  for (const Shape& target : {Shape{3, 8}, Shape{8, 3}, Shape{24, 1}, Shape{3, 8}}) {
    Tensor s = Tensor::Empty(DType::kI64, {2}).value();
    s.data_as<int64_t>()[0] = target[0], s.data_as<int64_t>()[1] = target[1];
    const TensorView in[] = {x.view(), s.view()};
    auto z = c.fused->Run(in);
    ASSERT_TRUE(z.ok()) << z.status().ToString();
    ASSERT_EQ(z->at(0).shape(), target);
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(z->at(0).GetAsDouble(i), std::max(0.0, x.GetAsDouble(i)));
  }
  EXPECT_EQ(c.fused->cache_stats().plans_made, 3);
  EXPECT_EQ(c.fused->cache_stats().hits, 1);
  // A shape the values cannot give is the Reshape's error, naming the node.
  Tensor bad = Tensor::Empty(DType::kI64, {2}).value();
  bad.data_as<int64_t>()[0] = 5, bad.data_as<int64_t>()[1] = 5;
  const TensorView in[] = {x.view(), bad.view()};
  auto r = c.fused->Run(in);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("Reshape"), std::string::npos) << r.status().ToString();
}

// Several threads meeting new and known shapes at once all get right answers.
TEST(DynamicShapes, ThreadsShareThePlanCache) {
  Compiled c = CompileBoth(MaskedGemmModel(), /*capacity=*/3);
  std::vector<int> failures(6, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) {
        const int64_t seq = 1 + (t + r) % 5;
        const Tensor x = Random(DType::kF32, {1, seq, kHidden}, 100 + t), mask = Random(DType::kF32, {1, seq}, 200 + t);
        const TensorView in[] = {x.view(), mask.view()};
        auto y = c.fused->Run(in);
        if (!y.ok()) {
          ++failures[t];
          continue;
        }
        const std::vector<double> want = Reference(x, mask);
        for (int64_t i = 0; i < y->at(0).numel(); ++i)
          if (std::fabs(y->at(0).GetAsDouble(i) - want[i]) > 1e-5 * (1 + std::fabs(want[i]))) {
            ++failures[t];
            break;
          }
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_LE(c.fused->cache_stats().size, 3);
}

TEST(DynamicShapes, ShapeFlagsBindDimsByInputOrByName) {
  auto m = OnnxModel::FromBytes(MaskedGemmModel(), "m.onnx");
  ASSERT_TRUE(m.ok());
  std::map<std::string, Shape> flags;
  ASSERT_TRUE(ParseShapeFlag("x=2x5x8", &flags).ok());
  ASSERT_TRUE(ParseShapeFlag("seq=5", &flags).ok());
  auto b = BindShapes((*m)->inputs(), flags);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->shapes[1], (Shape{2, 5}));
  EXPECT_EQ(b->symbols.at("batch"), 2);
  EXPECT_FALSE(ParseShapeFlag("x=2x5x8", &flags).ok()) << "given twice";
  EXPECT_FALSE(ParseShapeFlag("x=2xax8", &flags).ok());
  EXPECT_FALSE(ParseShapeFlag("=3", &flags).ok());
  auto missing = BindShapes((*m)->inputs(), {{"batch", {2}}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'seq'"), std::string::npos) << missing.status().ToString();
  auto contradicted = BindShapes((*m)->inputs(), {{"x", {2, 5, 8}}, {"batch", {3}}});
  ASSERT_FALSE(contradicted.ok());
  EXPECT_NE(contradicted.status().message().find("'batch' = 2"), std::string::npos) << contradicted.status().ToString();
}

// The corpus's LLaMA with a KV cache, at `past` cached rows and one new token per sequence of
// the batch: its inputs (random ids and cache rows, positions after the past).
std::vector<Tensor> DecodeInputs(int64_t past, uint32_t seed, int64_t batch = 1) {
  std::vector<Tensor> in;
  in.push_back(Tensor::Empty(DType::kI64, {batch, 1}).value());
  for (int64_t b = 0; b < batch; ++b) in.back().SetFromDouble(b, static_cast<double>(7 + (seed + b * 13) % 100));
  in.push_back(Tensor::Empty(DType::kI64, {batch, past + 1}).value());
  for (int64_t i = 0; i < in.back().numel(); ++i) in.back().SetFromDouble(i, 1);
  in.push_back(Tensor::Empty(DType::kI64, {batch, 1}).value());
  for (int64_t b = 0; b < batch; ++b) in.back().SetFromDouble(b, static_cast<double>(past));
  for (int k = 0; k < 4; ++k) in.push_back(Random(DType::kF32, {batch, 4, past, 16}, seed * 8 + k));
  return in;
}

// The same model's inputs for a prompt of `seq` tokens on an empty cache.
std::vector<Tensor> PromptInputs(int64_t seq, uint32_t seed) {
  std::vector<Tensor> in = DecodeInputs(0, seed);
  for (int k = 0; k < 3; ++k) in[static_cast<size_t>(k)] = Tensor::Empty(DType::kI64, {1, seq}).value();
  for (int64_t i = 0; i < seq; ++i) {
    in[0].SetFromDouble(i, static_cast<double>((i * 37 + seed) % 150));
    in[1].SetFromDouble(i, 1);
    in[2].SetFromDouble(i, static_cast<double>(i));
  }
  return in;
}

// Plans for new shapes take the weights their first plan derived (the concatenated projections,
// the packed panels) from the model's store: one copy, whatever the number of shapes, and the
// same results as a model that planned only that shape.
TEST(DynamicShapes, PlansOfEveryShapeShareOneCopyOfTheDerivedWeights) {
  const std::string path = LlamaKvPath();
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  auto model = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  // The weights each plan's GEMMs read (FusedGemm input 1: concatenated projections).
  auto gemm_weights = [](const Plan& p) {
    std::map<std::string, const Tensor*> w;
    for (const auto& n : p.graph().nodes())
      if (n->op() == "FusedGemm" && n->input(1)->constant()) w[n->name()] = n->input(1)->constant().get();
    return w;
  };
  std::map<std::string, const Tensor*> first_weights;
  PlanCacheStats first{};
  for (int64_t past : {5, 6, 11, 30}) {
    const std::vector<Tensor> in = DecodeInputs(past, static_cast<uint32_t>(past));
    std::vector<TensorView> views;
    for (const Tensor& t : in) views.push_back(t.view());
    auto out = (*model)->Run(views);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const PlanCacheStats stats = (*model)->cache_stats();
    const auto weights = gemm_weights(*(*model)->plan());
    ASSERT_FALSE(weights.empty());
    if (past == 5) {
      first = stats, first_weights = weights;
      EXPECT_GT(stats.prepared_bytes, 0);
      EXPECT_GT(stats.last_planning_ms, 0);
    } else {
      EXPECT_EQ(weights, first_weights) << "past " << past << ": a plan made its own copy of the weights";
      EXPECT_EQ(stats.prepared_entries, first.prepared_entries) << "past " << past;
      EXPECT_EQ(stats.prepared_bytes, first.prepared_bytes) << "past " << past;
    }
    // A model that plans this shape alone, with weights of its own, computes the same bits.
    auto alone = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu);
    ASSERT_TRUE(alone.ok());
    auto expected = (*alone)->Run(views);
    ASSERT_TRUE(expected.ok());
    ASSERT_EQ(out->size(), expected->size());
    for (size_t i = 0; i < out->size(); ++i)
      EXPECT_EQ(std::memcmp((*out)[i].data(), (*expected)[i].data(), (*out)[i].nbytes()), 0)
          << "past " << past << ", output " << i;
    EXPECT_NE(gemm_weights(*(*alone)->plan()), first_weights);  // its own store: its own copy
  }
  // Past 6 was planned ahead by past 5 (with 7), so three calls planned.
  EXPECT_EQ((*model)->cache_stats().plans_made, 3);
  EXPECT_EQ((*model)->cache_stats().plans_ahead, 2);
}

// A decode loop meets a new cache length at every call. The class's first call plans its length
// and the next two from the model (the template fitted on the second, checked on the third), so
// that its second and third calls find their plans; from then on the class's template makes
// them, with no import or passes, and every output has the bits of a model that plans every
// length from the model. A cache of 1 row is no member (sizes 0 and 1 are special). Prompts
// (past 0) are a class of their own, whose causal mask (a folded constant) the template makes
// for each length.
TEST(DynamicShapes, PlansOfOneShapeClassComeFromItsTemplate) {
  const std::string path = LlamaKvPath();
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  CompileOptions per_shape, roomy;
  per_shape.shape_classes = false;
  roomy.plan_cache_capacity = 64;  // every plan made ahead finds room
  auto model = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu, roomy);
  auto reference = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu, per_shape);
  ASSERT_TRUE(model.ok() && reference.ok());
  auto check = [&](const std::vector<Tensor>& in, const std::string& what) {
    std::vector<TensorView> views;
    for (const Tensor& t : in) views.push_back(t.view());
    auto got = (*model)->Run(views);
    auto want = (*reference)->Run(views);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().ToString();
    ASSERT_TRUE(want.ok()) << what << ": " << want.status().ToString();
    for (size_t i = 0; i < got->size(); ++i) {
      ASSERT_EQ((*got)[i].shape(), (*want)[i].shape()) << what << ", output " << i;
      EXPECT_EQ(std::memcmp((*got)[i].data(), (*want)[i].data(), (*got)[i].nbytes()), 0) << what << ", output " << i;
    }
  };
  const int64_t first = 5, lengths = 12;
  for (int64_t past = first; past < first + lengths; ++past) {
    check(DecodeInputs(past, static_cast<uint32_t>(past)), StrCat("decode on ", past, " cached rows"));
    const PlanCacheStats s = (*model)->cache_stats();
    EXPECT_EQ((*model)->plan()->from_template(), past >= first + 3) << "past " << past;
    if (past == first) EXPECT_EQ(s.shape_classes, 1) << "the first call fits and checks the template";
    if (past == first + 1 || past == first + 2) EXPECT_EQ(s.last_planning_ms, 0) << "past " << past << " was planned ahead";
  }
  // The CPU reads no reference graph: plans from the template leave out the attention's, whose
  // sizes move.
  int cached_attention = 0;
  for (const auto& n : (*model)->plan()->graph().nodes())
    if (n->op() == "FusedCachedAttention") {
      ++cached_attention;
      EXPECT_EQ(n->GetGraph("reference"), nullptr) << n->name();
    }
  EXPECT_GT(cached_attention, 0);
  PlanCacheStats stats = (*model)->cache_stats();
  EXPECT_EQ(stats.plans_made, lengths - 2);
  EXPECT_EQ(stats.plans_ahead, 2);
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.plans_from_template, lengths - 3);
  EXPECT_EQ(stats.shape_classes, 1);
  EXPECT_EQ((*reference)->cache_stats().plans_from_template, 0);
  check(DecodeInputs(1, 1), "decode on 1 cached row");
  EXPECT_FALSE((*model)->plan()->from_template());
  // The class's own first length, its plan dropped from the cache: the template makes it again.
  {
    auto small = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu, [] {
      CompileOptions o;
      o.plan_cache_capacity = 2;
      return o;
    }());
    ASSERT_TRUE(small.ok());
    for (int64_t past : {5, 6, 8, 9, 5}) {
      std::vector<TensorView> views;
      const std::vector<Tensor> in = DecodeInputs(past, 1);
      for (const Tensor& t : in) views.push_back(t.view());
      ASSERT_TRUE((*small)->Run(views).ok());
    }
    // 5 planned with 6 and 7 ahead, 7 finding no room; 6 a hit; 8, 9 and 5 again (dropped for
    // room) from the template.
    EXPECT_TRUE((*small)->plan()->from_template());
    EXPECT_EQ((*small)->cache_stats().hits, 1);
    EXPECT_EQ((*small)->cache_stats().plans_from_template, 3);
  }
  // Prompts: 1 to 6 tokens on an empty cache.
  for (int64_t seq = 1; seq <= 6; ++seq) check(PromptInputs(seq, static_cast<uint32_t>(seq)), StrCat("prompt of ", seq));
  stats = (*model)->cache_stats();
  // Prompts of 1 and 2 tokens are planned from the model (1 is no member; 2 plans 3 and 4
  // ahead, which are hits), 5 and 6 come from the template.
  EXPECT_EQ(stats.plans_made, lengths - 2 + 1 + 4);
  EXPECT_EQ(stats.hits, 2 + 2);
  EXPECT_EQ(stats.plans_from_template, lengths - 3 + 2);
  EXPECT_EQ(stats.shape_classes, 2);
}

// A prompt of 70 tokens (past the rows where a static plan takes oneDNN's matmul) and the decode
// steps after it: the plans of a model with symbolic dims keep one packed form of each weight
// (the own panels), so the decode steps prepare nothing new, and explain says why.
TEST(DynamicShapes, APromptAndItsDecodeStepsShareOnePackedFormOfEachWeight) {
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  auto model = CompiledModel::Compile(Model::FromOnnxFile(LlamaKvPath()).value(), cpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t seq = 70;
  const std::vector<Tensor> prompt = PromptInputs(seq, 5);
  std::vector<TensorView> views;
  for (const Tensor& t : prompt) views.push_back(t.view());
  ASSERT_TRUE((*model)->Run(views).ok());
  const PlanCacheStats after_prompt = (*model)->cache_stats();
  EXPECT_GT(after_prompt.prepared_bytes, 0);
  int gemms = 0;
  for (const KernelChoice& k : (*model)->plan()->kernel_choices())
    if (k.how.find(StrCat(seq, "x")) == 0) {
      ++gemms;
      EXPECT_NE(k.how.find("serve every one"), std::string::npos) << k.node << ": " << k.how;
    }
  EXPECT_GT(gemms, 0);
  for (int64_t past : {seq, seq + 1, seq + 5}) {
    views.clear();
    const std::vector<Tensor> in = DecodeInputs(past, static_cast<uint32_t>(past));
    for (const Tensor& t : in) views.push_back(t.view());
    ASSERT_TRUE((*model)->Run(views).ok());
    EXPECT_EQ((*model)->cache_stats().prepared_entries, after_prompt.prepared_entries) << "past " << past;
    EXPECT_EQ((*model)->cache_stats().prepared_bytes, after_prompt.prepared_bytes) << "past " << past;
  }
}

// The look-ahead moves every size of 2 or more; a batch of 2 keeps its batch while the cache
// grows. The class's second call is then no member of the guessed template: the class is
// refitted on the calls themselves (the second fits, the third checks), and from the fourth its
// template makes the plans, with the bits of a model that plans every length from the model.
TEST(DynamicShapes, ALookAheadThatMovedTooManySizesIsRefittedOnTheCalls) {
  const std::string path = LlamaKvPath();
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  CompileOptions per_shape;
  per_shape.shape_classes = false;
  auto model = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu);
  auto reference = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu, per_shape);
  ASSERT_TRUE(model.ok() && reference.ok());
  for (int64_t past = 5; past < 11; ++past) {
    const std::vector<Tensor> in = DecodeInputs(past, static_cast<uint32_t>(past), /*batch=*/2);
    std::vector<TensorView> views;
    for (const Tensor& t : in) views.push_back(t.view());
    auto got = (*model)->Run(views);
    auto want = (*reference)->Run(views);
    ASSERT_TRUE(got.ok() && want.ok()) << "past " << past;
    for (size_t i = 0; i < got->size(); ++i)
      EXPECT_EQ(std::memcmp((*got)[i].data(), (*want)[i].data(), (*got)[i].nbytes()), 0) << "past " << past << ", output " << i;
    EXPECT_EQ((*model)->plan()->from_template(), past >= 8) << "past " << past;
  }
  const PlanCacheStats s = (*model)->cache_stats();
  EXPECT_EQ(s.plans_ahead, 2);  // batch 3 and 4: never asked for
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.plans_from_template, 3);
  EXPECT_EQ(s.shape_classes, 1);
}

// A KV cache kept in place, the onnxruntime-genai way: each past is the first P rows of a buffer
// of `cap` rows, each present the first P + 1 rows of the same buffer. The plan takes both in
// place (the fused cached attention writes only the new row); eight decode steps give the
// logits and cache rows of plain runs that return new presents, and the rows past P + 1 stay
// unwritten.
TEST(DynamicShapes, KvCacheKeptInPlaceWritesOnlyTheNewRows) {
  const std::string path = LlamaKvPath();
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  auto model = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  constexpr int64_t kv = 4, d = 16, cap = 16, first = 3, steps = 8;
  std::vector<Tensor> buffers, plain_past;
  for (int k = 0; k < 4; ++k) {
    buffers.push_back(Tensor::Empty(DType::kF32, {1, kv, cap, d}).value());
    float* b = buffers.back().data_as<float>();
    std::fill(b, b + buffers.back().numel(), std::nanf(""));  // a row read before it is written shows
    plain_past.push_back(Random(DType::kF32, {1, kv, first, d}, 40 + k));
    for (int64_t h = 0; h < kv; ++h)
      std::memcpy(b + h * cap * d, plain_past.back().data_as<float>() + h * first * d, first * d * sizeof(float));
  }
  auto rows_of = [&](Tensor& buffer, int64_t rows) {
    return TensorView{DType::kF32, {1, kv, rows, d}, buffer.data(), {kv * cap * d, cap * d, d, 1}};
  };
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t past = first + step;
    std::vector<Tensor> small = DecodeInputs(past, static_cast<uint32_t>(step));
    std::vector<TensorView> in_place{small[0].view(), small[1].view(), small[2].view()}, plain{in_place};
    for (int k = 0; k < 4; ++k) in_place.push_back(rows_of(buffers[k], past)), plain.push_back(plain_past[k].view());
    auto plan = (*model)->PlanFor(in_place);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_TRUE((*plan)->takes_strided(false, 3 + k)) << (*plan)->inputs()[3 + k].name;
      EXPECT_TRUE((*plan)->takes_strided(true, 1 + k)) << (*plan)->outputs()[1 + k].name;
    }
    EXPECT_FALSE((*plan)->takes_strided(false, 0));
    EXPECT_FALSE((*plan)->takes_strided(true, 0));
    Tensor logits = Tensor::Empty(DType::kF32, (*plan)->outputs()[0].shape).value();
    std::vector<TensorView> out{logits.view()};
    for (int k = 0; k < 4; ++k) out.push_back(rows_of(buffers[k], past + 1));
    const Status run = (*model)->Run(in_place, out);
    ASSERT_TRUE(run.ok()) << run.ToString();
    auto want = (*model)->Run(plain);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    for (int64_t i = 0; i < logits.numel(); ++i)
      ASSERT_NEAR(logits.data_as<float>()[i], (*want)[0].data_as<float>()[i], 1e-5) << "step " << step << ", logit " << i;
    for (int k = 0; k < 4; ++k) {
      const float* b = buffers[k].data_as<float>();
      const float* w = (*want)[1 + k].data_as<float>();
      for (int64_t h = 0; h < kv; ++h) {
        for (int64_t r = 0; r <= past; ++r)
          for (int64_t c = 0; c < d; ++c)
            ASSERT_EQ(b[(h * cap + r) * d + c], w[(h * (past + 1) + r) * d + c])
                << "step " << step << ", present " << k << ", head " << h << ", row " << r;
        for (int64_t r = past + 1; r < cap; ++r) ASSERT_TRUE(std::isnan(b[(h * cap + r) * d])) << "row " << r;
      }
      plain_past[k] = std::move((*want)[1 + k]);
    }
  }
}

// Strided views the plan does not take in place are copied around the run: an attention mask
// read from every other element of a buffer, logits written into a wider one; the same values
// as contiguous ones. A present that overlaps its past with other strides is refused.
TEST(DynamicShapes, OtherStridedViewsAreCopiedAndOverlapsRefused) {
  const std::shared_ptr<const Target> cpu = OneThreadCpu();
  ASSERT_NE(cpu, nullptr);
  auto model = CompiledModel::Compile(Model::FromOnnxFile(LlamaKvPath()).value(), cpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t past = 5;
  const std::vector<Tensor> in = DecodeInputs(past, 3);
  std::vector<TensorView> views;
  for (const Tensor& t : in) views.push_back(t.view());
  auto want = (*model)->Run(views);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  Tensor mask = Tensor::Empty(DType::kI64, {1, 2 * (past + 1)}).value();
  for (int64_t i = 0; i < mask.numel(); ++i) mask.SetFromDouble(i, i % 2 == 0 ? 1 : 0);
  std::vector<TensorView> strided = views;
  strided[1] = TensorView{DType::kI64, {1, past + 1}, mask.data(), {2 * (past + 1), 2}};
  const Shape logits_shape = (*want)[0].shape();
  ASSERT_EQ(logits_shape.size(), 3u);
  const int64_t vocab = logits_shape[2];
  Tensor wide = Tensor::Empty(DType::kF32, {1, 1, vocab + 7}).value();
  std::vector<Tensor> presents;
  std::vector<TensorView> out{TensorView{DType::kF32, logits_shape, wide.data(), {vocab + 7, vocab + 7, 1}}};
  for (size_t k = 1; k < want->size(); ++k) {
    presents.push_back(Tensor::Empty(DType::kF32, (*want)[k].shape()).value());
    out.push_back(presents.back().view());
  }
  ASSERT_TRUE((*model)->Run(strided, out).ok());
  for (int64_t i = 0; i < vocab; ++i) ASSERT_EQ(wide.data_as<float>()[i], (*want)[0].data_as<float>()[i]) << i;
  for (size_t k = 0; k < presents.size(); ++k)
    EXPECT_EQ(std::memcmp(presents[k].data(), (*want)[k + 1].data(), presents[k].nbytes()), 0) << "present " << k;

  // past K and present K both contiguous in one buffer: present's heads lie further apart than
  // past's, so the copy would overwrite past rows it has yet to read.
  Tensor buffer = Random(DType::kF32, {1, 4, past + 1, 16}, 9);
  std::vector<TensorView> overlap_in = views;
  overlap_in[3] = TensorView{DType::kF32, {1, 4, past, 16}, buffer.data()};
  std::vector<TensorView> overlap_out = out;
  overlap_out[1] = buffer.view();
  const Status refused = (*model)->Run(overlap_in, overlap_out);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("overlaps past K"), std::string::npos) << refused.ToString();
  // Strides that do not match the rank.
  overlap_in[3] = views[3];
  overlap_in[3].strides = {1, 2};
  const Status bad = (*model)->Run(overlap_in, out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("with 2 strides"), std::string::npos) << bad.ToString();
}

// ShapeTemplate alone: a reshape whose target moves with its input's length; plans that differ
// in an op, or in a size that did not move by a multiple of the step, make no template.
TEST(ShapeTemplate, MovesSizesAndRefusesAnythingElse) {
  auto parse = [](int64_t n, const char* tail) {
    auto g = ParseGraph(StrCat("graph @g(%x: f32[2,", n, "]) {\n  %s: i64[2] = const [", n, ", 2]\n",
                               "  %y: f32[", n, ",2] = Reshape(%x, %s)\n", tail, "}\n"));
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return std::shared_ptr<const Graph>(std::move(*g));
  };
  auto a = parse(5, "  return %y\n");
  auto tmpl = ShapeTemplate::Fit(a, *parse(6, "  return %y\n"), 1);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  auto at8 = tmpl->Instantiate(3);
  ASSERT_TRUE(at8.ok()) << at8.status().ToString();
  const FlatGraph want = Flatten(*parse(8, "  return %y\n")), got = Flatten(**at8);
  EXPECT_EQ(got.structure, want.structure);
  EXPECT_EQ(got.ints, want.ints);
  EXPECT_FALSE(tmpl->Instantiate(-6).ok());  // a dim of -1
  EXPECT_EQ(ShapeTemplate::Fit(a, *parse(6, "  %z: f32[6,2] = Relu(%y)\n  return %z\n"), 1).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(ShapeTemplate::Fit(a, *parse(7, "  return %y\n"), 3).status().code(), StatusCode::kUnimplemented);
}

// Instantiate(t, /*references=*/false) leaves out the reference graphs whose sizes move and
// keeps the others (shared with the first plan); everything else is the full instantiation.
TEST(ShapeTemplate, LeavesOutMovingReferenceGraphsOnRequest) {
  auto plan = [](int64_t n) {
    auto g = std::make_shared<Graph>("g");
    Value* x = g->AddInput("x", DType::kF32, {n, 4}).value();
    auto moving = std::make_shared<Graph>("moving");
    Value* rx = moving->AddInput("x", DType::kF32, {n, 4}).value();
    EXPECT_TRUE(moving->MarkOutput(moving->AddNode("Relu", {rx}).value()->output()).ok());
    static const std::shared_ptr<const Graph> fixed = [] {
      auto f = std::make_shared<Graph>("fixed");
      Value* fx = f->AddInput("x", DType::kF32, {1, 4}).value();
      EXPECT_TRUE(f->MarkOutput(f->AddNode("Relu", {fx}).value()->output()).ok());
      return f;
    }();
    Node* r = g->AddNode("Relu", {x}, {{"reference", std::shared_ptr<const Graph>(moving)}}, "r").value();
    Node* s = g->AddNode("Relu", {r->output()}, {{"reference", fixed}}, "s").value();
    EXPECT_TRUE(g->MarkOutput(s->output()).ok());
    return std::shared_ptr<const Graph>(std::move(g));
  };
  auto base = plan(5);
  auto tmpl = ShapeTemplate::Fit(base, *plan(6), 1);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  auto full = tmpl->Instantiate(2), lean = tmpl->Instantiate(2, /*references=*/false);
  ASSERT_TRUE(full.ok() && lean.ok());
  const FlatGraph want = Flatten(*plan(7));
  EXPECT_EQ(Flatten(**full).structure, want.structure);
  EXPECT_EQ(Flatten(**full).ints, want.ints);
  auto find = [](const Graph& g, const std::string& name) -> const Node* {
    for (const auto& n : g.nodes())
      if (n->name() == name) return n.get();
    return nullptr;
  };
  const Node* r = find(**lean, "r");
  const Node* s = find(**lean, "s");
  ASSERT_TRUE(r && s);
  EXPECT_EQ(r->GetGraph("reference"), nullptr) << "its sizes moved";
  EXPECT_EQ(s->GetGraph("reference"), find(*base, "s")->GetGraph("reference")) << "fixed: shared";
  EXPECT_EQ(r->output()->shape(), (Shape{7, 4}));
}

}  // namespace
}  // namespace graphfuse

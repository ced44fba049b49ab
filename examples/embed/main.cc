// Loads the ONNX model named on the command line, compiles it for a target, runs it on random
// inputs and prints each output's name and shape (and what fusion did).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <graphfuse/graphfuse.h>

namespace gf = graphfuse;

int main(int argc, char** argv) {
  std::string model_path, target_name = "cpu";
  gf::TargetOptions target_options;
  gf::CompileOptions compile_options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) {
      target_name = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      target_options.cpu.threads = std::atoi(argv[++i]);
    } else if (a == "--cpu-codegen") {
      target_options.cpu.codegen = true;
    } else if (a == "--no-fuse") {
      compile_options.fusion.enabled = false;
    } else if (model_path.empty() && a[0] != '-') {
      model_path = a;
    } else {
      std::fprintf(stderr, "usage: embed MODEL.onnx [--target cpu|cuda] [--threads N] [--cpu-codegen] [--no-fuse]\n");
      return 2;
    }
  }
  if (model_path.empty()) {
    std::fprintf(stderr, "usage: embed MODEL.onnx [--target cpu|cuda] [--threads N] [--cpu-codegen] [--no-fuse]\n");
    return 2;
  }

  auto model = gf::Model::FromOnnxFile(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "embed: %s\n", model.status().ToString().c_str());
    return 2;
  }
  auto target = gf::MakeTarget(target_name, target_options);
  if (!target.ok()) {
    std::fprintf(stderr, "embed: %s\n", target.status().ToString().c_str());
    return 2;
  }
  auto compiled = gf::CompiledModel::Compile(std::move(*model), std::move(*target), compile_options);
  if (!compiled.ok()) {
    std::fprintf(stderr, "embed: %s\n", compiled.status().ToString().c_str());
    return 2;
  }

  // Random inputs: floats uniform in [-1, 1), integers and bools zero.
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<gf::Tensor> inputs;
  std::vector<gf::TensorView> views;
  for (const gf::TensorInfo& in : (*compiled)->inputs()) {
    gf::Shape shape = in.shape;
    for (int64_t& d : shape) d = d < 0 ? 1 : d;  // a symbolic dim: size 1
    auto t = gf::Tensor::Empty(in.dtype, shape);
    if (!t.ok()) {
      std::fprintf(stderr, "embed: input '%s': %s\n", in.name.c_str(), t.status().ToString().c_str());
      return 2;
    }
    for (int64_t i = 0; i < t->numel(); ++i) t->SetFromDouble(i, gf::IsFloat(in.dtype) ? u(rng) : 0.0);
    inputs.push_back(std::move(*t));
  }
  for (const gf::Tensor& t : inputs) views.push_back(t.view());

  auto outputs = (*compiled)->Run(views);
  if (!outputs.ok()) {
    std::fprintf(stderr, "embed: %s\n", outputs.status().ToString().c_str());
    return 1;
  }
  const std::shared_ptr<const gf::Plan> plan = (*compiled)->plan();
  const gf::FusionReport& report = plan->report();
  std::printf("%s on %s: %lld kernels -> %lld (%zu fused groups)\n", model_path.c_str(), target_name.c_str(),
              static_cast<long long>(report.kernels_before), static_cast<long long>(report.kernels_after),
              report.groups.size());
  for (size_t i = 0; i < outputs->size(); ++i) {
    const gf::TensorInfo& info = plan->outputs()[i];
    std::printf("%s %s%s\n", info.name.c_str(), gf::DTypeName(info.dtype), gf::ShapeToString(info.shape).c_str());
  }
  return 0;
}

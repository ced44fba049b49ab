// Running an ONNX test directory (model.onnx + test_data_set_*/input_*.pb, output_*.pb) through
// OnnxModel (a plan per data set) + Execute and comparing the outputs, numpy.allclose-style.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_target.h"
#include "graphfuse/cpu.h"
#include "graphfuse/tensor.h"
#include "onnx/import.h"
#include "passes/pipeline.h"
#include "runtime/signature.h"
#include "cpu/executor.h"

namespace graphfuse::testing {

struct Tolerance {
  double rtol;
  double atol;
};

struct Comparison {
  bool ok = true;
  double max_abs_err = 0;
  double max_rel_err = 0;
  std::string detail;  // the first mismatch, or why the tensors cannot be compared
};

// |out - ref| <= atol + rtol * |ref| for floats (NaN matches NaN, inf must match exactly);
// exact equality for integers and bools. Dtype and shape must agree.
inline Comparison CompareTensors(const Tensor& out, const Tensor& ref, Tolerance tol) {
  Comparison c;
  if (out.dtype() != ref.dtype() || out.shape() != ref.shape()) {
    c.ok = false;
    c.detail = StrCat("got ", DTypeName(out.dtype()), ShapeToString(out.shape()), ", expected ",
                      DTypeName(ref.dtype()), ShapeToString(ref.shape()));
    return c;
  }
  const bool exact = !IsFloat(ref.dtype());
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double o = out.GetAsDouble(i), r = ref.GetAsDouble(i);
    bool good;
    if (std::isnan(r) || std::isnan(o)) {
      good = std::isnan(r) && std::isnan(o);
    } else if (std::isinf(r) || std::isinf(o) || exact) {
      good = o == r;
    } else {
      const double err = std::fabs(o - r);
      c.max_abs_err = std::max(c.max_abs_err, err);
      if (r != 0) c.max_rel_err = std::max(c.max_rel_err, err / std::fabs(r));
      good = err <= tol.atol + tol.rtol * std::fabs(r);
    }
    if (!good && c.ok) {
      c.ok = false;
      c.detail = StrCat("element ", i, ": got ", o, ", expected ", r);
    }
  }
  return c;
}

// The rows of a [B, S, ...] output (logits, last_hidden_state) at query positions that
// attention_mask [B, T] marks as padding (its last S columns), set to 0; nullopt when nothing is
// padded. Such a query attends to no key, so its output is not defined: torch and the exported
// graph may differ there (the dynamo exporter's sdpa exports do, and onnxruntime then gives
// what graphfuse gives). Those rows are compared fused against unfused, not against torch.
inline std::optional<Tensor> BlankPaddedRows(const Tensor& t, const Tensor* mask) {
  if (!mask || mask->shape().size() != 2 || t.shape().size() < 2 || t.shape()[0] != mask->shape()[0]) return std::nullopt;
  const int64_t b = t.shape()[0], s = t.shape()[1], total = mask->shape()[1];
  if (s > total) return std::nullopt;
  const int64_t row = t.numel() / (b * s);
  std::optional<Tensor> out;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) {
      if (mask->GetAsDouble(i * total + total - s + j) != 0) continue;
      if (!out) {
        out = Tensor::Empty(t.dtype(), t.shape()).value();
        for (int64_t k = 0; k < t.numel(); ++k) out->SetFromDouble(k, t.GetAsDouble(k));
      }
      for (int64_t k = 0; k < row; ++k) out->SetFromDouble((i * s + j) * row + k, 0.0);
    }
  return out;
}

// CompareTensors, but for outputs with a row per query (logits, last_hidden_state): their rows
// at padded query positions are left out (BlankPaddedRows).
inline Comparison CompareDefinedRows(const Tensor& out, const Tensor& ref, const std::string& name,
                                     const Tensor* mask, Tolerance tol) {
  const bool per_query = name == "logits" || name == "last_hidden_state";
  const std::optional<Tensor> out_rows = per_query ? BlankPaddedRows(out, mask) : std::nullopt;
  if (!out_rows) return CompareTensors(out, ref, tol);
  const std::optional<Tensor> ref_rows = BlankPaddedRows(ref, mask);
  return ref_rows ? CompareTensors(*out_rows, *ref_rows, tol) : CompareTensors(out, ref, tol);
}


// Files named <prefix><k>.pb in `dir`, in order of k.
inline std::vector<std::string> NumberedFiles(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (int k = 0;; ++k) {
    std::string p = StrCat(dir, "/", prefix, k, ".pb");
    if (!std::filesystem::exists(p)) break;
    out.push_back(p);
  }
  return out;
}

inline std::vector<std::string> DataSets(const std::string& model_dir) {
  std::vector<std::string> sets;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(model_dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  return sets;
}

// The inputs of a data set (`set`/input_<k>.pb), one per name in `names`: a file whose tensor
// names an input fills that input, any other fills its position. An error when the file count
// differs from the input count, or a file does not read.
inline Result<std::vector<Tensor>> ReadDataSetInputs(const std::string& set, const std::vector<std::string>& names) {
  const std::vector<std::string> files = NumberedFiles(set, "input_");
  if (files.size() != names.size())
    return InvalidArgument(set, ": ", files.size(), " input files for ", names.size(), " graph inputs");
  std::vector<Tensor> inputs(names.size());
  for (size_t k = 0; k < files.size(); ++k) {
    std::string name;
    GF_ASSIGN_OR_RETURN(Tensor t, ReadTensorProtoFile(files[k], &name));
    size_t slot = k;
    for (size_t j = 0; j < names.size(); ++j)
      if (!name.empty() && names[j] == name) slot = j;
    inputs[slot] = std::move(t);
  }
  return inputs;
}

enum class Outcome { kPass, kSkip, kFail };

struct DirResult {
  Outcome outcome = Outcome::kPass;
  std::string reason;        // skip reason or failure detail
  bool float32 = false;      // every graph output is f32
  ExecStats stats;           // of the fused plan
  int64_t kernels_unfused = 0, kernels_fused = 0;
  double max_abs_err = 0, max_rel_err = 0;
};

// Loads `dir`/model.onnx and runs every data set twice, each with a plan made for that data
// set's input shapes (and the values of inputs that become shapes): the unfused plan (constant
// folding only) and the fused plan (the full pipeline), each against the expected outputs.
// Unimplemented anywhere = skip; every other error or mismatch = fail. `tol_for` gives the
// tolerance for an output dtype.
template <class TolFor>
DirResult RunOnnxTestDir(const std::string& dir, const CpuContext& ctx, TolFor tol_for) {
  DirResult r;
  auto fail = [&](Outcome o, const std::string& why) {
    r.outcome = o;
    r.reason = why;
    return r;
  };
  auto skip_or_fail = [&](const Status& s, const std::string& stage) {
    return fail(s.code() == StatusCode::kUnimplemented ? Outcome::kSkip : Outcome::kFail,
                stage.empty() ? s.ToString() : StrCat(stage, ": ", s.ToString()));
  };
  auto model = OnnxModel::FromFile(dir + "/model.onnx");
  if (!model.ok()) return skip_or_fail(model.status(), "");
  const std::vector<TensorDecl>& decls = (*model)->inputs();
  r.float32 = !(*model)->outputs().empty();
  for (const TensorDecl& o : (*model)->outputs()) r.float32 &= o.dtype == DType::kF32;
  const auto sets = DataSets(dir);
  if (sets.empty()) return fail(Outcome::kFail, "no test_data_set_* directory");
  for (const std::string& set : sets) {
    std::vector<std::string> names;
    for (const TensorDecl& d : decls) names.push_back(d.name);
    auto read = ReadDataSetInputs(set, names);
    if (!read.ok()) return skip_or_fail(read.status(), "reading inputs");
    const std::vector<Tensor>& inputs = *read;
    std::vector<TensorView> views;
    for (const Tensor& t : inputs) views.push_back(t.view());
    // The plan for this data set's shapes (and values, where they become shapes): unfused
    // (constant folding only) and fused (the full pipeline).
    auto binding = BindInputs(decls, views);
    if (!binding.ok()) return fail(Outcome::kFail, StrCat(set, ": ", binding.status().ToString()));
    std::vector<TensorView> graph_inputs;
    for (size_t k = 0; k < views.size(); ++k)
      if (!binding->values[k]) graph_inputs.push_back(views[k]);
    auto g = (*model)->Instantiate(*binding);
    if (!g.ok()) return skip_or_fail(g.status(), "");
    auto gf = (*model)->Instantiate(*binding);
    if (!gf.ok()) return skip_or_fail(gf.status(), "");
    PipelineOptions unfused_options, fused_options;
    unfused_options.fusion.enabled = false;
    FusionReport fusion;
    fused_options.fusion_report = &fusion;
    if (auto p = RunPipeline(**g, cpu::DefaultCpuTarget(), unfused_options); !p.ok())
      return skip_or_fail(p.status(), "unfused pipeline");
    if (auto p = RunPipeline(**gf, cpu::DefaultCpuTarget(), fused_options); !p.ok())
      return skip_or_fail(p.status(), "fused pipeline");
    if (set == sets.front()) {
      r.kernels_unfused = fusion.kernels_before;
      r.kernels_fused = fusion.kernels_after;
    }
    for (const Graph* run : std::initializer_list<const Graph*>{g->get(), gf->get()}) {
      const char* which = run == g->get() ? "unfused" : "fused";
      auto outs = Execute(*run, graph_inputs, ctx, run == g->get() ? nullptr : &r.stats);
      if (!outs.ok()) return skip_or_fail(outs.status(), StrCat(which, ", at run time"));
      const auto out_files = NumberedFiles(set, "output_");
      if (out_files.size() != outs->size())
        return fail(Outcome::kFail, StrCat(set, ": ", out_files.size(), " output files for ", outs->size(),
                                           " graph outputs"));
      for (size_t k = 0; k < out_files.size(); ++k) {
        auto ref = ReadTensorProtoFile(out_files[k]);
        if (!ref.ok()) return skip_or_fail(ref.status(), "reading outputs");
        const Comparison c = CompareTensors((*outs)[k], *ref, tol_for(ref->dtype()));
        r.max_abs_err = std::max(r.max_abs_err, c.max_abs_err);
        r.max_rel_err = std::max(r.max_rel_err, c.max_rel_err);
        if (!c.ok)
          return fail(Outcome::kFail, StrCat(which, " plan, ", std::filesystem::path(set).filename().string(),
                                             " output ", k, " '", run->outputs()[k]->name(), "': ", c.detail));
      }
    }
  }
  return r;
}

}  // namespace graphfuse::testing

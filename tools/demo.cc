// `graphfuse demo --preset elementwise`: the elementwise operator library, every op as ONE
// kernel launch on random data, checked against the float64 reference and timed beside the
// same-run STREAM triad. (The default demo is the transformer block: block_demo.cc.)
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "core/json.h"
#include "cpu/elementwise_kernels.h"
#include "graphfuse/cpu.h"
#include "ops/check.h"
#include "testing/timer.h"

namespace graphfuse::cli {
namespace {

struct DemoOptions {
  int64_t elements = 1 << 20;
  int threads = 0;
  int repeats = 21;
  std::string json;
};

struct OpRow {
  std::string name;
  double us = 0, gbps = 0, max_ulp = 0;
  bool ok = true;
  std::string failure;
};

Result<DemoOptions> ParseDemo(Args& args) {
  DemoOptions o;
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--elements") {
      // 2^31 f32 elements x 4 tensors = 32 GiB: more than these machines hold.
      GF_ASSIGN_OR_RETURN(o.elements, args.Int(f, 1, int64_t{1} << 30));
    } else if (f == "--threads") {
      GF_ASSIGN_OR_RETURN(int64_t t, args.Int(f, 1, 256));
      o.threads = static_cast<int>(t);
    } else if (f == "--repeats") {
      GF_ASSIGN_OR_RETURN(int64_t r, args.Int(f, 1, 1001));
      o.repeats = static_cast<int>(r);
    } else if (f == "--json") {
      GF_ASSIGN_OR_RETURN(o.json, args.OutputFile(f));
    } else {
      return InvalidArgument("demo: unknown flag '", f, "' (flags: --elements N --threads T --repeats R --json FILE)");
    }
  }
  return o;
}

void FillUniform(Tensor& t, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(static_cast<float>(lo), static_cast<float>(hi));
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
}

}  // namespace

int RunElementwiseDemo(Args& args) {
  auto parsed = ParseDemo(args);
  if (!parsed.ok()) return FailUsage("demo", parsed.status());
  const DemoOptions o = *parsed;
  ThreadPool pool(o.threads);
  const CpuContext ctx{&pool, pool.num_threads()};
  const int64_t n = o.elements;

  std::fprintf(stderr, "graphfuse demo: preparing %lld-element inputs...\n", static_cast<long long>(n));
  auto alloc = [&](DType t, Shape s) { return Tensor::Empty(t, s); };
  auto xr = alloc(DType::kF32, {n}), yr = alloc(DType::kF32, {n}), pr = alloc(DType::kF32, {n}),
       cr = alloc(DType::kBool, {n}), outr = alloc(DType::kF32, {n}), boutr = alloc(DType::kBool, {n});
  for (auto* r : {&xr, &yr, &pr, &cr, &outr, &boutr})
    if (!r->ok()) {
      std::fprintf(stderr, "graphfuse demo: %s\n", r->status().ToString().c_str());
      return kExitBadInput;
    }
  Tensor x = std::move(*xr), y = std::move(*yr), pos = std::move(*pr), cond = std::move(*cr);
  Tensor out = std::move(*outr), bout = std::move(*boutr);
  FillUniform(x, -4, 4, 1);
  FillUniform(y, -4, 4, 2);
  FillUniform(pos, 0.01, 8, 3);
  std::memset(out.data(), 0, out.nbytes());
  std::memset(bout.data(), 0, bout.nbytes());
  for (int64_t i = 0; i < n; ++i) cond.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 2654435761u >> 7) & 1);
  // bool operands for the logical ops
  Tensor b2 = Tensor::Empty(DType::kBool, {n}).value();
  for (int64_t i = 0; i < n; ++i) b2.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 40503u >> 5) & 1);
  // Bias reads a [C] vector over [n/C, C] rows.
  const int64_t C = (n % 4096 == 0) ? 4096 : 1;
  Tensor bias = Tensor::Empty(DType::kF32, {C}).value();
  FillUniform(bias, -1, 1, 4);

  // Same-run ceilings: STREAM triad on the same pool, and the cost of one dispatch.
  Tensor ta = Tensor::Empty(DType::kF32, {n}).value();
  float* a = ta.data_as<float>();
  const float* b = x.data_as<float>();
  const float* c = y.data_as<float>();
  const int nt = ctx.ThreadsFor(n);
  auto triad = MeasureMedian([&] { StreamTriad(pool, nt, a, b, c, n); }, o.repeats);
  const double triad_gbps = 12.0 * n / triad.median_s / 1e9;
  auto dispatch = MeasureMedian([&] { pool.Run(pool.num_threads(), [](void*, int, int) {}, nullptr); }, o.repeats);

  std::printf("graphfuse elementwise library: one kernel launch per op, f32, %lld elements, %d thread(s) max, %s\n",
              static_cast<long long>(n), pool.num_threads(), cpu::SimdTargetName());
  std::printf("same-run ceilings: STREAM triad %.1f GB/s (%d thread(s)); one %d-thread dispatch %.2f us\n\n", triad_gbps,
              nt, pool.num_threads(), dispatch.median_s * 1e6);
  std::printf("%-12s %10s %9s %8s %9s  %s\n", "op", "us/launch", "GB/s", "%triad", "ulp err", "check");

  std::vector<OpRow> rows;
  bool all_ok = true;
  for (const OpInfo& op : AllOps()) {
    std::vector<TensorView> in;
    OpAttrs attrs = DefaultAttrs(op.kind);
    TensorView o_view = out.view();
    const TensorView xv = x.view(), yv = y.view(), pv = pos.view();
    switch (op.cls) {
      case OpClass::kLogical: in = {cond.view(), b2.view()}; break;
      case OpClass::kSelect: in = {cond.view(), xv, yv}; break;
      default:
        if (op.kind == OpKind::kLog || op.kind == OpKind::kSqrt || op.kind == OpKind::kRsqrt) in = {pv};
        else if (op.kind == OpKind::kPow) in = {pv, yv};
        else if (op.kind == OpKind::kBias) in = {TensorView{DType::kF32, {n / C, C}, x.data()}, bias.view()};
        else in = {xv, yv};
    }
    in.resize(op.arity);
    if (op.cls == OpClass::kCompare || op.cls == OpClass::kLogical) o_view = bout.view();
    if (op.kind == OpKind::kBias) o_view.shape = {n / C, C};
    if (op.kind == OpKind::kDropout) attrs.training = true, attrs.alpha = 0.1f, attrs.seed = 7;
    OpRow row;
    row.name = op.name;
    Status st = RunOp(op.kind, in, o_view, attrs, ctx);
    if (!st.ok()) {
      std::fprintf(stderr, "graphfuse demo: %s\n", st.ToString().c_str());
      return kExitBadInput;
    }
    const CheckReport rep = CheckAgainstReference(op.kind, in, o_view, attrs);
    row.ok = rep.ok;
    row.max_ulp = rep.max_contract_ulp;
    row.failure = rep.first_failure;
    all_ok &= rep.ok;
    auto t = MeasureMedian([&] { (void)RunOp(op.kind, in, o_view, attrs, ctx); }, o.repeats);
    double bytes = static_cast<double>(o_view.numel()) * DTypeSize(o_view.dtype);
    for (const TensorView& v : in) bytes += static_cast<double>(v.numel()) * DTypeSize(v.dtype);
    row.us = t.median_s * 1e6;
    row.gbps = bytes / t.median_s / 1e9;
    std::printf("%-12s %10.2f %9.1f %7.0f%% %9.2f  %s\n", row.name.c_str(), row.us, row.gbps,
                100 * row.gbps / triad_gbps, row.max_ulp, row.ok ? "ok" : row.failure.c_str());
    std::fflush(stdout);
    rows.push_back(row);
  }
  std::printf("\n%zu ops, %s against the float64 reference (contract: ops.def ulp column)\n", rows.size(),
              all_ok ? "all agree" : "SOME DIFFER");

  if (!o.json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("demo").Key("elements").Int(n).Key("threads").Int(pool.num_threads());
    j.Key("simd").Str(cpu::SimdTargetName());
    j.Key("gbps").BeginObject().Key("triad").Num(triad_gbps).EndObject();
    j.Key("dispatch_us").Num(dispatch.median_s * 1e6);
    j.Key("ops").BeginArray();
    for (const OpRow& r : rows) {
      j.BeginObject().Key("name").Str(r.name).Key("latency_us").Num(r.us).Key("gbps").Num(r.gbps);
      j.Key("max_ulp_err").Num(r.max_ulp).Key("ok").Bool(r.ok);
      if (!r.ok) j.Key("error").Str(r.failure);
      j.EndObject();
    }
    j.EndArray().EndObject();
    if (!j.WriteFile(o.json)) {
      std::fprintf(stderr, "graphfuse demo: cannot write --json file '%s'\n", o.json.c_str());
      return kExitBadInput;
    }
  }
  return all_ok ? kExitOk : kExitMismatch;
}

}  // namespace graphfuse::cli

// `graphfuse bench MODEL.onnx --generate PROMPT:NEW`: greedy generation through the embedding
// API, as a serving loop runs an exported decoder with a KV cache: one call for a random prompt
// (past 0), then one call per new token, each call's present.* fed back as the next past.*.
// Every call has a new sequence length; the report says what that costs (planning) beside the
// time per token, and what the process holds (RSS). Later generations also run with the KV
// cache kept in place (present written into past's buffer), beside the copying loop.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "graphfuse/model.h"
#include "core/json.h"

namespace graphfuse::cli {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const Status& s) { return FailUsage("bench", s); }

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Resident and peak resident memory of this process, in MiB.
double RssMb() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}
double PeakRssMb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024;
}

// Where a decoder's inputs are: token ids, the optional mask and positions, and each past
// tensor with the output that becomes it next call and the dim that grows.
struct DecoderIo {
  int ids = -1, mask = -1, positions = -1;
  int logits = 0;
  struct Cache {
    int input, output, grow_dim;
  };
  std::vector<Cache> caches;
};

// "past_key_values.3.key" and "present.3.key" name one cache: the names after their prefixes agree.
std::string CacheSuffix(const std::string& name, const char* prefix) {
  const std::string p(prefix);
  if (name.rfind(p, 0) != 0) return "";
  std::string rest = name.substr(p.size());
  while (!rest.empty() && (rest[0] == '.' || rest[0] == '_')) rest.erase(0, 1);
  return rest;
}

Result<DecoderIo> FindDecoderIo(const CompiledModel& m, const std::string& path) {
  DecoderIo io;
  const auto& in = m.inputs();
  const auto& out = m.outputs();
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorInfo& t = in[i];
    if (t.name == "input_ids") io.ids = static_cast<int>(i);
    else if (t.name == "attention_mask") io.mask = static_cast<int>(i);
    else if (t.name == "position_ids") io.positions = static_cast<int>(i);
    else {
      std::string suffix = CacheSuffix(t.name, "past_key_values");
      if (suffix.empty()) suffix = CacheSuffix(t.name, "past");
      if (suffix.empty())
        return InvalidArgument(path, ": input '", t.name, "' is neither input_ids, attention_mask, position_ids nor a ",
                               "past_key_values.* cache: --generate runs decoders exported with a KV cache");
      int output = -1;
      for (size_t o = 0; o < out.size(); ++o)
        if (CacheSuffix(out[o].name, "present") == suffix) output = static_cast<int>(o);
      if (output < 0) return InvalidArgument(path, ": no present.", suffix, " output for the cache input '", t.name, "'");
      // The growing dim: the symbolic one that is not the batch (dim 0).
      int grow = -1;
      for (size_t d = 1; d < t.shape.size(); ++d)
        if (t.shape[d] < 0) grow = static_cast<int>(d);
      if (grow < 0 || t.dtype != DType::kF32)
        return InvalidArgument(path, ": cache input '", t.name, "' is ", DTypeName(t.dtype),
                               " with no symbolic length dim: --generate needs f32 caches [batch, ..., past, ...]");
      io.caches.push_back({static_cast<int>(i), output, grow});
    }
  }
  if (io.ids < 0) return InvalidArgument(path, ": no input named input_ids: --generate runs decoders");
  if (io.caches.empty())
    return InvalidArgument(path, ": no past_key_values.* inputs: --generate needs a decoder exported with a KV cache "
                           "(without one every token would recompute the whole sequence)");
  if (in[static_cast<size_t>(io.ids)].dtype != DType::kI64) return InvalidArgument(path, ": input_ids must be int64");
  return io;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}


// One greedy generation's figures: per call its time, its planning time and RSS after it.
struct GenerationRun {
  std::vector<double> ms, planning_ms, rss_mb;
  std::vector<int64_t> tokens;
};

// One greedy generation. Copying (in_place false): each call returns new presents, fed back
// as the next pasts, so a decode step copies its whole cache. In place: each cache is one
// buffer with room for the whole generation; past is a view of its first rows and present a
// view of the same buffer one step longer, so a step writes only its new rows (where the plan
// takes them in place: Plan::takes_strided).
Result<GenerationRun> Generate(CompiledModel& m, const DecoderIo& io, int64_t prompt, int64_t fresh, int64_t vocab,
                               bool in_place, bool print_calls) {
  const auto& in = m.inputs();
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  GenerationRun run;
  std::vector<Tensor> feed(in.size()), caches(io.caches.size());
  std::vector<std::vector<int64_t>> strides(io.caches.size());
  std::vector<int64_t> ids(static_cast<size_t>(prompt));
  std::mt19937_64 prompt_rng(99);
  for (int64_t& id : ids) id = token(prompt_rng);
  int64_t total = 0;
  // Empty caches first: each cache input's shape with its growing dim 0 (in place: the
  // generation's length) and its other symbolic dims 1 (batch 1).
  for (size_t c = 0; c < io.caches.size(); ++c) {
    Shape s = in[static_cast<size_t>(io.caches[c].input)].shape;
    for (int64_t& d : s) d = d < 0 ? 1 : d;
    s[static_cast<size_t>(io.caches[c].grow_dim)] = in_place ? prompt + fresh : 0;
    GF_ASSIGN_OR_RETURN(caches[c], Tensor::Empty(DType::kF32, s));
    strides[c] = ContiguousStrides(s);
  }
  // A view of the first `rows` rows of cache c.
  auto rows_of = [&](size_t c, int64_t rows) {
    Shape s = caches[c].shape();
    s[static_cast<size_t>(io.caches[c].grow_dim)] = rows;
    return TensorView(DType::kF32, s, caches[c].data(), strides[c]);
  };
  for (int64_t step = 0; step < fresh; ++step) {
    const auto n = static_cast<int64_t>(ids.size());
    const int64_t past = total;
    total += n;
    auto ids_t = Tensor::Empty(DType::kI64, {1, n}).value();
    std::copy(ids.begin(), ids.end(), ids_t.data_as<int64_t>());
    feed[static_cast<size_t>(io.ids)] = std::move(ids_t);
    if (io.mask >= 0) {
      auto mask = Tensor::Empty(in[static_cast<size_t>(io.mask)].dtype, {1, total}).value();
      for (int64_t i = 0; i < total; ++i) mask.SetFromDouble(i, 1);
      feed[static_cast<size_t>(io.mask)] = std::move(mask);
    }
    if (io.positions >= 0) {
      auto pos = Tensor::Empty(DType::kI64, {1, n}).value();
      for (int64_t i = 0; i < n; ++i) pos.data_as<int64_t>()[i] = total - n + i;
      feed[static_cast<size_t>(io.positions)] = std::move(pos);
    }
    std::vector<TensorView> views(in.size());
    for (size_t i = 0; i < in.size(); ++i) views[i] = feed[i].view();
    for (size_t c = 0; c < io.caches.size(); ++c)
      views[static_cast<size_t>(io.caches[c].input)] = in_place ? rows_of(c, past) : caches[c].view();
    const double planned_before = m.cache_stats().planning_ms;
    const auto t = Clock::now();
    std::vector<Tensor> out;
    if (in_place) {
      GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> plan, m.PlanFor(views));
      std::vector<TensorView> out_views(plan->outputs().size());
      out.resize(plan->outputs().size());
      for (size_t o = 0; o < out.size(); ++o) {
        GF_ASSIGN_OR_RETURN(out[o], Tensor::Empty(plan->outputs()[o].dtype, plan->outputs()[o].shape));
        out_views[o] = out[o].view();
      }
      for (size_t c = 0; c < io.caches.size(); ++c) {
        out[static_cast<size_t>(io.caches[c].output)] = Tensor();
        out_views[static_cast<size_t>(io.caches[c].output)] = rows_of(c, total);
      }
      GF_RETURN_IF_ERROR(m.Run(views, out_views).WithContext(StrCat("--generate step ", step)));
    } else {
      auto ran = m.Run(views);
      if (!ran.ok()) return ran.status().WithContext(StrCat("--generate step ", step));
      out = std::move(*ran);
    }
    run.ms.push_back(MsSince(t));
    run.planning_ms.push_back(m.cache_stats().planning_ms - planned_before);
    run.rss_mb.push_back(RssMb());
    if (print_calls) {
      const PlanningTime& pt = m.plan()->planning_time();
      std::printf("    call %lld: %.2f ms; planning %.2f ms (import %.2f, passes %.2f, compile %.2f, of which GEMM "
                  "tuning %.2f)%s; RSS %.1f MiB\n",
                  static_cast<long long>(step), run.ms.back(), run.planning_ms.back(), pt.import_ms, pt.passes_ms,
                  pt.compile_ms, pt.gemm_tuning_ms, m.plan()->from_template() ? ", from the template" : "", run.rss_mb.back());
    }
    const Tensor& logits = out[static_cast<size_t>(io.logits)];
    const int64_t v = logits.shape().back(), last = logits.numel() / v - 1;
    const float* row = logits.data_as<float>() + last * v;
    const int64_t next = std::max_element(row, row + v) - row;
    run.tokens.push_back(next);
    ids.assign(1, next);
    if (!in_place)
      for (size_t c = 0; c < io.caches.size(); ++c) caches[c] = std::move(out[static_cast<size_t>(io.caches[c].output)]);
  }
  return run;
}

}  // namespace

int BenchGenerate(const std::string& path, const std::string& spec, int threads, int repeats, bool bf16_weights,
                  const std::string& json) {
  const size_t colon = spec.find(':');
  int64_t prompt = 0, fresh = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("");
    prompt = std::stoll(spec.substr(0, colon));
    fresh = std::stoll(spec.substr(colon + 1));
  } catch (const std::exception&) {
    return Fail(InvalidArgument("--generate takes PROMPT:NEW (tokens of the prompt, tokens to generate), e.g. 128:64; got '",
                                spec, "'"));
  }
  if (prompt < 1 || prompt > 65536 || fresh < 1 || fresh > 65536)
    return Fail(InvalidArgument("--generate ", spec, ": the prompt and the new tokens must each be 1..65536"));

  const double rss_before = RssMb();
  const auto t = Clock::now();
  auto model = Model::FromOnnxFile(path);
  if (!model.ok()) return Fail(model.status());
  // The generation loop runs on the CPU target (f32, or with its GEMM weights in bf16).
  TargetOptions options;
  options.cpu.threads = threads;
  options.cpu.bf16_weights = bf16_weights;
  auto target = MakeTarget("cpu", options);
  if (!target.ok()) return Fail(target.status());
  auto compiled = CompiledModel::Compile(std::move(*model), std::move(*target));
  if (!compiled.ok()) return Fail(compiled.status());
  const double load_ms = MsSince(t), load_rss = RssMb() - rss_before;
  CompiledModel& m = **compiled;
  auto io = FindDecoderIo(m, path);
  if (!io.ok()) return Fail(io.status());
  int64_t vocab = -1;
  if (const TensorInfo& lo = m.outputs()[static_cast<size_t>(io->logits)]; !lo.shape.empty()) vocab = lo.shape.back();
  if (vocab <= 0) vocab = 32000;  // ids drawn below it: a model declares its vocabulary in the logits
  const int shown_threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("graphfuse bench --generate %s on %s: %d thread(s), %s; loaded in %.0f ms, RSS +%.0f MiB\n",
              spec.c_str(), path.c_str(), shown_threads, bf16_weights ? "GEMM weights in bf16" : "f32", load_ms,
              load_rss);
  std::fflush(stdout);

  // The first generation copies, and meets every length for the first time; later ones take
  // turns copying and in place.
  std::vector<GenerationRun> runs, in_place_runs;
  bool takes_in_place = false;
  for (int r = 0; r < repeats; ++r) {
    auto copied = Generate(m, *io, prompt, fresh, vocab, false, std::getenv("GRAPHFUSE_BENCH_CALLS") && r == 0);
    if (!copied.ok()) return Fail(copied.status());
    runs.push_back(std::move(*copied));
    if (r == 0) continue;
    auto kept = Generate(m, *io, prompt, fresh, vocab, true, false);
    if (!kept.ok()) return Fail(kept.status());
    in_place_runs.push_back(std::move(*kept));
    takes_in_place = true;
    for (const DecoderIo::Cache& c : io->caches)
      takes_in_place &= m.plan()->takes_strided(false, static_cast<size_t>(c.input)) &&
                        m.plan()->takes_strided(true, static_cast<size_t>(c.output));
  }

  // The first generation meets every length for the first time; later ones (a server's next
  // request of the same lengths) find their plans made, unless the plan cache dropped them.
  struct Summary {
    double prefill = 0, mean = 0, last = 0, total = 0, planning = 0, max_planning_after_first_decode = 0,
           median_planning_after_first_decode = 0;
  };
  auto summarize = [](const GenerationRun& r) {
    Summary s;
    s.prefill = r.ms[0];
    for (size_t i = 1; i < r.ms.size(); ++i) s.mean += r.ms[i];
    s.total = s.mean + r.ms[0];
    s.mean = r.ms.size() > 1 ? s.mean / static_cast<double>(r.ms.size() - 1) : 0;
    s.last = r.ms.back();
    for (size_t i = 0; i < r.planning_ms.size(); ++i) {
      s.planning += r.planning_ms[i];
      if (i >= 2) s.max_planning_after_first_decode = std::max(s.max_planning_after_first_decode, r.planning_ms[i]);
    }
    if (r.planning_ms.size() > 2)
      s.median_planning_after_first_decode = Median({r.planning_ms.begin() + 2, r.planning_ms.end()});
    return s;
  };
  const Summary first_sum = summarize(runs[0]);
  std::vector<Summary> later, in_place_sums;  // generations 2.., copying; the same, in place
  for (size_t r = 1; r < runs.size(); ++r) later.push_back(summarize(runs[r]));
  for (const GenerationRun& r : in_place_runs) in_place_sums.push_back(summarize(r));
  auto median_of = [](const std::vector<Summary>& v, double Summary::*field) {
    std::vector<double> x;
    for (const Summary& e : v) x.push_back(e.*field);
    return Median(x);
  };
  bool same = true;
  for (const GenerationRun& r : runs) same &= r.tokens == runs[0].tokens;
  for (const GenerationRun& r : in_place_runs) same &= r.tokens == runs[0].tokens;
  const PlanCacheStats s = m.cache_stats();
  std::printf("  %-34s %10s %12s %10s %10s %12s %14s\n", "", "prefill ms", "per token ms", "last ms", "total ms",
              "planning ms", "max planning");
  auto row = [&](const std::string& what, const std::vector<Summary>& v) {
    std::printf("  %-34s %10.2f %12.2f %10.2f %10.1f %12.1f %14.2f\n", what.c_str(), median_of(v, &Summary::prefill),
                median_of(v, &Summary::mean), median_of(v, &Summary::last), median_of(v, &Summary::total),
                median_of(v, &Summary::planning), median_of(v, &Summary::max_planning_after_first_decode));
  };
  row("generation 1 (every length new)", {first_sum});
  if (!later.empty()) row(StrCat("generations 2..", runs.size(), " (medians)"), later);
  if (!in_place_sums.empty()) {
    row(StrCat("the same, KV cache kept in place", takes_in_place ? "" : "*"), in_place_sums);
    if (!takes_in_place)
      std::printf("  * this model's plans do not take its caches in place: strided views are copied around each "
                  "call\n");
  }
  std::printf("  (%lld prompt tokens, %lld decode calls; max planning: the most one call after the first decode "
              "spent planning)\n", static_cast<long long>(prompt), static_cast<long long>(fresh - 1));
  const GenerationRun& first = runs[0];
  std::printf("  planning per call after the first decode, generation 1: median %.2f ms, max %.2f ms\n",
              first_sum.median_planning_after_first_decode, first_sum.max_planning_after_first_decode);
  const double rss_first = first.rss_mb.front(), rss_decode = first.rss_mb[std::min<size_t>(1, first.rss_mb.size() - 1)];
  std::printf("  RSS after the first call %.0f MiB, after the first decode %.0f MiB, after generation 1's %zu lengths "
              "%.0f MiB (%.2fx the first call's)\n", rss_first, rss_decode, first.rss_mb.size(), first.rss_mb.back(),
              first.rss_mb.back() / rss_first);
  std::printf("  %lld plans made (%lld from %lld shape-class templates, %lld ahead of their calls), %.0f ms in all; "
              "prepared weights shared by every plan: %.1f MiB in %lld entries\n",
              static_cast<long long>(s.plans_made), static_cast<long long>(s.plans_from_template),
              static_cast<long long>(s.shape_classes), static_cast<long long>(s.plans_ahead), s.planning_ms,
              static_cast<double>(s.prepared_bytes) / (1 << 20),
              static_cast<long long>(s.prepared_entries));

  std::printf("  RSS %.0f MiB, peak %.0f MiB; %s\n", RssMb(), PeakRssMb(),
              same ? "the same tokens in every generation" : "THE TOKENS DIFFER between generations");
  if (!json.empty()) {
    Json j;
    j.BeginObject().Key("model").Str(path).Key("prompt").Num(static_cast<double>(prompt)).Key("new").Num(static_cast<double>(fresh));
    j.Key("threads").Num(shown_threads).Key("dtype").Str(bf16_weights ? "bf16" : "f32");
    j.Key("repeats").Num(repeats).Key("load_ms").Num(load_ms);
    const Summary& f = first_sum;
    j.Key("first").BeginObject().Key("prefill_ms").Num(f.prefill).Key("per_token_ms").Num(f.mean);
    j.Key("last_token_ms").Num(f.last).Key("total_ms").Num(f.total).Key("planning_ms").Num(f.planning);
    j.Key("max_planning_ms_after_first_decode").Num(f.max_planning_after_first_decode);
    j.Key("median_planning_ms_after_first_decode").Num(f.median_planning_after_first_decode);
    j.Key("rss_after_first_call_mb").Num(rss_first).Key("rss_after_first_decode_mb").Num(rss_decode);
    j.Key("rss_after_generation_mb").Num(first.rss_mb.back()).EndObject();
    if (!later.empty()) {
      j.Key("later").BeginObject().Key("prefill_ms").Num(median_of(later, &Summary::prefill));
      j.Key("per_token_ms").Num(median_of(later, &Summary::mean)).Key("total_ms").Num(median_of(later, &Summary::total));
      j.Key("planning_ms").Num(median_of(later, &Summary::planning)).EndObject();
      j.Key("in_place").BeginObject().Key("taken").Bool(takes_in_place);
      j.Key("prefill_ms").Num(median_of(in_place_sums, &Summary::prefill));
      j.Key("per_token_ms").Num(median_of(in_place_sums, &Summary::mean));
      j.Key("total_ms").Num(median_of(in_place_sums, &Summary::total)).EndObject();
    }
    j.Key("plans_from_template").Num(static_cast<double>(s.plans_from_template));
    j.Key("plans_ahead").Num(static_cast<double>(s.plans_ahead));
    j.Key("plans_made").Num(static_cast<double>(s.plans_made)).Key("planning_ms").Num(s.planning_ms);
    j.Key("prepared_bytes").Num(static_cast<double>(s.prepared_bytes));
    j.Key("rss_mb").Num(RssMb()).Key("peak_rss_mb").Num(PeakRssMb());
    j.Key("tokens").BeginArray();
    for (int64_t tok : runs[0].tokens) j.Num(static_cast<double>(tok));
    j.EndArray().EndObject();
    if (!j.WriteFile(json)) return Fail(InvalidArgument("cannot write --json file '", json, "'"));
  }
  return same ? kExitOk : kExitMismatch;
}

}  // namespace graphfuse::cli

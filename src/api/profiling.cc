// Chrome-trace JSON of a model's runs (include/graphfuse/profiling.h).
//
// Events are kept as they come (complete "X" events, microseconds from the recorder's start);
// what a kernel event says about its node (op, fused members, bytes, engine) is read from the
// plan when its run is added, so a trace outlives the plans it describes.
#include "graphfuse/profiling.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/json.h"
#include "graphfuse/fusion.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

namespace {

struct Event {
  std::string name, category;
  double ts_us = 0, dur_us = 0;
  int tid = 0;
  bool device = false;
  // Args, written in order: strings, numbers, booleans, and one list of strings (fused members).
  std::vector<std::pair<std::string, std::string>> str_args;
  std::vector<std::pair<std::string, double>> num_args;
  std::vector<std::pair<std::string, bool>> bool_args;
  std::vector<std::string> members;
};

int64_t BytesOf(const Node& n) {
  int64_t bytes = 0;
  for (const Value* v : n.inputs())
    if (v) bytes += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  for (const Value* v : n.outputs()) bytes += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  return bytes;
}

}  // namespace

struct TraceRecorder::Impl {
  mutable std::mutex mu;
  int64_t start_ns = SteadyClockNs();
  std::vector<Event> events;
  std::map<std::thread::id, int> threads;  // small ids, in order of first sight

  int ThreadId() {
    auto [it, added] = threads.emplace(std::this_thread::get_id(), static_cast<int>(threads.size()) + 1);
    return it->second;
  }
  double Us(int64_t ns) const { return static_cast<double>(ns - start_ns) * 1e-3; }
};

TraceRecorder::TraceRecorder() : impl_(std::make_unique<Impl>()) {}
TraceRecorder::~TraceRecorder() = default;

int64_t TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int64_t>(impl_->events.size());
}

int64_t TraceRecorder::start_ns() const { return impl_->start_ns; }

void TraceRecorder::Clear() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->events.clear();
}

void TraceRecorder::Record(const TracedRun& r) {
  static const std::vector<StepTiming> kNoSteps;
  const std::vector<StepTiming>& steps = r.steps ? *r.steps : kNoSteps;
  const std::string& target = r.target;
  const int64_t start_ns = r.start_ns, run_start_ns = r.run_start_ns, end_ns = r.end_ns;
  const bool planned = r.planned;
  // What each node says about itself: its fused members (the report) and its engine.
  std::unordered_map<std::string_view, const FusedGroupInfo*> group_of;
  if (r.report)
    for (const FusedGroupInfo& g : r.report->groups) group_of.emplace(g.name, &g);
  std::unordered_map<std::string_view, const KernelChoice*> choice_of;
  if (r.kernel_choices)
    for (const KernelChoice& c : *r.kernel_choices) choice_of.emplace(c.node, &c);
  std::unordered_map<std::string_view, const Node*> node_of;
  if (r.graph && std::any_of(steps.begin(), steps.end(), [](const StepTiming& s) { return s.node == nullptr; }))
    for (const auto& n : r.graph->nodes()) node_of.emplace(n->name(), n.get());

  std::vector<Event> add;
  add.reserve(steps.size() + 2);
  std::lock_guard<std::mutex> lock(impl_->mu);
  const int tid = impl_->ThreadId();
  // A complete event on this thread from `from` to `to` (steady clock, ns).
  auto span = [&](const char* name, const char* category, int64_t from, int64_t to) {
    Event e;
    e.name = name;
    e.category = category;
    e.ts_us = impl_->Us(from);
    e.dur_us = static_cast<double>(to - from) * 1e-3;
    e.tid = tid;
    e.str_args = {{"signature", r.signature}};
    return e;
  };
  Event run = span("run", "run", start_ns, end_ns);
  run.str_args.emplace_back("target", target);
  run.bool_args = {{"ok", r.ok}, {"planned", planned}, {"from_template", r.from_template}};
  run.num_args = {{"planning_ms", planned ? static_cast<double>(run_start_ns - start_ns) * 1e-6 : 0.0},
                  {"kernels", static_cast<double>(r.kernels)}};
  add.push_back(std::move(run));
  if (planned) add.push_back(span("plan", "planning", start_ns, run_start_ns));
  for (const StepTiming& s : steps) {
    const Node* n = s.node;
    if (!n) {
      auto it = node_of.find(s.label);
      n = it == node_of.end() ? nullptr : it->second;
    }
    Event e;
    e.name = s.label;
    e.category = n ? n->op() : "step";
    e.ts_us = impl_->Us(s.start_ns);
    e.dur_us = static_cast<double>(s.duration_ns) * 1e-3;
    e.tid = tid;
    e.device = s.device;
    if (n) {
      e.str_args.emplace_back("op", n->op());
      e.num_args.emplace_back("bytes", static_cast<double>(BytesOf(*n)));
      if (auto g = group_of.find(n->name()); g != group_of.end()) {
        e.str_args.emplace_back("kernel_name", g->second->kernel_name);
        e.str_args.emplace_back("fusion", g->second->kind);
        e.members = g->second->nodes;
      }
    }
    auto c = choice_of.find(s.label);
    e.str_args.emplace_back("engine", c != choice_of.end() ? c->second->how : StrCat(target, " kernel"));
    e.str_args.emplace_back("clock", s.device ? "device" : "host");
    e.bool_args.emplace_back("fused", n && op::IsFused(n->op_id()));
    add.push_back(std::move(e));
  }
  for (Event& e : add) impl_->events.push_back(std::move(e));
}

std::string TraceRecorder::ToJson() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Json j;
  j.BeginObject().Key("traceEvents").BeginArray();
  // Metadata: the process and its threads by name (device-timed kernels on a track of their own).
  auto meta = [&](const char* what, int tid, const std::string& name) {
    j.BeginObject().Key("name").Str(what).Key("ph").Str("M").Key("pid").Int(1);
    if (tid >= 0) j.Key("tid").Int(tid);
    j.Key("args").BeginObject().Key("name").Str(name).EndObject().EndObject();
  };
  meta("process_name", -1, "graphfuse");
  for (const auto& [id, tid] : impl_->threads) meta("thread_name", tid, StrCat("host thread ", tid));
  bool any_device = false;
  for (const Event& e : impl_->events) any_device |= e.device;
  if (any_device) meta("thread_name", 0, "device");
  for (const Event& e : impl_->events) {
    j.BeginObject();
    j.Key("name").Str(e.name).Key("cat").Str(e.category).Key("ph").Str("X");
    j.Key("ts").Num(e.ts_us).Key("dur").Num(e.dur_us).Key("pid").Int(1).Key("tid").Int(e.device ? 0 : e.tid);
    j.Key("args").BeginObject();
    for (const auto& [k, v] : e.str_args) j.Key(k).Str(v);
    for (const auto& [k, v] : e.num_args) j.Key(k).Num(v);
    for (const auto& [k, v] : e.bool_args) j.Key(k).Bool(v);
    if (!e.members.empty()) {
      j.Key("members").BeginArray();
      for (const std::string& m : e.members) j.Str(m);
      j.EndArray();
    }
    j.EndObject().EndObject();
  }
  j.EndArray();
  j.Key("displayTimeUnit").Str("ms");
  j.Key("otherData").BeginObject().Key("producer").Str("graphfuse").EndObject();
  j.EndObject();
  return j.str();
}

Status TraceRecorder::WriteFile(const std::string& path) const {
  const std::string text = ToJson();
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return InvalidArgument("cannot write the trace to '", path, "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fputc('\n', f) != EOF;
  if (std::fclose(f) != 0 || !ok) return InvalidArgument("cannot write the trace to '", path, "' (disk full?)");
  return Status::Ok();
}

}  // namespace graphfuse

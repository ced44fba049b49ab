// Profiles users can open: the runs of a CompiledModel as Chrome-trace JSON (the Trace Event
// Format that chrome://tracing, Perfetto and onnxruntime's profiler use).
//
//   graphfuse::TraceRecorder trace;
//   (*compiled)->Run(inputs, outputs, &trace);      // every run given it is recorded
//   trace.WriteFile("profile.json");                 // open in https://ui.perfetto.dev
//
// Each call is a "run" event (its plan's signature and planning time), with a "plan" event where
// the call made its plan;
// each kernel inside it an event named by its node, with args: op, the fused members, the bytes
// its operands and results take, and the engine that runs it (the CPU: each GEMM's engine, as
// Plan::kernel_choices says). On the CUDA target kernels carry device times (CUDA events around
// each step, replayed after the run); an emulated plan's run is one host-timed event.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/status.h"
#include "graphfuse/target.h"

namespace graphfuse {

class Graph;
struct FusionReport;

// A RunProfiler that keeps the steps it is told, in order.
class StepLog final : public RunProfiler {
 public:
  void OnStep(const StepTiming& step) override { steps.push_back(step); }
  std::vector<StepTiming> steps;
};

// One call as a trace records it. CompiledModel::Run fills it from its plan; a program that
// runs a graph its own way (graphfuse run) fills it from what it ran.
struct TracedRun {
  const Graph* graph = nullptr;                            // the planned graph its steps name
  const FusionReport* report = nullptr;                    // fused members, by fused node
  const std::vector<KernelChoice>* kernel_choices = nullptr;  // engines, by node
  std::string signature, target;
  int64_t start_ns = 0;      // the call's start (SteadyClockNs)
  int64_t run_start_ns = 0;  // after its plan was found or made
  int64_t end_ns = 0;
  bool planned = false;      // the call made its plan (a "plan" event from start_ns to run_start_ns)
  bool from_template = false;
  int64_t kernels = 0;       // launches per run
  bool ok = true;
  const std::vector<StepTiming>* steps = nullptr;  // as the executable reported them
};

class TraceRecorder {
 public:
  TraceRecorder();
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Events recorded so far (runs, planning and kernels; not the metadata events).
  int64_t events() const;
  // The trace as one JSON object: {"traceEvents": [...], "displayTimeUnit": "ms", ...}.
  std::string ToJson() const;
  // Writes ToJson(); an error names the path.
  Status WriteFile(const std::string& path) const;
  // Drops every event; timestamps keep counting from the recorder's start.
  void Clear();
  // The steady clock (SteadyClockNs, graphfuse/target.h) its timestamps count from.
  int64_t start_ns() const;
  // Adds a call and its steps (a "run" event, a "plan" event where it planned, one event per
  // step). Thread-safe.
  void Record(const TracedRun& run);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace graphfuse

// The engine of a GEMM against constant weights chosen by timing the candidates on the machine
// that runs it (PackedGemm's kAuto with GemmTuning::measure): no rule written for one CPU.
//
// A choice belongs to a shape class: the weights' K x N and storage, the threads of the runs,
// and the rows rounded up to a power of two (1 ... 512; more rows are timed at 512). The first
// plan that meets a class packs random weights of its shape once per candidate (the own stream
// or tiles, oneDNN's packed matmul where it has a kernel), times every block of each in turns
// on a pool of the plan's threads, and keeps the faster. Choices are kept in memory for the
// process and in a file per machine (GemmTuningCache) under UserCacheDir("gemm"), so that the
// time is paid once per machine and shape class, not per model or per process.
//
// Weights under kMinTunedWeights elements are not timed: there the rule (PackedGemm::AutoEngine)
// chooses, as it does for every GEMM when tuning is off (`--cpu-gemm rule`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cpu/kernels/packed_gemm.h"

namespace graphfuse::kernels {

// Weights (K x N elements) from which the choice is timed: 512 x 512, 1 MiB of f32.
inline constexpr int64_t kMinTunedWeights = int64_t{1} << 18;
// The most rows a choice is timed at.
inline constexpr int64_t kMaxTunedRows = 512;
// Timings closer than this (relative) are taken as equal, the shared machine's noise: the rule's
// engine stays.
inline constexpr double kGemmNoise = 0.05;
// The rows whose timing picks the own form for every row count of a model whose rows vary.
inline constexpr int64_t kOneFormRows = 32;

// The rows a choice for m rows is timed at: m rounded up to a power of two, at most kMaxTunedRows.
int64_t TunedRows(int64_t m);

// The candidates timed: the own loops (with bf16 weights on a CPU with AVX512-BF16, as bf16 dot
// products), the own loops with bf16 weights widened to f32 as they load (only where the first
// are dot products: PackedGemmOptions::bf16_dot false), and oneDNN's packed matmul.
struct GemmChoice {
  GemmEngine engine = GemmEngine::kOwn;  // kOwn or kOneDnn
  bool bf16_dot = true;                  // kOwn: PackedGemmOptions::bf16_dot
  bool measured = false;                 // timed (now or earlier: from_cache); else the rule
  bool from_cache = false;               // the timing was made before (this process, or the file)
  int64_t rows = 0;                      // the rows timed at
  int threads = 0;                       // the threads timed with
  // Median time of one GEMM per candidate; 0: not a candidate here, or no kernel for it.
  double own_ms = 0, widen_ms = 0, onednn_ms = 0;
  std::string why;                       // the rule's reason, or how the timings compare
};

// The engine for an m x k x n GEMM with these weights (PackedGemm::Create's kAuto): the fastest
// candidate, unless the rule's is within kGemmNoise of it. `one_form` (PackedGemmOptions::
// one_form): f32 weights take the own loops, untimed; bf16 weights take the own form (dot
// products or widened) timed faster at kOneFormRows rows for every row count, so that one
// packed copy of the own panels serves them all.
GemmChoice ChooseGemmEngine(int64_t m, int64_t k, int64_t n, GemmWeightStorage storage, bool one_form,
                            const GemmTuning& tuning);

// The process's tuning so far: shape classes timed, and the time spent timing them.
struct GemmTuningTotals {
  int64_t timed = 0;
  double ms = 0;
};
GemmTuningTotals GemmTuningSoFar();

// What a cached choice is valid for: the CPU (brand, family / model / stepping, the ISA the
// kernels use), the SIMD target the own loops were built for, oneDNN's version and the own
// kernels' revision. Another machine, or another build of the libraries, has another file.
std::string GemmMachineKey();

// One machine's choices on disk: `dir`/gemm-<hash of the machine key>.tsv, a header naming the
// machine, then a line per shape class. Bounded: at most kMaxEntries lines (the oldest dropped)
// and kMaxFiles machine files in `dir` (the least recently written removed). A file that does
// not parse, or names another machine, is ignored and rewritten: it is only a cache.
class GemmTuningCache {
 public:
  static constexpr size_t kMaxEntries = 512;
  static constexpr size_t kMaxFiles = 8;
  // One shape class's timings (GemmChoice's; 0: not a candidate, or no kernel).
  struct Entry {
    int64_t rows = 0, k = 0, n = 0;
    GemmWeightStorage storage = GemmWeightStorage::kF32;
    int threads = 0;
    double own_ms = 0, widen_ms = 0, onednn_ms = 0;
  };
  GemmTuningCache(std::filesystem::path dir, std::string machine);
  const std::filesystem::path& file() const { return file_; }
  const std::vector<Entry>& entries() const { return entries_; }
  std::optional<Entry> Find(int64_t rows, int64_t k, int64_t n, GemmWeightStorage storage, int threads) const;
  // Adds e (replacing the entry of its class), merged with what other processes wrote since,
  // and rewrites the file (write then rename); false when it cannot be written.
  bool Put(const Entry& e);

 private:
  void Load();
  std::filesystem::path dir_, file_;
  std::string machine_;
  std::vector<Entry> entries_;  // oldest first
};

}  // namespace graphfuse::kernels

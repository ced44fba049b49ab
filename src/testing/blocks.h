// Transformer blocks built with the graph API, as a model author writes them: every norm,
// projection, head split, RoPE, attention step, activation and residual add is its own op,
// so the unfused plan runs what an eager framework runs and the fused plan shows what the
// passes make of it. Weights are random (deterministic per seed), scaled like trained ones
// (1/sqrt(fan_in)), and shared between graphs built from the same BlockWeights.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/graph.h"

namespace graphfuse {

enum class BlockFamily {
  kLlama,  // pre-norm RMSNorm, RoPE, causal attention, SwiGLU MLP, no biases
  kGpt2,   // pre-norm LayerNorm, biases, causal attention, GELU (tanh) MLP
  kBert,   // post-norm LayerNorm, biases, padding-mask attention, GELU (erf) MLP
};

struct BlockConfig {
  std::string preset;  // "llama7b", "llama-small", "gpt2", "bert"
  BlockFamily family = BlockFamily::kLlama;
  int64_t hidden = 4096, heads = 32, ffn = 11008, seq = 32, batch = 1;
  // Rows of a KV cache before these `seq` (LLaMA and GPT-2 blocks): with past > 0 the block
  // takes past_key / past_value [batch, heads, past, head_dim], appends its new K / V rows to
  // them (Concat on axis -2, K after RoPE) before attention, returns present_key / present_value
  // beside y, and its mask is causal over past + seq keys (query row i sees keys up to past + i),
  // its RoPE at positions past .. past + seq - 1: an exported decoder's step with a cache.
  int64_t past = 0;
  float eps = 1e-6f;
  int64_t head_dim() const { return hidden / heads; }
  int64_t WeightCount() const;  // parameters of the block
};

// The built-in presets; an error names the unknown preset and lists the known ones.
Result<BlockConfig> BlockPreset(const std::string& name);
std::vector<std::string> BlockPresetNames();

// The constants of one block, generated once (multi-threaded; `progress` gets the fraction done).
struct BlockWeights {
  std::vector<std::pair<std::string, std::shared_ptr<const Tensor>>> tensors;
  std::shared_ptr<const Tensor> Get(const std::string& name) const;
};
Result<BlockWeights> MakeBlockWeights(const BlockConfig& c, uint32_t seed, const CpuContext& ctx,
                                      const std::function<void(double)>& progress = {});

// Builds the block into an empty graph: input "x" [batch, seq, hidden], output "y" (with
// c.past > 0 also inputs past_key, past_value and outputs present_key, present_value).
Status BuildBlock(Graph& g, const BlockConfig& c, const BlockWeights& w);

// Whether a node is one of the block's weight GEMMs (MatMul / FusedGemm with constant
// weights): the demo reports the time spent outside them.
bool IsWeightGemm(const Node& n);

}  // namespace graphfuse

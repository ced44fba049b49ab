// What a model derives from its weights, made once and shared by every plan of the model,
// whatever shapes the plan serves: folded and rewritten constants (a transposed or concatenated
// weight, a norm's scale folded into a projection, a bf16 copy) and the kernels' packed forms of
// them (GEMM panels, oneDNN's blocked weights).
//
// Entries are keyed by what they derive from: the identity of each source tensor (its address:
// the store keeps every source alive, so an address is never reused for another tensor while
// the store lives) and a description of the derivation ("Transpose perm=[1,0]", "panels f32
// k=2048 n=5632"). Only derivations whose sources are all known to the store are kept: the
// model's initializers (AddRoot) and the store's own tensors. A plan's other constants (the
// sizes its shape arithmetic folded into) are made per plan as before, so the store cannot grow
// with the number of shapes a model sees.
//
// Thread-safe: plans for two shapes may be made at once; a key is made by one of them while
// the other waits for it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

struct PreparedStoreStats {
  int64_t entries = 0;  // derivations kept
  int64_t bytes = 0;    // their bytes (what the model holds beyond its initializers)
  int64_t hits = 0;     // requests that found their entry made
};

class PreparedStore {
 public:
  // A value and the bytes it holds.
  struct Made {
    std::shared_ptr<const void> value;
    int64_t bytes = 0;
  };

  // Registers a tensor derivations may be keyed on (a model's initializer); the store keeps it.
  void AddRoot(std::shared_ptr<const Tensor> t);
  // Whether `t` is a root or a tensor the store made.
  bool Knows(const Tensor* t) const;
  // The key part naming a tensor ("t0x7f...").
  static std::string Id(const void* p);
  // The key part of a float, exactly ("0x1.99999ap-4").
  static std::string Exact(float f);
  // The key of deriving by `how` from `sources` (a null source, an omitted input, as "_"); empty
  // when the store does not know a source, so that the derivation stays the caller's own.
  std::string KeyOf(std::string_view how, std::span<const Tensor* const> sources) const;

  // The entry for `key`, made by `make` on its first request (a failed make leaves no entry).
  Result<std::shared_ptr<const void>> GetOrMake(const std::string& key, const std::function<Result<Made>()>& make);
  // A derived tensor: GetOrMake, and the result becomes a tensor further derivations may key on.
  Result<std::shared_ptr<const Tensor>> GetOrMakeTensor(const std::string& key,
                                                        const std::function<Result<Tensor>()>& make);

  PreparedStoreStats stats() const;

  // Whether the plans sharing this store serve different shapes (a model with symbolic dims).
  // Kernels then take a prepared form that serves every shape over one that is faster for some
  // shapes but would be a second copy beside it (the GEMMs' own panels at every row count).
  void set_shapes_vary(bool v) { shapes_vary_ = v; }
  bool shapes_vary() const { return shapes_vary_; }

 private:
  struct Entry {
    std::mutex mu;  // held while the entry is made
    std::shared_ptr<const void> value;
  };
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> entries_;
  std::set<const Tensor*> known_;
  std::vector<std::shared_ptr<const Tensor>> roots_;
  PreparedStoreStats stats_;
  bool shapes_vary_ = false;
};

// `make`'s value under `key` in `store` (made once, shared), or made for the caller alone when
// there is no store or no key.
Result<std::shared_ptr<const void>> GetOrMakeShared(PreparedStore* store, const std::string& key,
                                                    const std::function<Result<PreparedStore::Made>()>& make);

// A tensor derived from `sources` by the derivation `how`: through `store` when there is one and
// it knows every source (made once, shared), else made here for the caller alone.
Result<std::shared_ptr<const Tensor>> DeriveTensor(PreparedStore* store, std::span<const Tensor* const> sources,
                                                   std::string_view how, const std::function<Result<Tensor>()>& make);

}  // namespace graphfuse

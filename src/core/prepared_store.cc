#include "core/prepared_store.h"

#include <cstdio>

namespace graphfuse {

void PreparedStore::AddRoot(std::shared_ptr<const Tensor> t) {
  if (!t) return;
  std::lock_guard<std::mutex> lock(mu_);
  known_.insert(t.get());
  roots_.push_back(std::move(t));
}

bool PreparedStore::Knows(const Tensor* t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.count(t) != 0;
}

std::string PreparedStore::Id(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "t%p", p);
  return buf;
}

std::string PreparedStore::Exact(float f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%a", static_cast<double>(f));
  return buf;
}

std::string PreparedStore::KeyOf(std::string_view how, std::span<const Tensor* const> sources) const {
  if (sources.empty()) return "";
  std::string key(how);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Tensor* s : sources) {
    if (s && !known_.count(s)) return "";
    key.append(" ").append(s ? Id(s) : std::string("_"));
  }
  return key;
}

Result<std::shared_ptr<const void>> PreparedStore::GetOrMake(const std::string& key,
                                                              const std::function<Result<Made>()>& make) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = entries_[key];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
  }
  std::lock_guard<std::mutex> made(e->mu);
  if (e->value) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.hits;
    return e->value;
  }
  auto m = make();
  if (!m.ok() || !m->value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end() && it->second == e) entries_.erase(it);
    if (!m.ok()) return m.status();
    return Internal("prepared store: '", key, "' made nothing");
  }
  e->value = m->value;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.entries;
  stats_.bytes += m->bytes;
  return e->value;
}

Result<std::shared_ptr<const Tensor>> PreparedStore::GetOrMakeTensor(const std::string& key,
                                                                      const std::function<Result<Tensor>()>& make) {
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const void> v, GetOrMake(key, [&]() -> Result<Made> {
                        GF_ASSIGN_OR_RETURN(Tensor t, make());
                        const auto bytes = static_cast<int64_t>(t.nbytes());
                        auto shared = std::make_shared<const Tensor>(std::move(t));
                        std::lock_guard<std::mutex> lock(mu_);
                        known_.insert(shared.get());
                        return Made{shared, bytes};
                      }));
  return std::static_pointer_cast<const Tensor>(v);
}

PreparedStoreStats PreparedStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<std::shared_ptr<const void>> GetOrMakeShared(PreparedStore* store, const std::string& key,
                                                    const std::function<Result<PreparedStore::Made>()>& make) {
  if (store && !key.empty()) return store->GetOrMake(key, make);
  GF_ASSIGN_OR_RETURN(PreparedStore::Made m, make());
  return std::move(m.value);
}

Result<std::shared_ptr<const Tensor>> DeriveTensor(PreparedStore* store, std::span<const Tensor* const> sources,
                                                   std::string_view how, const std::function<Result<Tensor>()>& make) {
  const std::string key = store ? store->KeyOf(how, sources) : "";
  if (!key.empty()) return store->GetOrMakeTensor(key, make);
  GF_ASSIGN_OR_RETURN(Tensor t, make());
  return std::make_shared<const Tensor>(std::move(t));
}

}  // namespace graphfuse

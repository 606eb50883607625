// The table behind apexlite._C.CastCache (o1_cast_cache.cpp binds it to Python; o1_cast_table.cpp
// holds the rules, those of apexlite/amp/o1/cache.py's NOTEs [what the cache takes], [cast cache
// validity] and [cast cache lifetime]).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <unordered_map>
#include <utility>
#include <vector>

namespace apexlite {
namespace o1 {

using WeakTensorPtr = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStoragePtr = c10::weak_intrusive_ptr<c10::StorageImpl>;

struct CacheKey {
  const c10::TensorImpl* impl;
  at::ScalarType dtype;
  bool operator==(const CacheKey& other) const { return impl == other.impl && dtype == other.dtype; }
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& key) const {
    return std::hash<const void*>()(key.impl) ^ (static_cast<size_t>(key.dtype) * 0x9E3779B97F4A7C15ull);
  }
};

// What a weight was when it was cast, read before the cast. A weak pointer keeps the object (not the
// data) of a TensorImpl or StorageImpl allocated, so no other one can take its address while an entry
// refers to it: equal pointers mean the same tensor and the same storage.
struct Stamps {
  WeakStoragePtr storage;
  int64_t version;
  int64_t offset;
  at::DimVector sizes;
  at::DimVector strides;
  at::ScalarType dtype;
  at::Device device;

  explicit Stamps(const at::Tensor& tensor);
  bool match(const at::Tensor& tensor) const;  // a few integer compares: the hit path runs it per call
};

struct CacheEntry {
  WeakTensorPtr source;     // pins the key's address; never keeps the weight alive
  Stamps stamps;
  at::Tensor cast;          // held: registered weights
  WeakTensorPtr weak_cast;  // any other weight: served while something else holds the cast

  at::Tensor live_cast() const;  // the cast, or an undefined tensor once a weakly held one died
  bool live() const;
};

// NOTE [no tensor dies inside the map]: dropping the last reference to a cached tensor can run Python
// code (its Python object is freed, weakref callbacks run), and that code may cast through this cache
// or let another thread run; neither may see the map half-updated. So every mutation moves the old
// entries out first and lets them die once the map is consistent again.
struct CacheTable {
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> entries;
  std::unordered_map<const c10::TensorImpl*, WeakTensorPtr> owned;  // registered weights
  size_t prune_at;
  size_t owned_prune_at;

  CacheTable();
  bool owns(const at::Tensor& tensor) const;
  // Adds registered weights; expired ones are dropped once the set has doubled (amortised O(1) a weight).
  void own(const std::vector<at::Tensor>& weights);
  void disown_all();
  void store(const CacheKey& key, CacheEntry fresh);  // prunes dead entries once the table has doubled
  void erase(const CacheKey& key);
  void erase_weight(const c10::TensorImpl* impl);  // every dtype's entry of one weight
  void clear();
  void prune();
  std::vector<std::pair<at::Tensor, at::Tensor>> live_entries() const;  // (weight, cast) pairs
};

}  // namespace o1
}  // namespace apexlite

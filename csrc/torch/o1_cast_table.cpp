// The rules of apexlite._C.CastCache, those of apexlite/amp/o1/cache.py (its NOTEs):
// - only weights are cached (exact Tensor leaves that require grad, exact Parameters) that can be
//   validated (strided, with storage, not meta, not inference, not wrapped by torch.func or
//   functionalization), and nothing while a dispatch mode is active;
// - an entry is served only for the exact tensor it was cast from: same TensorImpl, StorageImpl,
//   storage offset, sizes, strides, dtype, device and version counter, all read before the cast;
// - registered weights' casts are held; every other entry holds its weight and cast weakly, and a
//   cast without autograd history of an unregistered weight is not stored at all.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>

#include "o1_cast_table.h"
#include "o1_casts.h"

namespace apexlite {
namespace o1 {
namespace {

constexpr size_t kMinPruneSize = 64;

WeakTensorPtr weak(const at::Tensor& tensor) { return WeakTensorPtr(tensor.getIntrusivePtr()); }

bool is_weight(PyObject* obj, const at::Tensor& tensor) {
  const auto* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  const bool parameter = type == ParameterClass;
  if (!parameter && type != THPVariableClass) return false;  // subclasses convert themselves, uncached
  return tensor.is_leaf() && (parameter || tensor.requires_grad());
}

bool validatable(const at::Tensor& tensor) {
  static const c10::DispatchKeySet wrappers({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                             c10::DispatchKey::FuncTorchGradWrapper,
                                             c10::DispatchKey::FuncTorchBatched});
  return tensor.layout() == at::kStrided && tensor.has_storage() && !tensor.is_meta() && !tensor.is_inference() &&
         !tensor.key_set().has_any(wrappers);
}

}  // namespace

Stamps::Stamps(const at::Tensor& tensor)
    : storage(tensor.storage().getWeakStorageImpl()),
      version(tensor._version()),
      offset(tensor.storage_offset()),
      sizes(tensor.sizes().begin(), tensor.sizes().end()),
      strides(tensor.strides().begin(), tensor.strides().end()),
      dtype(tensor.scalar_type()),
      device(tensor.device()) {}

bool Stamps::match(const at::Tensor& tensor) const {
  // the storage first: a tensor rebound to an inference tensor has no version counter to read
  return tensor.has_storage() && storage._unsafe_get_target() == tensor.storage().unsafeGetStorageImpl() &&
         offset == tensor.storage_offset() && version == tensor._version() && dtype == tensor.scalar_type() &&
         device == tensor.device() && tensor.sizes().equals(sizes) && tensor.strides().equals(strides);
}

at::Tensor CacheEntry::live_cast() const {
  if (cast.defined()) return cast;
  auto held = weak_cast.lock();
  return held ? at::Tensor(std::move(held)) : at::Tensor();
}

bool CacheEntry::live() const { return !source.expired() && (cast.defined() || !weak_cast.expired()); }

CacheTable::CacheTable() : prune_at(kMinPruneSize), owned_prune_at(kMinPruneSize) {}

bool CacheTable::owns(const at::Tensor& tensor) const {
  return owned.count(tensor.unsafeGetTensorImpl()) > 0;  // the weak pointer pins the address
}

void CacheTable::own(const std::vector<at::Tensor>& weights) {
  for (const at::Tensor& weight : weights) owned.emplace(weight.unsafeGetTensorImpl(), weak(weight));
  if (owned.size() < owned_prune_at) return;
  for (auto it = owned.begin(); it != owned.end();) {
    it = it->second.expired() ? owned.erase(it) : std::next(it);  // no tensor dies here: the pointers are weak
  }
  owned_prune_at = std::max(2 * owned.size(), kMinPruneSize);
}

void CacheTable::disown_all() {
  owned.clear();
  owned_prune_at = kMinPruneSize;
}

void CacheTable::store(const CacheKey& key, CacheEntry fresh) {
  auto slot = entries.find(key);
  if (slot == entries.end()) {
    entries.emplace(key, std::move(fresh));
  } else {
    std::swap(slot->second, fresh);  // the old entry dies with `fresh`
  }
  if (entries.size() >= prune_at) {
    prune();
    prune_at = std::max(2 * entries.size(), kMinPruneSize);
  }
}

void CacheTable::erase(const CacheKey& key) {
  auto slot = entries.find(key);
  if (slot == entries.end()) return;
  CacheEntry dead = std::move(slot->second);
  entries.erase(slot);
}

void CacheTable::erase_weight(const c10::TensorImpl* impl) {
  std::vector<CacheEntry> dead;
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->first.impl == impl) {
      dead.push_back(std::move(it->second));
      it = entries.erase(it);
    } else {
      ++it;
    }
  }
}

void CacheTable::clear() {
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> dead;
  dead.swap(entries);
  prune_at = kMinPruneSize;
}

void CacheTable::prune() {
  std::vector<CacheEntry> dead;
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->second.live()) {
      ++it;
    } else {
      dead.push_back(std::move(it->second));
      it = entries.erase(it);
    }
  }
}

std::vector<std::pair<at::Tensor, at::Tensor>> CacheTable::live_entries() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> live;
  for (const auto& item : entries) {
    auto source = item.second.source.lock();
    at::Tensor cast = item.second.live_cast();
    if (source && cast.defined()) live.emplace_back(at::Tensor(std::move(source)), std::move(cast));
  }
  return live;
}

at::Tensor convert(const at::Tensor& tensor, at::ScalarType dtype) {
  // A copy worth waiting for lets other threads run meanwhile, as torch's own bindings do (callers hold
  // no reference into the cache across this call); a small one is over before a GIL hand-off would be.
  if (tensor.numel() < (int64_t{1} << 16)) return tensor.to(dtype);
  PyThreadState* saved = PyEval_SaveThread();
  try {
    at::Tensor out = tensor.to(dtype);
    PyEval_RestoreThread(saved);
    return out;
  } catch (...) {
    PyEval_RestoreThread(saved);
    throw;
  }
}

at::Tensor cached_cast(CastCacheObject* cache, PyObject* tensor_obj, const at::Tensor& tensor, at::ScalarType dtype) {
  if (!is_weight(tensor_obj, tensor) || c10::impl::TorchDispatchModeTLS::any_modes_set()) {
    return convert(tensor, dtype);
  }
  CacheTable& table = *cache->table;
  const CacheKey key{tensor.unsafeGetTensorImpl(), dtype};
  auto found = table.entries.find(key);
  if (found != table.entries.end() && found->second.stamps.match(tensor)) {
    at::Tensor cast = found->second.live_cast();
    if (cast.defined() && (cast.requires_grad() || !(tensor.requires_grad() && c10::GradMode::is_enabled()))) {
      ++cache->hits;
      return cast;
    }
  }
  if (!validatable(tensor)) {
    table.erase(key);
    return convert(tensor, dtype);
  }
  Stamps stamps(tensor);  // before the cast: an update racing it can only make the entry miss
  at::Tensor cast = convert(tensor, dtype);  // may let other threads run: `found` is not used again
  ++cache->casts;
  if (c10::InferenceMode::is_enabled()) {
    table.erase(key);
  } else if (table.owns(tensor)) {
    table.store(key, CacheEntry{weak(tensor), std::move(stamps), cast, weak(at::Tensor())});
  } else if (cast.requires_grad()) {
    table.store(key, CacheEntry{weak(tensor), std::move(stamps), at::Tensor(), weak(cast)});
  } else {
    table.erase(key);  // nothing but this cache would keep the cast of a tensor it does not own
  }
  return cast;
}

}  // namespace o1
}  // namespace apexlite

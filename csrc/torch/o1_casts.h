// Native hot path of apexlite's O1 casting wrappers (issue: per-call host cost at autocast's level).
// Three Python types, registered on apexlite._C by register_o1_types():
//   CastCache   - weight casts keyed by tensor identity and dtype (apexlite/amp/o1/cache.py's rules)
//   CastState   - the switches a session's wrappers read: active, low dtype, caching, per-thread "off"
//   CastWrapper - the callable wrapt calls as (wrapped, instance, args, kwargs) for the LOW_PRECISION,
//                 FLOAT, PROMOTE and SEQUENCE_PROMOTE policies (apexlite/amp/o1/wrappers.py's semantics)
// The pure-Python implementations stay the reference; tests run the O1 suite against both.
#pragma once

#include <torch/csrc/python_headers.h>

#include <ATen/ATen.h>

#include <cstdint>

namespace apexlite {
namespace o1 {

// Policy codes shared with apexlite/amp/o1/native_casts.py.
enum Policy : int { kLowPrecision = 0, kFloat = 1, kPromote = 2, kSequencePromote = 3 };

// The cache's table (entries and registered weights); defined in o1_cast_cache.cpp.
struct CacheTable;

struct CastCacheObject {
  PyObject_HEAD
  CacheTable* table;
  int64_t casts;  // weight casts performed since reset_counters()
  int64_t hits;
};

struct CastStateObject {
  PyObject_HEAD
  bool active;
  at::ScalarType low_dtype;
  bool use_cache;
  bool log_casts;
  bool allow_banned;
  uint64_t device_mask;    // bit d set: tensors on c10::DeviceType d are cast (all bits: every device)
  CastCacheObject* cache;  // owned reference
  uint64_t id;             // key of this state's per-thread "casts off" depth
  PyObject* dict;          // instance __dict__ (Python subclasses add methods)
};

extern PyTypeObject CastCacheType;
extern PyTypeObject CastStateType;
extern PyTypeObject CastWrapperType;

// `tensor` converted to `dtype`, served from the cache when it is a valid weight entry.
at::Tensor cached_cast(CastCacheObject* cache, PyObject* tensor_obj, const at::Tensor& tensor, at::ScalarType dtype);

// The plain conversion every uncached cast uses (the same _to_copy and autograd node as Tensor.half()).
at::Tensor convert(const at::Tensor& tensor, at::ScalarType dtype);

// Whether the state's casts apply to a tensor on this device (NOTE [device scope] in apexlite/amp/o1/device_scope.py).
inline bool in_device_scope(const CastStateObject* state, const at::Tensor& tensor) {
  return (state->device_mask >> static_cast<unsigned>(tensor.device().type())) & 1u;
}

// This thread's "casts off" depth for a state.
int disabled_depth(const CastStateObject* state);

// Whether this thread runs the forward of a model registered with the state's session (NOTE [cast cache lifetime]).
bool in_forward(const CastStateObject* state);

// Adds CastCache, CastState and CastWrapper to `module`; returns 0, or -1 with a Python error set.
int register_o1_types(PyObject* module);

}  // namespace o1
}  // namespace apexlite

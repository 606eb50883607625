// apexlite._C.CastCache: the native twin of apexlite/amp/o1/cache.py (same rules, see its NOTE).
// A weight (a leaf that requires grad, or a Parameter) is cast once and served again while its version
// counter and data pointer are unchanged; a cast made without grad is not served where grad is needed;
// nothing is cached under inference mode or while a dispatch mode traces (torch.compile, make_fx) or
// for tensors without real storage (fake/functional tensors).
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <vector>

#include "o1_casts.h"

namespace apexlite {
namespace o1 {
namespace {

bool is_weight(PyObject* obj, const at::Tensor& tensor) {
  if (!tensor.is_leaf()) return false;
  if (tensor.requires_grad()) return true;
  // a frozen Parameter is still a weight; plain tensors skip the (Python-level) isinstance check
  return Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass) &&
         PyObject_IsInstance(obj, ParameterClass) == 1;
}

bool traced(const at::Tensor& tensor) {
  const auto keys = tensor.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize) ||
         !tensor.has_storage() || tensor.is_meta() || c10::impl::TorchDispatchModeTLS::any_modes_set();
}

CastCacheObject* as_cache(PyObject* self) { return reinterpret_cast<CastCacheObject*>(self); }

PyObject* cache_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* cache = as_cache(self);
  cache->entries = new std::unordered_map<CacheKey, CacheEntry, CacheKeyHash>();
  cache->casts = 0;
  cache->hits = 0;
  return self;
}

void cache_dealloc(PyObject* self) {
  delete as_cache(self)->entries;
  Py_TYPE(self)->tp_free(self);
}

PyObject* cache_cast(PyObject* self, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject* tensor_obj = nullptr;
  PyObject* dtype_obj = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &tensor_obj, &dtype_obj)) return nullptr;
  if (!THPVariable_Check(tensor_obj) || !THPDtype_Check(dtype_obj)) {
    PyErr_SetString(PyExc_TypeError, "CastCache.cast(tensor, dtype) takes a tensor and a torch.dtype");
    return nullptr;
  }
  const at::ScalarType dtype = reinterpret_cast<THPDtype*>(dtype_obj)->scalar_type;
  return THPVariable_Wrap(cached_cast(as_cache(self), tensor_obj, THPVariable_Unpack(tensor_obj), dtype));
  END_HANDLE_TH_ERRORS
}

// NOTE [no tensor dies inside the map]: dropping the last reference to a cached tensor can run Python
// code (its Python object is freed), and Python may then switch threads; another thread must never
// see the map half-updated. So every mutation moves the old entries out first and lets them die once
// the map is consistent again.
PyObject* cache_clear(PyObject* self, PyObject*) {
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> dead;
  dead.swap(*as_cache(self)->entries);
  Py_RETURN_NONE;
}

PyObject* cache_reset_counters(PyObject* self, PyObject*) {
  as_cache(self)->casts = 0;
  as_cache(self)->hits = 0;
  Py_RETURN_NONE;
}

const c10::TensorImpl* impl_of(PyObject* obj) {
  return THPVariable_Check(obj) ? THPVariable_Unpack(obj).unsafeGetTensorImpl() : nullptr;
}

PyObject* cache_remove(PyObject* self, PyObject* weight) {
  const c10::TensorImpl* impl = impl_of(weight);
  auto* entries = as_cache(self)->entries;
  std::vector<CacheEntry> dead;  // NOTE [no tensor dies inside the map]
  for (auto it = entries->begin(); it != entries->end();) {
    if (it->first.impl == impl) {
      dead.push_back(std::move(it->second));
      it = entries->erase(it);
    } else {
      ++it;
    }
  }
  Py_RETURN_NONE;
}

PyObject* cache_entries(PyObject* self, PyObject*) {
  HANDLE_TH_ERRORS
  std::vector<CacheEntry> snapshot;  // wrapping may run Python code: iterate a copy, not the map
  for (const auto& item : *as_cache(self)->entries) snapshot.push_back(item.second);
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const CacheEntry& e : snapshot) {
    PyObject* row = Py_BuildValue("(NLLN)", THPVariable_Wrap(e.source), static_cast<long long>(e.version),
                                  static_cast<long long>(reinterpret_cast<intptr_t>(e.address)),
                                  THPVariable_Wrap(e.cast));
    if (row == nullptr || PyList_Append(out, row) < 0) {
      Py_XDECREF(row);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(row);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

Py_ssize_t cache_len(PyObject* self) { return static_cast<Py_ssize_t>(as_cache(self)->entries->size()); }

int cache_contains(PyObject* self, PyObject* weight) {
  const c10::TensorImpl* impl = impl_of(weight);
  for (const auto& item : *as_cache(self)->entries) {
    if (item.first.impl == impl) return 1;
  }
  return 0;
}

PyObject* cache_get_casts(PyObject* self, void*) { return PyLong_FromLongLong(as_cache(self)->casts); }
PyObject* cache_get_hits(PyObject* self, void*) { return PyLong_FromLongLong(as_cache(self)->hits); }

PyMethodDef cache_methods[] = {
    {"cast", cache_cast, METH_VARARGS, "cast(tensor, dtype): the tensor in dtype, cached when it is a weight"},
    {"clear", cache_clear, METH_NOARGS, "drop every entry (iteration or forward boundary)"},
    {"reset_counters", cache_reset_counters, METH_NOARGS, "zero the casts/hits counters"},
    {"remove", cache_remove, METH_O, "forget every cast of one weight"},
    {"entries", cache_entries, METH_NOARGS, "[(weight, version, data pointer, cast), ...]"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef cache_getset[] = {
    {"casts", cache_get_casts, nullptr, "weight casts performed since reset_counters()", nullptr},
    {"hits", cache_get_hits, nullptr, "cache hits since reset_counters()", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PySequenceMethods cache_sequence = [] {
  PySequenceMethods methods{};
  methods.sq_length = cache_len;
  methods.sq_contains = cache_contains;
  return methods;
}();

}  // namespace

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
  if (!is_weight(tensor_obj, tensor) || traced(tensor)) return convert(tensor, dtype);
  const CacheKey key{tensor.unsafeGetTensorImpl(), dtype};
  auto found = cache->entries->find(key);
  if (found != cache->entries->end()) {
    const CacheEntry& entry = found->second;
    if (entry.version == tensor._version() && entry.address == tensor.const_data_ptr() &&
        (entry.cast.requires_grad() || !(tensor.requires_grad() && c10::GradMode::is_enabled()))) {
      ++cache->hits;
      return entry.cast;
    }
  }
  at::Tensor cast = convert(tensor, dtype);
  ++cache->casts;
  if (!c10::InferenceMode::is_enabled()) {
    CacheEntry fresh{tensor, tensor._version(), tensor.const_data_ptr(), cast};
    auto slot = cache->entries->find(key);  // looked up again: the copy above let other threads run
    if (slot == cache->entries->end()) {
      cache->entries->emplace(key, std::move(fresh));
    } else {
      std::swap(slot->second, fresh);  // the old entry dies with `fresh`: NOTE [no tensor dies inside the map]
    }
  }
  return cast;
}

PyTypeObject CastCacheType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "apexlite._C.CastCache";
  type.tp_basicsize = sizeof(CastCacheObject);
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_doc = "Weight casts keyed by tensor identity and dtype (apexlite/amp/o1/cache.py's rules, in C++).";
  type.tp_new = cache_new;
  type.tp_dealloc = cache_dealloc;
  type.tp_methods = cache_methods;
  type.tp_getset = cache_getset;
  type.tp_as_sequence = &cache_sequence;
  return type;
}();

}  // namespace o1
}  // namespace apexlite

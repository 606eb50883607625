// apexlite._C.CastCache: the native twin of apexlite/amp/o1/cache.py, the Python type over a CacheTable
// (o1_cast_table.h/.cpp hold the table and the rules, the same as cache.py's NOTEs).
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "o1_cast_table.h"
#include "o1_casts.h"

namespace apexlite {
namespace o1 {
namespace {

CastCacheObject* as_cache(PyObject* self) { return reinterpret_cast<CastCacheObject*>(self); }

PyObject* cache_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* cache = as_cache(self);
  cache->table = new CacheTable();
  cache->casts = 0;
  cache->hits = 0;
  return self;
}

void cache_dealloc(PyObject* self) {
  delete as_cache(self)->table;
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

PyObject* cache_clear(PyObject* self, PyObject*) {
  as_cache(self)->table->clear();
  Py_RETURN_NONE;
}

PyObject* cache_reset_counters(PyObject* self, PyObject*) {
  as_cache(self)->casts = 0;
  as_cache(self)->hits = 0;
  Py_RETURN_NONE;
}

PyObject* cache_own(PyObject* self, PyObject* weights) {
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> tensors;
  PyObject* iterator = PyObject_GetIter(weights);
  if (iterator == nullptr) return nullptr;
  while (PyObject* item = PyIter_Next(iterator)) {
    if (!THPVariable_Check(item)) {
      PyErr_Format(PyExc_TypeError, "CastCache.own() takes tensors; got %s", Py_TYPE(item)->tp_name);
      Py_DECREF(item);
      Py_DECREF(iterator);
      return nullptr;
    }
    tensors.push_back(THPVariable_Unpack(item));
    Py_DECREF(item);
  }
  Py_DECREF(iterator);
  if (PyErr_Occurred()) return nullptr;
  as_cache(self)->table->own(tensors);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* cache_disown_all(PyObject* self, PyObject* /*unused*/) {
  as_cache(self)->table->disown_all();
  Py_RETURN_NONE;
}

PyObject* cache_owns(PyObject* self, PyObject* tensor) {
  if (!THPVariable_Check(tensor)) Py_RETURN_FALSE;
  return PyBool_FromLong(as_cache(self)->table->owns(THPVariable_Unpack(tensor)) ? 1 : 0);
}

const c10::TensorImpl* impl_of(PyObject* obj) {
  return THPVariable_Check(obj) ? THPVariable_Unpack(obj).unsafeGetTensorImpl() : nullptr;
}

PyObject* cache_remove(PyObject* self, PyObject* weight) {
  as_cache(self)->table->erase_weight(impl_of(weight));
  Py_RETURN_NONE;
}

PyObject* cache_entries(PyObject* self, PyObject*) {
  HANDLE_TH_ERRORS
  const auto live = as_cache(self)->table->live_entries();  // held before wrapping runs Python code
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const auto& entry : live) {
    PyObject* row = Py_BuildValue("(NN)", THPVariable_Wrap(entry.first), THPVariable_Wrap(entry.second));
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

Py_ssize_t cache_len(PyObject* self) {
  CacheTable& table = *as_cache(self)->table;
  table.prune();
  return static_cast<Py_ssize_t>(table.entries.size());
}

int cache_contains(PyObject* self, PyObject* weight) {
  const c10::TensorImpl* impl = impl_of(weight);
  for (const auto& item : as_cache(self)->table->entries) {
    if (item.first.impl == impl && item.second.live()) return 1;
  }
  return 0;
}

PyObject* cache_get_casts(PyObject* self, void*) { return PyLong_FromLongLong(as_cache(self)->casts); }
PyObject* cache_get_hits(PyObject* self, void*) { return PyLong_FromLongLong(as_cache(self)->hits); }

PyMethodDef cache_methods[] = {
    {"cast", cache_cast, METH_VARARGS, "cast(tensor, dtype): the tensor in dtype, cached when it is a weight"},
    {"clear", cache_clear, METH_NOARGS, "drop every entry (iteration or forward boundary)"},
    {"reset_counters", cache_reset_counters, METH_NOARGS, "zero the casts/hits counters"},
    {"own", cache_own, METH_O, "own(weights): add registered weights, whose casts are held"},
    {"disown_all", cache_disown_all, METH_NOARGS, "disown_all(): forget every registered weight"},
    {"owns", cache_owns, METH_O, "owns(tensor): whether the tensor is a registered weight"},
    {"remove", cache_remove, METH_O, "forget every cast of one weight"},
    {"entries", cache_entries, METH_NOARGS, "[(weight, cast), ...] of the live entries"},
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

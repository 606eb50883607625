// apexlite._C.CastState: the switches of one session's O1 wrappers (apexlite/amp/o1/cast_state.py's NOTE).
// `active` and the options are per session; "casts off" blocks are a per-thread depth, kept here in
// thread-local storage keyed by the state's id, so the native wrappers read it without Python.
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <string>
#include <atomic>
#include <utility>
#include <vector>

#include "o1_casts.h"

namespace apexlite {
namespace o1 {
namespace {

std::atomic<uint64_t> next_state_id{1};
thread_local std::vector<std::pair<uint64_t, int>> disabled_depths;  // (state id, depth > 0)
thread_local std::vector<uint64_t> forward_scopes;  // ids of the states whose registered forward this thread runs

CastStateObject* as_state(PyObject* self) { return reinterpret_cast<CastStateObject*>(self); }

constexpr uint64_t kEveryDevice = ~uint64_t{0};
constexpr int kDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);
static_assert(kDeviceTypes <= 64, "device_mask holds one bit per c10::DeviceType");

PyObject* state_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* state = as_state(self);
  state->active = true;
  state->low_dtype = at::kHalf;
  state->use_cache = true;
  state->log_casts = false;
  state->allow_banned = false;
  state->device_mask = kEveryDevice;
  state->cache = nullptr;
  state->id = next_state_id++;
  state->dict = nullptr;
  return self;
}

int state_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<PyObject*>(as_state(self)->cache));
  Py_VISIT(as_state(self)->dict);
  return 0;
}

int state_clear(PyObject* self) {
  Py_CLEAR(as_state(self)->cache);
  Py_CLEAR(as_state(self)->dict);
  return 0;
}

void state_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  state_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* get_bool(bool value) { return PyBool_FromLong(value ? 1 : 0); }

int set_bool(PyObject* value, bool* target, const char* name) {
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "cannot delete %s", name);
    return -1;
  }
  const int truth = PyObject_IsTrue(value);
  if (truth < 0) return -1;
  *target = truth == 1;
  return 0;
}

#define APEXLITE_BOOL_FIELD(field)                                                                  \
  PyObject* get_##field(PyObject* self, void*) { return get_bool(as_state(self)->field); }          \
  int set_##field(PyObject* self, PyObject* value, void*) {                                         \
    return set_bool(value, &as_state(self)->field, #field);                                         \
  }

APEXLITE_BOOL_FIELD(active)
APEXLITE_BOOL_FIELD(use_cache)
APEXLITE_BOOL_FIELD(log_casts)
APEXLITE_BOOL_FIELD(allow_banned)
#undef APEXLITE_BOOL_FIELD

PyObject* get_low_dtype(PyObject* self, void*) {
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(as_state(self)->low_dtype));
  Py_INCREF(dtype);
  return dtype;
}

int set_low_dtype(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !THPDtype_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "low_dtype must be a torch.dtype");
    return -1;
  }
  as_state(self)->low_dtype = reinterpret_cast<THPDtype*>(value)->scalar_type;
  return 0;
}

// device_types: None (every device) or a frozenset of device type names ("cpu", "cuda", ...).
PyObject* get_device_types(PyObject* self, void*) {
  const uint64_t mask = as_state(self)->device_mask;
  if (mask == kEveryDevice) Py_RETURN_NONE;
  PyObject* names = PyFrozenSet_New(nullptr);
  if (names == nullptr) return nullptr;
  for (int type = 0; type < kDeviceTypes; ++type) {
    if (!((mask >> type) & 1u)) continue;
    const std::string name = c10::DeviceTypeName(static_cast<c10::DeviceType>(type), /*lower_case=*/true);
    PyObject* item = PyUnicode_FromString(name.c_str());
    if (item == nullptr || PySet_Add(names, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(names);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return names;
}

int set_device_types(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || value == Py_None) {
    as_state(self)->device_mask = kEveryDevice;
    return 0;
  }
  PyObject* iterator = PyObject_GetIter(value);
  if (iterator == nullptr) return -1;
  uint64_t mask = 0;
  PyObject* item = nullptr;
  while ((item = PyIter_Next(iterator)) != nullptr) {
    const char* name = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : nullptr;
    if (name == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "device_types holds device type names such as 'cuda'");
      Py_DECREF(item);
      Py_DECREF(iterator);
      return -1;
    }
    try {
      mask |= uint64_t{1} << static_cast<unsigned>(c10::Device(std::string(name)).type());
    } catch (const c10::Error&) {
      PyErr_Format(PyExc_ValueError, "unknown device type %R in device_types", item);
      Py_DECREF(item);
      Py_DECREF(iterator);
      return -1;
    }
    Py_DECREF(item);
  }
  Py_DECREF(iterator);
  if (PyErr_Occurred()) return -1;
  as_state(self)->device_mask = mask;
  return 0;
}

PyObject* get_cache(PyObject* self, void*) {
  PyObject* cache = reinterpret_cast<PyObject*>(as_state(self)->cache);
  if (cache == nullptr) Py_RETURN_NONE;
  Py_INCREF(cache);
  return cache;
}

int set_cache(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyObject_TypeCheck(value, &CastCacheType)) {
    PyErr_SetString(PyExc_TypeError, "cache must be an apexlite._C.CastCache");
    return -1;
  }
  Py_INCREF(value);
  Py_XSETREF(as_state(self)->cache, reinterpret_cast<CastCacheObject*>(value));
  return 0;
}

PyObject* get_enabled(PyObject* self, void*) {
  return get_bool(as_state(self)->active && disabled_depth(as_state(self)) == 0);
}

PyObject* get_disabled_depth(PyObject* self, void*) { return PyLong_FromLong(disabled_depth(as_state(self))); }

PyObject* push_disabled(PyObject* self, PyObject*) {
  const uint64_t id = as_state(self)->id;
  for (auto& entry : disabled_depths) {
    if (entry.first == id) {
      ++entry.second;
      Py_RETURN_NONE;
    }
  }
  disabled_depths.emplace_back(id, 1);
  Py_RETURN_NONE;
}

PyObject* pop_disabled(PyObject* self, PyObject*) {
  const uint64_t id = as_state(self)->id;
  for (auto it = disabled_depths.begin(); it != disabled_depths.end(); ++it) {
    if (it->first == id) {
      if (--it->second == 0) disabled_depths.erase(it);
      Py_RETURN_NONE;
    }
  }
  PyErr_SetString(PyExc_RuntimeError, "CastState.pop_disabled() without a matching push_disabled() in this thread");
  return nullptr;
}

PyObject* get_in_forward(PyObject* self, void*) { return get_bool(in_forward(as_state(self))); }

int set_in_forward(PyObject* self, PyObject* value, void*) {
  bool inside = false;
  if (set_bool(value, &inside, "in_forward") < 0) return -1;
  const uint64_t id = as_state(self)->id;
  const auto found = std::find(forward_scopes.begin(), forward_scopes.end(), id);
  if (inside && found == forward_scopes.end()) forward_scopes.push_back(id);
  if (!inside && found != forward_scopes.end()) forward_scopes.erase(found);
  return 0;
}

PyMethodDef state_methods[] = {
    {"push_disabled", push_disabled, METH_NOARGS, "enter a casts-off block in this thread"},
    {"pop_disabled", pop_disabled, METH_NOARGS, "leave the innermost casts-off block of this thread"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef state_getset[] = {
    {"active", get_active, set_active, "the session wants O1 casts (every thread)", nullptr},
    {"use_cache", get_use_cache, set_use_cache, "low-precision weight casts go through the cache", nullptr},
    {"log_casts", get_log_casts, set_log_casts, "log every cast at DEBUG (verbosity 2)", nullptr},
    {"allow_banned", get_allow_banned, set_allow_banned, "banned functions run in fp32", nullptr},
    {"low_dtype", get_low_dtype, set_low_dtype, "torch.float16 or torch.bfloat16", nullptr},
    {"cache", get_cache, set_cache, "the session's CastCache", nullptr},
    {"device_types", get_device_types, set_device_types, "device types whose tensors are cast (None: all)", nullptr},
    {"enabled", get_enabled, nullptr, "casts apply to calls made by the current thread", nullptr},
    {"disabled_depth", get_disabled_depth, nullptr, "this thread's casts-off nesting depth", nullptr},
    {"in_forward", get_in_forward, set_in_forward, "this thread runs a registered model's forward", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

}  // namespace

bool in_forward(const CastStateObject* state) {
  return std::find(forward_scopes.begin(), forward_scopes.end(), state->id) != forward_scopes.end();
}

int disabled_depth(const CastStateObject* state) {
  for (const auto& entry : disabled_depths) {
    if (entry.first == state->id) return entry.second;
  }
  return 0;
}

PyTypeObject CastStateType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "apexlite._C.CastState";
  type.tp_basicsize = sizeof(CastStateObject);
  type.tp_dictoffset = offsetof(CastStateObject, dict);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  type.tp_doc = "The O1 switches of one session, read by the native wrappers without Python.";
  type.tp_new = state_new;
  type.tp_dealloc = state_dealloc;
  type.tp_traverse = state_traverse;
  type.tp_clear = state_clear;
  type.tp_methods = state_methods;
  type.tp_getset = state_getset;
  return type;
}();

}  // namespace o1
}  // namespace apexlite

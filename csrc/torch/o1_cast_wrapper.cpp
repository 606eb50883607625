// apexlite._C.CastWrapper: what wrapt calls as wrapper(wrapped, instance, args, kwargs) for the
// LOW_PRECISION, FLOAT, PROMOTE and SEQUENCE_PROMOTE policies. The semantics are those of
// apexlite/amp/o1/wrappers.py and policies.py, line for line:
// - only float32/float16/bfloat16 tensors are cast (never float64, integer or bool ones);
// - lists, tuples (namedtuples keep their type), dicts are walked and rebuilt; other values pass as they are;
// - LOW_PRECISION casts to the state's low dtype through the cache, FLOAT to float32 without it;
// - PROMOTE casts every floating tensor to the widest dtype among them when they differ (SEQUENCE_PROMOTE
//   looks only at the first argument, a sequence, which is passed on as a list);
// - a Tensor method gets `self` cast too, and is called through the unbound original.
// Tensor subclasses are converted through their own Python methods (`.half()`...), as the Python path does.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/ScalarType.h>

#include "o1_casts.h"

namespace apexlite {
namespace o1 {
namespace {

namespace py = pybind11;

struct CastWrapperObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  int policy;
  CastStateObject* state;
  PyObject* original;
  PyObject* name;
};

bool castable(at::ScalarType type) { return type == at::kFloat || type == at::kHalf || type == at::kBFloat16; }

const char* converter_name(at::ScalarType type) {
  return type == at::kHalf ? "half" : type == at::kBFloat16 ? "bfloat16" : "float";
}

// One wrapper call's cast: target dtype, whether weights go through the cache, and what to log.
struct Caster {
  CastStateObject* state;
  at::ScalarType dtype;
  bool use_cache;
  PyObject* name;

  py::object tensor(PyObject* obj) const {
    const at::Tensor& value = THPVariable_Unpack(obj);
    const at::ScalarType source = value.scalar_type();
    if (source == dtype || !castable(source)) return py::reinterpret_borrow<py::object>(obj);
    if (state->log_casts) {
      py::object(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(state)))
          .attr("_log_cast")(py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(source))),
                             py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))), py::handle(name));
    }
    if (!THPVariable_CheckExact(obj)) {  // a subclass: its own conversion method (and __torch_function__)
      return py::reinterpret_borrow<py::object>(obj).attr(converter_name(dtype))();
    }
    if (use_cache && state->use_cache && state->cache != nullptr) {
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(cached_cast(state->cache, obj, value, dtype)));
    }
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(convert(value, dtype)));
  }

  // apexlite.amp.o1.policies.map_tensors with this cast.
  py::object map(PyObject* value) const {
    if (THPVariable_Check(value)) return tensor(value);
    if (PyList_Check(value)) {
      const Py_ssize_t n = PyList_GET_SIZE(value);
      py::list items(n);
      for (Py_ssize_t i = 0; i < n; ++i) items[i] = map(PyList_GET_ITEM(value, i));
      return std::move(items);
    }
    if (PyTuple_Check(value)) {
      const Py_ssize_t n = PyTuple_GET_SIZE(value);
      py::tuple items(n);
      for (Py_ssize_t i = 0; i < n; ++i) items[i] = map(PyTuple_GET_ITEM(value, i));
      if (PyTuple_CheckExact(value)) return std::move(items);
      py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(value)));
      if (PyObject_HasAttrString(value, "_fields")) return type(*items);  // namedtuple: positional
      return type(py::list(items));
    }
    if (PyDict_Check(value)) {
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      Py_ssize_t pos = 0;
      if (PyDict_CheckExact(value)) {
        py::dict out;
        while (PyDict_Next(value, &pos, &key, &item)) out[key] = map(item);
        return std::move(out);
      }
      py::list pairs;
      while (PyDict_Next(value, &pos, &key, &item)) pairs.append(py::make_tuple(py::handle(key), map(item)));
      return py::handle(reinterpret_cast<PyObject*>(Py_TYPE(value)))(pairs);
    }
    return py::reinterpret_borrow<py::object>(value);
  }
};

// True when `value` holds (directly or in a list/tuple/dict) a floating tensor the cast would change.
bool needs_cast(PyObject* value, at::ScalarType dtype) {
  if (THPVariable_Check(value)) {
    const at::ScalarType type = THPVariable_Unpack(value).scalar_type();
    return type != dtype && castable(type);
  }
  if (PyList_Check(value) || PyTuple_Check(value)) {
    const Py_ssize_t n = PyList_Check(value) ? PyList_GET_SIZE(value) : PyTuple_GET_SIZE(value);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (needs_cast(PyList_Check(value) ? PyList_GET_ITEM(value, i) : PyTuple_GET_ITEM(value, i), dtype)) return true;
    }
    return false;
  }
  if (PyDict_Check(value)) {
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(value, &pos, &key, &item)) {
      if (needs_cast(item, dtype)) return true;
    }
  }
  return false;
}

// wrappers._cast_call: original(cast(self)?, *mapped args, **mapped kwargs).
PyObject* cast_call(PyObject* original, PyObject* instance, PyObject* args, PyObject* kwargs, const Caster& cast) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  const Py_ssize_t shift = instance == Py_None ? 0 : 1;
  py::tuple call_args(n + shift);
  if (shift) call_args[0] = THPVariable_Check(instance) ? cast.tensor(instance) : cast.map(instance);
  for (Py_ssize_t i = 0; i < n; ++i) call_args[i + shift] = cast.map(PyTuple_GET_ITEM(args, i));
  py::object call_kwargs;
  if (kwargs != nullptr && kwargs != Py_None && PyDict_GET_SIZE(kwargs) > 0) {
    py::dict mapped;
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &item)) mapped[key] = cast.map(item);
    call_kwargs = std::move(mapped);
  }
  return PyObject_Call(original, call_args.ptr(), call_kwargs ? call_kwargs.ptr() : nullptr);
}

// policies.collect_float_dtypes, as a bit set over the three castable dtypes.
void collect(PyObject* value, unsigned& found) {
  if (THPVariable_Check(value)) {
    const at::ScalarType type = THPVariable_Unpack(value).scalar_type();
    if (type == at::kFloat) found |= 1u;
    if (type == at::kHalf) found |= 2u;
    if (type == at::kBFloat16) found |= 4u;
  } else if (PyList_Check(value) || PyTuple_Check(value)) {
    py::object items = py::reinterpret_steal<py::object>(PySequence_Fast(value, "a sequence"));
    if (!items) throw py::error_already_set();
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items.ptr()); ++i) {
      collect(PySequence_Fast_GET_ITEM(items.ptr(), i), found);
    }
  } else if (PyDict_Check(value)) {
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(value, &pos, &key, &item)) collect(item, found);
  }
}

at::ScalarType widest(unsigned found) {
  at::ScalarType result = at::ScalarType::Undefined;
  const at::ScalarType types[] = {at::kFloat, at::kHalf, at::kBFloat16};
  for (int i = 0; i < 3; ++i) {
    if (found & (1u << i)) result = result == at::ScalarType::Undefined ? types[i] : c10::promoteTypes(result, types[i]);
  }
  return result;
}

PyObject* promote_call(CastWrapperObject* self, PyObject* wrapped, PyObject* instance, PyObject* args,
                       PyObject* kwargs, bool sequence) {
  unsigned found = 0;
  if (instance != Py_None) collect(instance, found);
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  collect(sequence && n > 0 ? PyTuple_GET_ITEM(args, 0) : args, found);
  if (!sequence && kwargs != nullptr && kwargs != Py_None) collect(kwargs, found);
  if (__builtin_popcount(found) <= 1) return PyObject_Call(wrapped, args, kwargs == Py_None ? nullptr : kwargs);
  const Caster cast{self->state, widest(found), false, self->name};
  if (!sequence) return cast_call(self->original, instance, args, kwargs, cast);
  py::object first = py::reinterpret_steal<py::object>(PySequence_List(PyTuple_GET_ITEM(args, 0)));
  if (!first) throw py::error_already_set();
  py::tuple call_args(n);
  call_args[0] = cast.map(first.ptr());
  for (Py_ssize_t i = 1; i < n; ++i) call_args[i] = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(args, i));
  return PyObject_Call(self->original, call_args.ptr(), kwargs == Py_None ? nullptr : kwargs);
}

// A fixed-dtype call (LOW_PRECISION, FLOAT). When no argument would change, the call goes straight to
// wrapt's `wrapped` (the same function, already bound for a method) with the caller's own arguments.
PyObject* fixed_call(CastWrapperObject* self, PyObject* wrapped, PyObject* instance, PyObject* args,
                     PyObject* kwargs, const Caster& cast) {
  bool change = (instance != Py_None && needs_cast(instance, cast.dtype)) || needs_cast(args, cast.dtype) ||
                (kwargs != nullptr && needs_cast(kwargs, cast.dtype));
  if (!change) return PyObject_Call(wrapped, args, kwargs);
  return cast_call(self->original, instance, args, kwargs, cast);
}

PyObject* dispatch(CastWrapperObject* self, PyObject* const* argv) {
  PyObject* wrapped = argv[0];
  PyObject* instance = argv[1];
  PyObject* args = argv[2];
  PyObject* kwargs = argv[3] == Py_None ? nullptr : argv[3];
  CastStateObject* state = self->state;
  if (!state->active || disabled_depth(state) != 0) return PyObject_Call(wrapped, args, kwargs);
  switch (self->policy) {
    case kLowPrecision:
      return fixed_call(self, wrapped, instance, args, kwargs, Caster{state, state->low_dtype, true, self->name});
    case kFloat:
      return fixed_call(self, wrapped, instance, args, kwargs, Caster{state, at::kFloat, false, self->name});
    case kPromote:
      return promote_call(self, wrapped, instance, args, kwargs, false);
    default:
      return promote_call(self, wrapped, instance, args, kwargs, true);
  }
}

// The entry point: checks wrapt's calling convention, translates C++ errors to Python ones (torch's
// mapping) without the cost of torch's warning-buffering macro on every call.
PyObject* wrapper_vectorcall(PyObject* callable, PyObject* const* argv, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<CastWrapperObject*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 4 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) ||
      !PyTuple_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "CastWrapper is called by wrapt as wrapper(wrapped, instance, args, kwargs)");
    return nullptr;
  }
  try {
    return dispatch(self, argv);
  } catch (python_error& error) {
    error.restore();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
  }
  return nullptr;
}

PyObject* wrapper_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  int policy = 0;
  PyObject* state = nullptr;
  PyObject* original = nullptr;
  PyObject* name = nullptr;
  static const char* keywords[] = {"policy", "state", "original", "name", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iO!OU", const_cast<char**>(keywords), &policy, &CastStateType,
                                   &state, &original, &name)) {
    return nullptr;
  }
  if (policy < kLowPrecision || policy > kSequencePromote) {
    PyErr_Format(PyExc_ValueError, "unknown cast policy code %d", policy);
    return nullptr;
  }
  PyObject* obj = type->tp_alloc(type, 0);
  if (obj == nullptr) return nullptr;
  auto* self = reinterpret_cast<CastWrapperObject*>(obj);
  self->vectorcall = wrapper_vectorcall;
  self->policy = policy;
  Py_INCREF(state);
  self->state = reinterpret_cast<CastStateObject*>(state);
  Py_INCREF(original);
  self->original = original;
  Py_INCREF(name);
  self->name = name;
  return obj;
}

int wrapper_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<CastWrapperObject*>(obj);
  Py_VISIT(reinterpret_cast<PyObject*>(self->state));
  Py_VISIT(self->original);
  return 0;
}

int wrapper_clear(PyObject* obj) {
  auto* self = reinterpret_cast<CastWrapperObject*>(obj);
  Py_CLEAR(self->state);
  Py_CLEAR(self->original);
  Py_CLEAR(self->name);
  return 0;
}

void wrapper_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  wrapper_clear(obj);
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* wrapper_repr(PyObject* obj) {
  auto* self = reinterpret_cast<CastWrapperObject*>(obj);
  return PyUnicode_FromFormat("<apexlite._C.CastWrapper policy=%d for %U>", self->policy, self->name);
}

}  // namespace

PyTypeObject CastWrapperType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "apexlite._C.CastWrapper";
  type.tp_basicsize = sizeof(CastWrapperObject);
  type.tp_vectorcall_offset = offsetof(CastWrapperObject, vectorcall);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_doc = "CastWrapper(policy, state, original, name): an O1 casting wrapper for wrapt, in C++.";
  type.tp_new = wrapper_new;
  type.tp_call = PyVectorcall_Call;
  type.tp_dealloc = wrapper_dealloc;
  type.tp_traverse = wrapper_traverse;
  type.tp_clear = wrapper_clear;
  type.tp_repr = wrapper_repr;
  return type;
}();

int register_o1_types(PyObject* module) {
  PyTypeObject* types[] = {&CastCacheType, &CastStateType, &CastWrapperType};
  const char* names[] = {"CastCache", "CastState", "CastWrapper"};
  for (int i = 0; i < 3; ++i) {
    if (PyType_Ready(types[i]) < 0) return -1;
    Py_INCREF(types[i]);
    if (PyModule_AddObject(module, names[i], reinterpret_cast<PyObject*>(types[i])) < 0) {
      Py_DECREF(types[i]);
      return -1;
    }
  }
  return 0;
}

}  // namespace o1
}  // namespace apexlite

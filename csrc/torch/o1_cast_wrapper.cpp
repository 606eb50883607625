// apexlite._C.CastWrapper: what wrapt calls as wrapper(wrapped, instance, args, kwargs) for the
// LOW_PRECISION, FLOAT, PROMOTE and SEQUENCE_PROMOTE policies. The semantics are those of
// apexlite/amp/o1/wrappers.py and policies.py, line for line:
// - calls with `out=` (not None), calls made while torch.jit traces, and calls with the state's casts off
//   go straight to the unpatched op (torch.autocast leaves out= calls uncast too);
// - only float32/float16/bfloat16 tensors on the state's devices are cast (never float64, integer or bool
//   ones; PROMOTE looks only at tensors on those devices), Tensor subclasses
//   through policies.CONVERTERS; arguments are walked as policies' NOTE [walking arguments] says
//   (o1_cast_args.cpp);
// - LOW_PRECISION casts to the state's low dtype through the cache, FLOAT to float32 without it;
// - PROMOTE casts every floating tensor to the widest dtype among them when they differ (SEQUENCE_PROMOTE
//   looks only at the first argument, a sequence, which is passed on as a list);
// - a Tensor method gets `self` cast too, and is called through the unbound original.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <c10/core/ScalarType.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>

#include <cstring>

#include "o1_cast_args.h"
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

// True for a call given `out=` (not None): it runs uncast and writes the caller's tensor, as under autocast.
bool writes_out(PyObject* kwargs) {
  if (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) return false;
  static PyObject* key = PyUnicode_InternFromString("out");
  PyObject* out = PyDict_GetItemWithError(kwargs, key);
  if (out == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return out != nullptr && out != Py_None;
}

// wrappers._cast_call: original(cast(self)?, *mapped args, **mapped kwargs), or wrapt's `wrapped` with the
// caller's own arguments when the walk changed nothing.
PyObject* cast_call(PyObject* wrapped, PyObject* original, PyObject* instance, PyObject* args, PyObject* kwargs,
                    const Caster& cast) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  const Py_ssize_t shift = instance == Py_None ? 0 : 1;
  c10::SmallVector<py::object, 8> mapped;
  mapped.reserve(n + shift);
  bool changed = false;
  if (shift) {
    mapped.push_back(cast.map(instance));
    changed = mapped.back().ptr() != instance;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    mapped.push_back(cast.map(arg));
    changed = changed || mapped.back().ptr() != arg;
  }
  py::object call_kwargs;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0) {
    call_kwargs = cast.map(kwargs);
    changed = changed || call_kwargs.ptr() != kwargs;
  }
  if (!changed) return PyObject_Call(wrapped, args, kwargs);
  py::tuple call_args(n + shift);
  for (Py_ssize_t i = 0; i < n + shift; ++i) PyTuple_SET_ITEM(call_args.ptr(), i, mapped[i].release().ptr());
  return PyObject_Call(original, call_args.ptr(), call_kwargs ? call_kwargs.ptr() : nullptr);
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
  if (instance != Py_None) found |= collect_float_dtypes(self->state, instance);
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  found |= collect_float_dtypes(self->state, sequence && n > 0 ? PyTuple_GET_ITEM(args, 0) : args);
  if (!sequence && kwargs != nullptr) found |= collect_float_dtypes(self->state, kwargs);
  if (__builtin_popcount(found) <= 1) return PyObject_Call(wrapped, args, kwargs);
  const Caster cast{self->state, widest(found), false, self->name};
  if (!sequence) return cast_call(wrapped, self->original, instance, args, kwargs, cast);
  py::object first = py::reinterpret_steal<py::object>(PySequence_List(PyTuple_GET_ITEM(args, 0)));
  if (!first) throw py::error_already_set();
  py::tuple call_args(n);
  call_args[0] = cast.map(first.ptr());
  for (Py_ssize_t i = 1; i < n; ++i) call_args[i] = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(args, i));
  return PyObject_Call(self->original, call_args.ptr(), kwargs);
}

// A torch decomposition calling the patched op while a dispatch mode traces (torch.compile's AOT step,
// make_fx): its dtypes are torch's own choice (the CPU attention math upcasts to fp32), so no O1 cast applies.
// Read from the calling Python frame's module, only while a dispatch mode is active (never in eager code).
bool called_by_torch_internals() {
  if (c10::impl::TorchDispatchModeTLS::stack_len() == 0) return false;
  PyObject* globals = PyEval_GetGlobals();  // borrowed: the frame that called the patched op
  if (globals == nullptr) return false;
  PyObject* module = PyDict_GetItemString(globals, "__name__");  // borrowed
  const char* name = module != nullptr && PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : nullptr;
  if (name == nullptr) {
    PyErr_Clear();
    return false;
  }
  for (const char* prefix : {"torch._decomp", "torch._refs", "torch._prims"}) {
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

PyObject* dispatch(CastWrapperObject* self, PyObject* const* argv) {
  PyObject* wrapped = argv[0];
  PyObject* instance = argv[1];
  PyObject* args = argv[2];
  PyObject* kwargs = argv[3] == Py_None ? nullptr : argv[3];
  CastStateObject* state = self->state;
  if (!state->active || disabled_depth(state) != 0 || torch::jit::tracer::isTracing() || writes_out(kwargs) ||
      called_by_torch_internals()) {
    return PyObject_Call(wrapped, args, kwargs);
  }
  switch (self->policy) {
    case kLowPrecision:
      return cast_call(wrapped, self->original, instance, args, kwargs,
                       Caster{state, state->low_dtype, true, self->name});
    case kFloat:
      return cast_call(wrapped, self->original, instance, args, kwargs, Caster{state, at::kFloat, false, self->name});
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

// See o1_cast_args.h and apexlite/amp/o1/policies.py's NOTE [walking arguments].
#include "o1_cast_args.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/GradMode.h>

namespace apexlite {
namespace o1 {
namespace {

namespace py = pybind11;

// Deeper than Python's default recursion limit lets either path go. A program that raises that limit far
// above its default still gets RecursionError here, where the C stack would otherwise run out.
constexpr int kMaxNesting = 10000;

// One container level of a walk: it counts against Python's recursion limit and against kMaxNesting.
class Nesting {
 public:
  explicit Nesting(int& depth) : depth_(depth) {
    if (depth_ >= kMaxNesting) {
      PyErr_Format(PyExc_RecursionError,
                   "maximum nesting depth (%d) exceeded while walking the arguments of an O1-wrapped call",
                   kMaxNesting);
      throw py::error_already_set();
    }
    if (Py_EnterRecursiveCall(" while walking the arguments of an O1-wrapped call") != 0) {
      throw py::error_already_set();
    }
    ++depth_;
  }
  ~Nesting() {
    --depth_;
    Py_LeaveRecursiveCall();
  }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  int& depth_;
};

bool castable(at::ScalarType type) { return type == at::kFloat || type == at::kHalf || type == at::kBFloat16; }

// apexlite.amp.o1.policies.<name>, imported at its first use and kept for the life of the process.
PyObject* policies_attribute(const char* name, PyObject*& slot) {
  if (slot == nullptr) {
    py::object value = py::module_::import("apexlite.amp.o1.policies").attr(name);
    if (slot == nullptr) slot = value.release().ptr();  // the import may have let another thread fill it
  }
  return slot;
}

// policies.CONVERTERS[dtype]: how the Python path converts a Tensor subclass.
py::object converter(at::ScalarType dtype) {
  static PyObject* converters = nullptr;
  PyObject* table = policies_attribute("CONVERTERS", converters);
  PyObject* found = PyDict_GetItemWithError(table, reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
  if (found == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "policies.CONVERTERS has no entry for this dtype");
    throw py::error_already_set();
  }
  return py::reinterpret_borrow<py::object>(found);
}

// policies.rebuild(container, items): a subclass container rebuilt exactly as the Python path does.
py::object rebuild(PyObject* container, const py::list& items) {
  static PyObject* function = nullptr;
  PyObject* out =
      PyObject_CallFunctionObjArgs(policies_attribute("rebuild", function), container, items.ptr(), nullptr);
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(out);
}

// One read of a list or tuple, as `tuple(value)`: strong references that no other code can change.
py::tuple snapshot(PyObject* sequence) {
  PyObject* items = PySequence_Tuple(sequence);
  if (items == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::tuple>(items);
}

py::list new_list(PyObject* items) {
  if (items == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::list>(items);
}

void collect(const CastStateObject* state, PyObject* value, unsigned& found, int& depth) {
  if (is_tensor(value)) {
    const at::Tensor& tensor = THPVariable_Unpack(value);
    if (!in_device_scope(state, tensor)) return;
    const at::ScalarType type = tensor.scalar_type();
    if (type == at::kFloat) found |= 1u;
    if (type == at::kHalf) found |= 2u;
    if (type == at::kBFloat16) found |= 4u;
    return;
  }
  if (PyList_Check(value) || PyTuple_Check(value)) {
    Nesting level(depth);
    const py::tuple items = snapshot(value);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.ptr()); ++i) collect(state, PyTuple_GET_ITEM(items.ptr(), i), found, depth);
  } else if (PyDict_Check(value)) {
    Nesting level(depth);
    const py::list items = new_list(PyDict_Values(value));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items.ptr()); ++i) collect(state, PyList_GET_ITEM(items.ptr(), i), found, depth);
  }
}

}  // namespace

bool is_tensor(PyObject* obj) {
  return THPVariable_CheckExact(obj) || PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

py::object Caster::tensor(PyObject* obj) const {
  const at::ScalarType source = THPVariable_Unpack(obj).scalar_type();
  if (source == dtype || !castable(source) || !in_device_scope(state, THPVariable_Unpack(obj))) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  if (state->log_casts) {
    py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(state))
        .attr("_log_cast")(py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(source))),
                           py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))), py::handle(name));
  }
  if (!THPVariable_CheckExact(obj)) {  // a subclass: converted as the Python path converts it, never cached
    PyObject* out = PyObject_CallOneArg(converter(dtype).ptr(), obj);
    if (out == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(out);
  }
  // outside a registered forward, casts under no_grad are not cached (NOTE [cast cache lifetime])
  if (use_cache && state->use_cache && state->cache != nullptr && (c10::GradMode::is_enabled() || in_forward(state))) {
    // a strong reference: Python code may give the state another cache while this cast runs
    const py::object cache = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(state->cache));
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(
        cached_cast(reinterpret_cast<CastCacheObject*>(cache.ptr()), obj, THPVariable_Unpack(obj), dtype)));
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(convert(THPVariable_Unpack(obj), dtype)));
}

py::object Caster::map(PyObject* value) const {
  if (is_tensor(value)) return tensor(value);
  const bool sequence = PyList_Check(value) || PyTuple_Check(value);
  if (!sequence && !PyDict_Check(value)) return py::reinterpret_borrow<py::object>(value);
  Nesting level(depth);
  // a sequence: its snapshot's items; a dict: its (key, value) pairs, in a list only this walk can see
  const py::object items = sequence ? py::object(snapshot(value)) : py::object(new_list(PyDict_Items(value)));
  const Py_ssize_t n = sequence ? PyTuple_GET_SIZE(items.ptr()) : PyList_GET_SIZE(items.ptr());
  py::list mapped;  // allocated at the first item that changes
  bool changed = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* entry = sequence ? PyTuple_GET_ITEM(items.ptr(), i) : PyList_GET_ITEM(items.ptr(), i);
    PyObject* item = sequence ? entry : PyTuple_GET_ITEM(entry, 1);
    py::object result = map(item);
    if (result.ptr() == item && !changed) continue;
    if (!changed) {
      changed = true;
      mapped = new_list(PyList_New(n));
      for (Py_ssize_t j = 0; j < i; ++j) {
        PyObject* kept = sequence ? PyTuple_GET_ITEM(items.ptr(), j) : PyList_GET_ITEM(items.ptr(), j);
        Py_INCREF(kept);
        PyList_SET_ITEM(mapped.ptr(), j, kept);
      }
    }
    py::object slot = sequence ? result : py::object(py::make_tuple(py::handle(PyTuple_GET_ITEM(entry, 0)), result));
    PyList_SET_ITEM(mapped.ptr(), i, slot.release().ptr());
  }
  if (!changed) return py::reinterpret_borrow<py::object>(value);
  if (PyList_CheckExact(value)) return std::move(mapped);
  if (PyTuple_CheckExact(value)) {
    PyObject* tuple = PyList_AsTuple(mapped.ptr());
    if (tuple == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(tuple);
  }
  if (PyDict_CheckExact(value)) {
    py::dict out;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* pair = PyList_GET_ITEM(mapped.ptr(), i);
      if (PyDict_SetItem(out.ptr(), PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0) {
        throw py::error_already_set();
      }
    }
    return std::move(out);
  }
  return rebuild(value, mapped);
}

unsigned collect_float_dtypes(const CastStateObject* state, PyObject* value) {
  unsigned found = 0;
  int depth = 0;
  collect(state, value, found, depth);
  return found;
}

}  // namespace o1
}  // namespace apexlite

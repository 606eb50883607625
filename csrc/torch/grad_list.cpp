// apexlite._C.GradList (grad_list.h): a Python object owning a std::vector<at::Tensor>. Made only by the
// grad check (flat_grads.cpp); len() and tensors() show what it holds, for tests and debugging.
#include "grad_list.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <new>
#include <utility>

namespace apexlite {
namespace {

struct GradListObject {
  PyObject_HEAD
  std::vector<at::Tensor>* grads;
};

void grad_list_dealloc(PyObject* self) {
  delete reinterpret_cast<GradListObject*>(self)->grads;
  Py_TYPE(self)->tp_free(self);
}

Py_ssize_t grad_list_len(PyObject* self) {
  return static_cast<Py_ssize_t>(reinterpret_cast<GradListObject*>(self)->grads->size());
}

PyObject* grad_list_tensors_method(PyObject* self, PyObject* /*unused*/) {
  HANDLE_TH_ERRORS
  const std::vector<at::Tensor>& grads = *reinterpret_cast<GradListObject*>(self)->grads;
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(grads.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < grads.size(); ++i) PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), THPVariable_Wrap(grads[i]));
  return tuple;
  END_HANDLE_TH_ERRORS
}

PyMethodDef grad_list_methods[] = {
    {"tensors", grad_list_tensors_method, METH_NOARGS, "tensors() -> the grads as a tuple of tensors"},
    {nullptr, nullptr, 0, nullptr},
};

PySequenceMethods grad_list_sequence = [] {
  PySequenceMethods methods{};
  methods.sq_length = grad_list_len;
  return methods;
}();

PyTypeObject GradListType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "apexlite._C.GradList";
  type.tp_basicsize = sizeof(GradListObject);
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_doc = "Grads read where they are by FusedAdam's flat step, held as C++ tensors (made by the grad check).";
  type.tp_dealloc = grad_list_dealloc;
  type.tp_methods = grad_list_methods;
  type.tp_as_sequence = &grad_list_sequence;
  return type;
}();

}  // namespace

PyObject* make_grad_list(std::vector<at::Tensor>&& grads) {
  PyObject* self = GradListType.tp_alloc(&GradListType, 0);
  if (self == nullptr) return nullptr;
  reinterpret_cast<GradListObject*>(self)->grads = new (std::nothrow) std::vector<at::Tensor>(std::move(grads));
  if (reinterpret_cast<GradListObject*>(self)->grads == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return self;
}

const std::vector<at::Tensor>* grad_list_tensors(PyObject* object) {
  return Py_TYPE(object) == &GradListType ? reinterpret_cast<GradListObject*>(object)->grads : nullptr;
}

int register_grad_list_type(PyObject* module) {
  if (PyType_Ready(&GradListType) < 0) return -1;
  Py_INCREF(&GradListType);
  if (PyModule_AddObject(module, "GradList", reinterpret_cast<PyObject*>(&GradListType)) < 0) {
    Py_DECREF(&GradListType);
    return -1;
  }
  return 0;
}

}  // namespace apexlite

// apexlite._C.fused_adam_flat and fused_adam_flat_grad_list: FusedAdam's per-step calls of the
// apexlite::fused_adam_flat_ and fused_adam_flat_grad_list_ ops (ops.cpp), made through the dispatcher with
// positional arguments. torch.ops costs about 5.7 us a call from Python (keyword parsing, a
// __torch_function__ check of every tensor, of every element of a tensor list: about 100 ns a grad); this
// costs 1.5. Dispatch keys, modes and the profiler see the op as before; the op's own checks judge the
// tensors, which FusedAdam's grad check handed over.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "grad_list.h"

namespace apexlite {
namespace {

using FlatOp = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const c10::optional<at::Tensor>&, double, double, double, double, double, bool, bool,
                    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, bool);
using GradListOp = void(const at::Tensor&, at::TensorList, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, const c10::optional<at::Tensor>&, double, double, double, double, double,
                        bool, bool, const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, bool);

c10::optional<at::Tensor> optional_tensor(PyObject* object) {
  if (object == Py_None) return c10::nullopt;
  return THPVariable_Unpack(object);
}

// The tensors of a tuple as one array for a TensorList argument, borrowed: no reference is taken or
// dropped per tensor (each would cost about 25 ns a grad, the drop reaching back to the Python object).
// The tuple keeps every tensor alive for the call; the borrows are given back, never released, however
// the call ends.
struct BorrowedTensors {
  using Traits = c10::MaybeOwnedTraits<at::Tensor>;
  std::vector<at::Tensor> tensors;

  explicit BorrowedTensors(PyObject* tuple) {  // nullptr: none
    if (tuple == nullptr) return;
    tensors.reserve(static_cast<size_t>(PyTuple_GET_SIZE(tuple)));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
      tensors.push_back(Traits::createBorrow(THPVariable_Unpack(PyTuple_GET_ITEM(tuple, i))));
    }
  }
  ~BorrowedTensors() {
    for (at::Tensor& t : tensors) Traits::destroyBorrow(t);
  }
  BorrowedTensors(const BorrowedTensors&) = delete;
  BorrowedTensors& operator=(const BorrowedTensors&) = delete;
};

bool all_tensors(PyObject* objects) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(objects); ++i) {
    if (!THPVariable_Check(PyTuple_GET_ITEM(objects, i))) return false;
  }
  return true;
}

PyObject* fused_adam_flat(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *param, *grad, *exp_avg, *exp_avg_sq, *steps, *model_copy, *grad_scale, *found_inf;
  double lr, beta1, beta2, eps, weight_decay;
  int bias_correction, adam_w_mode, unscale_grads;
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!OdddddppOOp", THPVariableClass, &param, THPVariableClass, &grad,
                        THPVariableClass, &exp_avg, THPVariableClass, &exp_avg_sq, THPVariableClass, &steps,
                        &model_copy, &lr, &beta1, &beta2, &eps, &weight_decay, &bias_correction, &adam_w_mode,
                        &grad_scale, &found_inf, &unscale_grads)) {
    return nullptr;
  }
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("apexlite::fused_adam_flat_", "").typed<FlatOp>();
  {
    pybind11::gil_scoped_release no_gil;
    op.call(THPVariable_Unpack(param), THPVariable_Unpack(grad), THPVariable_Unpack(exp_avg),
            THPVariable_Unpack(exp_avg_sq), THPVariable_Unpack(steps), optional_tensor(model_copy), lr, beta1, beta2,
            eps, weight_decay, bias_correction != 0, adam_w_mode != 0, optional_tensor(grad_scale),
            optional_tensor(found_inf), unscale_grads != 0);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* fused_adam_flat_grad_list(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *param, *grads, *offsets, *exp_avg, *exp_avg_sq, *steps, *model_copy, *grad_scale, *found_inf;
  double lr, beta1, beta2, eps, weight_decay;
  int bias_correction, adam_w_mode, unscale_grads;
  if (!PyArg_ParseTuple(args, "O!OO!O!O!O!OdddddppOOp", THPVariableClass, &param, &grads,
                        THPVariableClass, &offsets, THPVariableClass, &exp_avg, THPVariableClass, &exp_avg_sq,
                        THPVariableClass, &steps, &model_copy, &lr, &beta1, &beta2, &eps, &weight_decay,
                        &bias_correction, &adam_w_mode, &grad_scale, &found_inf, &unscale_grads)) {
    return nullptr;
  }
  const std::vector<at::Tensor>* held = grad_list_tensors(grads);
  if (held == nullptr && !PyTuple_Check(grads)) {
    PyErr_Format(PyExc_TypeError, "apexlite._C.fused_adam_flat_grad_list: grads must be a tuple of tensors or a "
                 "GradList, not %s", Py_TYPE(grads)->tp_name);
    return nullptr;
  }
  TORCH_CHECK(held != nullptr || all_tensors(grads), "apexlite._C.fused_adam_flat_grad_list: grads must be a tuple "
              "of tensors");
  const BorrowedTensors borrowed(held == nullptr ? grads : nullptr);
  const at::TensorList grad_list = held != nullptr ? at::TensorList(*held) : at::TensorList(borrowed.tensors);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("apexlite::fused_adam_flat_grad_list_", "")
                             .typed<GradListOp>();
  {
    pybind11::gil_scoped_release no_gil;
    op.call(THPVariable_Unpack(param), grad_list, THPVariable_Unpack(offsets), THPVariable_Unpack(exp_avg),
            THPVariable_Unpack(exp_avg_sq), THPVariable_Unpack(steps), optional_tensor(model_copy), lr, beta1, beta2,
            eps, weight_decay, bias_correction != 0, adam_w_mode != 0, optional_tensor(grad_scale),
            optional_tensor(found_inf), unscale_grads != 0);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef kFunctions[] = {
    {"fused_adam_flat", fused_adam_flat, METH_VARARGS,
     "fused_adam_flat(param, grad, exp_avg, exp_avg_sq, steps, model_copy, lr, beta1, beta2, eps, weight_decay, "
     "bias_correction, adam_w_mode, grad_scale, found_inf, unscale_grads): the apexlite::fused_adam_flat_ op"},
    {"fused_adam_flat_grad_list", fused_adam_flat_grad_list, METH_VARARGS,
     "fused_adam_flat_grad_list(param, grads, offsets, exp_avg, exp_avg_sq, steps, model_copy, lr, beta1, beta2, eps, "
     "weight_decay, bias_correction, adam_w_mode, grad_scale, found_inf, unscale_grads): the "
     "apexlite::fused_adam_flat_grad_list_ op, grads a tuple (csrc/torch/ops.cpp)"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int register_op_calls(PyObject* module) { return PyModule_AddFunctions(module, kFunctions); }

}  // namespace apexlite

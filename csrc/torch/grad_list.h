// apexlite._C.GradList: the grads FusedAdam's grad check hands to apexlite::fused_adam_flat_grad_list_
// when it reads them where they are, held as C++ tensors. A tuple of Python tensors would give every
// autograd-made grad a Python object (about 100 ns a grad to make, more to free, and garbage-collector
// passes over them); this holds one reference per grad and nothing else.
#pragma once

#include <Python.h>

#include <ATen/ATen.h>

#include <vector>

namespace apexlite {

// A new GradList holding `grads` (a new reference), or nullptr with a Python error.
PyObject* make_grad_list(std::vector<at::Tensor>&& grads);

// The tensors of `object` when it is a GradList, else nullptr (no error set).
const std::vector<at::Tensor>* grad_list_tensors(PyObject* object);

// Adds the GradList type to apexlite._C; -1 with a Python error on failure.
int register_grad_list_type(PyObject* module);

}  // namespace apexlite

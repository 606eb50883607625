// Declares apexlite's operator schemas once; each backend registers its kernel in its own file
// (fused_adam_cpu.cpp, fused_adam_cuda.cpp). Also provides the module init for `import apexlite._C`.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(apexlite, m) {
  // One Adam/AdamW step over equally long tensor lists, all on one device, each list of one dtype.
  //   params:       the weights the math runs on (fp32, or fp16/bf16 without master weights)
  //   grads:        fp32, fp16 or bf16 gradients (may carry a loss scale, see grad_scale); written only
  //                 with unscale_grads and a grad_scale, on a step that is not skipped
  //   exp_avgs, exp_avg_sqs: moments, fp32 or bf16
  //   state_steps:  one float32 scalar tensor per param, advanced by one when the step is taken
  //   model_copies: empty, or fp16/bf16 tensors that receive the updated fp32 params (O2 copies)
  //   grad_scale:   optional 1-element float32 tensor holding the loss scale; grads are divided by it
  //   found_inf:    optional 1-element float32 tensor; nonzero skips the whole call (nothing changes)
  //   unscale_grads: with a grad_scale, also store grad / grad_scale into grads (torch.amp.GradScaler's
  //                 contract for optimizers that unscale inside their step)
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor(f!)[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] state_steps, Tensor(e!)[] model_copies, *, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, bool bias_correction, "
      "bool adam_w_mode, Tensor? grad_scale=None, Tensor? found_inf=None, bool unscale_grads=False) -> ()");
  // The same step over flat buffers (apexlite/optimizers/_flat_buffers.py): one 1-D tensor per role,
  // all of `param`'s length, so a whole (device, dtypes) set of params is one call and one launch.
  //   steps:       1-D float32, one counter per param of the buffer, all holding the same count;
  //                the update uses steps[0] + 1 and every counter advances by one when the step is taken
  //   model_copy:  None, or the fp16/bf16 buffer that receives the updated fp32 params
  // The other arguments are fused_adam_'s.
  m.def(
      "fused_adam_flat_(Tensor(a!) param, Tensor(f!) grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
      "Tensor(d!) steps, Tensor(e!)? model_copy, *, float lr, float beta1, float beta2, float eps, "
      "float weight_decay, bool bias_correction, bool adam_w_mode, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, bool unscale_grads=False) -> ()");
  // The same step over flat buffers whose grads stay where they are: grads[i] is the grad of elements
  // [offsets[i], offsets[i] + grads[i].numel()) of the buffers, in memory order (dense, laid out like
  // that member); the ranges come in order without overlap, and elements outside them are left as they
  // are. `offsets` is a 1-D int64 CPU tensor and `steps` holds one counter per grad. How fresh grads (autograd's, after
  // zero_grad(set_to_none=True)) are read without first copying them into a grad buffer.
  m.def(
      "fused_adam_flat_grad_list_(Tensor(a!) param, Tensor(f!)[] grads, Tensor offsets, Tensor(b!) exp_avg, "
      "Tensor(c!) exp_avg_sq, Tensor(d!) steps, Tensor(e!)? model_copy, *, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, bool bias_correction, bool adam_w_mode, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, bool unscale_grads=False) -> ()");
  // Copies each source's elements, in memory order (sources are dense, of flat's dtype and device),
  // to flat[offsets[i]:offsets[i] + numel]: how fresh grads move into a flat grad buffer in one launch.
  m.def("flat_gather_(Tensor(a!) flat, Tensor[] sources, int[] offsets) -> ()");
}

// The optimizer ops are not differentiable: autograd passes them straight to the backend kernel (torch's
// rule for such ops). Its fallback would instead box every argument and ask each tensor of a list
// whether it requires grad, about 25 ns a grad per call at 10,000 grads, only to pass the call on.
TORCH_LIBRARY_IMPL(apexlite, Autograd, m) {
  for (const char* op : {"fused_adam_", "fused_adam_flat_", "fused_adam_flat_grad_list_", "flat_gather_"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}

namespace apexlite {
namespace o1 {
int register_o1_types(PyObject* module);  // o1_cast_wrapper.cpp
}  // namespace o1
int register_flat_grad_functions(PyObject* module);  // flat_grads.cpp
int register_op_calls(PyObject* module);  // op_calls.cpp
int register_grad_list_type(PyObject* module);  // grad_list.cpp
}  // namespace apexlite

extern "C" {
// `import apexlite._C` loads this library, so that the registrations above run, and adds the native
// O1 cast types (CastCache, CastState, CastWrapper; see o1_casts.h), FusedAdam's flat-grad helpers
// (flat_grads.cpp, grad_list.cpp) and its direct op calls (op_calls.cpp).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr &&
      (apexlite::o1::register_o1_types(module) < 0 || apexlite::register_flat_grad_functions(module) < 0 ||
       apexlite::register_op_calls(module) < 0 || apexlite::register_grad_list_type(module) < 0)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

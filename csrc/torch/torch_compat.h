// Version guards: the few torch C++ APIs apexlite uses that differ across the supported torch range
// (pyproject's floor up to the newest tested release, docs/compatibility.md). Each guard keeps the
// behaviour the same on every version; tests/amp/o1/test_cache_eligibility.py (dispatch modes,
// fake tensors) runs both cast paths on each torch of the compatibility matrix.
#pragma once

#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/version.h>

#define APEXLITE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace apexlite {
namespace compat {

// True while any TorchDispatchMode is active in this thread (FakeTensorMode, make_fx, a user's mode).
// torch 2.2 added "infra" modes kept outside the mode stack and any_modes_set() to see both; torch 2.1
// keeps every mode on the stack, so its stack length alone says the same.
inline bool dispatch_modes_active() {
#if APEXLITE_TORCH_AT_LEAST(2, 2)
  return c10::impl::TorchDispatchModeTLS::any_modes_set();
#else
  return c10::impl::TorchDispatchModeTLS::stack_len() > 0;
#endif
}

}  // namespace compat
}  // namespace apexlite

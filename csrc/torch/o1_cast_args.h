// Walking the arguments of an O1-wrapped call in C++: apexlite/amp/o1/policies.py's map_tensors and
// collect_float_dtypes, with its NOTE [walking arguments]. The walk never holds a borrowed reference
// across anything that can run Python code or release the GIL: each list and dict is read once into a
// snapshot of strong references, and nesting is bounded (RecursionError, as the Python path raises).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "o1_casts.h"

namespace apexlite {
namespace o1 {

// A real Tensor (or subclass) instance: the object's type, never an overridden __class__ (a mock).
bool is_tensor(PyObject* obj);

// One wrapper call's cast: target dtype, whether weights go through the cache, and what to log.
struct Caster {
  CastStateObject* state;
  at::ScalarType dtype;
  bool use_cache;
  PyObject* name;
  mutable int depth = 0;  // containers entered by the current walk

  // `obj` (a tensor) in `dtype`; the same object when it needs no cast.
  pybind11::object tensor(PyObject* obj) const;
  // map_tensors(value, this cast): `value` itself when nothing inside it changed.
  pybind11::object map(PyObject* value) const;
};

// collect_float_dtypes over the tensors in the state's device scope, as a bit set: 1 float32, 2 float16, 4 bfloat16.
unsigned collect_float_dtypes(const CastStateObject* state, PyObject* value);

}  // namespace o1
}  // namespace apexlite

// Chunk tables: the work lists that let one launch cover many tensors whose addresses change from call to
// call. Each entry is one block's share: a run of at most `chunk` units read from a source address and
// placed at an offset of a flat buffer. Built on the host, torch-free, by the torch bindings and by the
// host emulation's entry points; handed to the device from pinned memory (csrc/torch/device_table.h).
// flat_gather_ counts its units in bytes, fused_adam_flat_grad_list_ in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace apexlite {
namespace cuda {

struct ChunkEntry {
  uint64_t source;  // address of the run's first unit
  int64_t target;   // where the run goes in the flat buffer, in units
  int64_t length;   // units in the run, at most the table's chunk
};

// Cuts each source (address, offset in the buffer, length) into runs of at most `chunk` units, in order;
// `unit_bytes` is the size of a unit, so that a run's address advances with its position.
inline std::vector<ChunkEntry> chunk_table(const uint64_t* sources, const int64_t* targets, const int64_t* lengths,
                                           int64_t count, int64_t chunk, int64_t unit_bytes) {
  std::vector<ChunkEntry> table;
  table.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t done = 0; done < lengths[i]; done += chunk) {
      const int64_t left = lengths[i] - done;
      table.push_back(ChunkEntry{sources[i] + static_cast<uint64_t>(done * unit_bytes), targets[i] + done,
                                 left < chunk ? left : chunk});
    }
  }
  return table;
}

}  // namespace cuda
}  // namespace apexlite

// The table of apexlite::flat_gather_'s CUDA kernel: each entry one block's work, a run of at most
// kGatherChunkBytes bytes copied from a source tensor's memory into the flat buffer. Built on the
// host (by the torch binding, and by the host emulation's entry point for the tests), torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace apexlite {
namespace cuda {

constexpr int64_t kGatherChunkBytes = 1 << 18;  // 256 KiB per block: 64 turns of 256 threads x 16 bytes

struct GatherEntry {
  uint64_t source;    // address of the first byte to copy
  int64_t target;     // byte offset in the flat buffer
  int64_t bytes;      // how many, at most kGatherChunkBytes
};

// Cuts each source (address, byte offset in the buffer, byte count) into chunks, in order.
inline std::vector<GatherEntry> gather_table(const uint64_t* sources, const int64_t* targets, const int64_t* bytes,
                                             int64_t count) {
  std::vector<GatherEntry> table;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t done = 0; done < bytes[i]; done += kGatherChunkBytes) {
      const int64_t left = bytes[i] - done;
      table.push_back(GatherEntry{sources[i] + static_cast<uint64_t>(done), targets[i] + done,
                                  left < kGatherChunkBytes ? left : kGatherChunkBytes});
    }
  }
  return table;
}

}  // namespace cuda
}  // namespace apexlite

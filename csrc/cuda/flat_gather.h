// The table of apexlite::flat_gather_'s CUDA kernel: a chunk table (chunk_table.h) counted in bytes, each
// entry one block's copy of at most kGatherChunkBytes bytes from a source tensor's memory into the buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "chunk_table.h"

namespace apexlite {
namespace cuda {

constexpr int64_t kGatherChunkBytes = 1 << 18;  // 256 KiB per block: 64 turns of 256 threads x 16 bytes

using GatherEntry = ChunkEntry;  // source address, target byte offset, byte count

// Cuts each source (address, byte offset in the buffer, byte count) into chunks, in order.
inline std::vector<GatherEntry> gather_table(const uint64_t* sources, const int64_t* targets, const int64_t* bytes,
                                             int64_t count) {
  return chunk_table(sources, targets, bytes, count, kGatherChunkBytes, 1);
}

}  // namespace cuda
}  // namespace apexlite

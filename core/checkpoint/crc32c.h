// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of every
// checkpoint chunk. With SSE4.2 it runs the crc32 instruction on three interleaved streams (the
// instruction has a latency of three cycles and a throughput of one), combined by precomputed
// shift tables (Mark Adler's method), which reaches memory speed; elsewhere a table per byte.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain {

// The CRC of `bytes` continuing from `crc` (0 to start): Crc32c(Crc32c(0, a), b) == CRC of a+b.
uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes);

// The table-driven version (the fallback), for tests that compare the two.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t bytes);

}  // namespace dtrain

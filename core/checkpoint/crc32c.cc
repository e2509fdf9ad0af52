#include "core/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dtrain {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // reflected 0x1EDC6F41

struct ByteTable {
  std::array<uint32_t, 256> entries;
  constexpr ByteTable() : entries() {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t crc = n;
      for (int k = 0; k < 8; ++k) crc = crc & 1 ? (crc >> 1) ^ kPolynomial : crc >> 1;
      entries[n] = crc;
    }
  }
};
constexpr ByteTable kByteTable;

#if defined(__x86_64__)

// Operators over GF(2) as 32 columns: applying `bytes` zero bytes to a CRC is linear, so three
// streams' CRCs combine as crc0 * x^(8 * len) + crc1 (Adler, crc32c.c).
uint32_t MatrixTimes(const uint32_t* matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (; vector != 0; vector >>= 1, ++matrix) {
    if (vector & 1) sum ^= *matrix;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(matrix, matrix[n]);
}

// Four byte-indexed tables that shift a CRC past `bytes` zero bytes (a power of two).
struct ShiftTables {
  uint32_t table[4][256];
  explicit ShiftTables(size_t bytes) {
    uint32_t odd[32], even[32];
    odd[0] = kPolynomial;  // one zero bit
    for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
    MatrixSquare(even, odd);  // two bits
    MatrixSquare(odd, even);  // four bits
    uint32_t* result = nullptr;
    for (size_t length = bytes;;) {
      MatrixSquare(even, odd);  // 8, 32, ... bits
      length >>= 1;
      if (length == 0) {
        result = even;
        break;
      }
      MatrixSquare(odd, even);
      length >>= 1;
      if (length == 0) {
        result = odd;
        break;
      }
    }
    for (uint32_t n = 0; n < 256; ++n) {
      for (int b = 0; b < 4; ++b) table[b][n] = MatrixTimes(result, n << (8 * b));
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
  }
};

constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

uint64_t Load64(const unsigned char* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const unsigned char* next,
                                                          size_t bytes) {
  static const ShiftTables* const long_shift = new ShiftTables(kLong);
  static const ShiftTables* const short_shift = new ShiftTables(kShort);
  uint64_t crc0 = crc ^ 0xFFFFFFFFu;
  for (; bytes > 0 && (reinterpret_cast<uintptr_t>(next) & 7) != 0; --bytes, ++next) {
    crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *next);
  }
  const auto three_way = [&](size_t block, const ShiftTables& shift) {
    while (bytes >= 3 * block) {
      uint64_t crc1 = 0, crc2 = 0;
      const unsigned char* const end = next + block;
      do {
        crc0 = _mm_crc32_u64(crc0, Load64(next));
        crc1 = _mm_crc32_u64(crc1, Load64(next + block));
        crc2 = _mm_crc32_u64(crc2, Load64(next + 2 * block));
        next += 8;
      } while (next < end);
      crc0 = shift.Shift(static_cast<uint32_t>(crc0)) ^ crc1;
      crc0 = shift.Shift(static_cast<uint32_t>(crc0)) ^ crc2;
      next += 2 * block;
      bytes -= 3 * block;
    }
  };
  three_way(kLong, *long_shift);
  three_way(kShort, *short_shift);
  for (; bytes >= 8; bytes -= 8, next += 8) crc0 = _mm_crc32_u64(crc0, Load64(next));
  for (; bytes > 0; --bytes, ++next) crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *next);
  return static_cast<uint32_t>(crc0) ^ 0xFFFFFFFFu;
}

#endif  // __x86_64__

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t bytes) {
  const auto* next = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = kByteTable.entries[(crc ^ next[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cHardware(crc, static_cast<const unsigned char*>(data), bytes);
#endif
  return Crc32cPortable(crc, data, bytes);
}

}  // namespace dtrain

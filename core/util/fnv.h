// FNV-1a, 64 bits: a small hash that is the same on every platform and build, for names that
// seed random streams and for fingerprints that ranks compare.
#pragma once

#include <cstdint>
#include <string_view>

namespace dtrain {

inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;

// Folds one 32-bit word or byte into `hash`.
constexpr uint64_t FnvMix(uint64_t hash, uint32_t value) {
  return (hash ^ value) * 0x100000001b3ULL;
}

constexpr uint64_t Fnv1a(std::string_view text) {
  uint64_t hash = kFnvOffset;
  for (const unsigned char ch : text) hash = FnvMix(hash, ch);
  return hash;
}

}  // namespace dtrain

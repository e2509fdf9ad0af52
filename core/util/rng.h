// Counter-based random numbers: every draw is a pure function of (seed, stream, counter), so any
// position of any stream is reproducible without replaying earlier draws, and results are the
// same on every platform (integer arithmetic only, except normal(), which uses the C library's
// log/cos/sqrt in double precision). Used for data order, initialisation and sampling.
// Not thread-safe: give each thread its own stream (or counter range).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace dtrain {

// The SplitMix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t SplitMix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class CounterRng {
 public:
  // Distinct streams of one seed are independent sequences (e.g. one per epoch or per tensor).
  constexpr CounterRng(uint64_t seed, uint64_t stream)
      : key_(SplitMix64(SplitMix64(seed) ^ (stream * kGamma + kStreamSalt))) {}

  // Draw number `counter` of this stream; the draws below advance counter() by one each
  // (normal() by two).
  constexpr uint64_t At(uint64_t counter) const {
    return SplitMix64(key_ + (counter + 1) * kGamma);
  }
  constexpr uint64_t next_u64() { return At(counter_++); }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0, without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t n) {
    unsigned __int128 product = static_cast<unsigned __int128>(next_u64()) * n;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        product = static_cast<unsigned __int128>(next_u64()) * n;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

  // Standard normal via Box-Muller; consumes two draws and returns the cosine branch only, so
  // the value at a counter does not depend on earlier calls.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  uint64_t counter() const { return counter_; }
  void set_counter(uint64_t counter) { counter_ = counter; }

 private:
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, odd
  static constexpr uint64_t kStreamSalt = 0x6a09e667f3bcc909ULL;

  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace dtrain

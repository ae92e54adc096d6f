#pragma once
// splitmix64's finalizer: a bijection of 64-bit integers with good avalanche, the one integer
// mixer of the library. The preflight record digests its fields with it and the command line's
// synthetic inputs are keyed by it; neither result may change, so neither keeps a copy.

#include <cstdint>

namespace detlogp::numerics {

constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace detlogp::numerics

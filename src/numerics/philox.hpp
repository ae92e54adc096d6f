#pragma once
// The sampling canon's randomness (docs/numerics.md "Sampling"): Philox4x32-10, the standard
// counter-based generator (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
// 1, 2, 3", SC 2011; the generator of cuRAND and JAX), keyed by a request's seed and counted by
// (position, vocabulary id), the uniform it gives each vocabulary id and that id's Gumbel-max
// key. Integer operations and the canon's det_log only, so every backend gets the same bits.

#include <cstdint>

#include "numerics/canon.hpp"

namespace detlogp::canon {

struct PhiloxConstants {
  static constexpr uint32_t kM0 = 0xD2511F53u;  // round multipliers
  static constexpr uint32_t kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u;  // key bumps (golden ratio, sqrt(3) - 1)
  static constexpr uint32_t kW1 = 0xBB67AE85u;
  static constexpr int kRounds = 10;
};

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32-10 of `ctr` under key (k0, k1): ten rounds, the key bumped between them. A round:
// (hi0, lo0) = M0 * c0, (hi1, lo1) = M1 * c2 (32 x 32 -> 64-bit products), then
// c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0).
DETLOGP_HD Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  using K = PhiloxConstants;
  for (int round = 0; round < K::kRounds; ++round) {
    if (round > 0) {
      k0 += K::kW0;
      k1 += K::kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(K::kM0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(K::kM1) * ctr.v[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// The generator's word for vocabulary id `id` at (seed, position): word 0 of Philox4x32-10 with
// key (seed low 32 bits, seed high 32 bits) and counter (position low 32, position high 32, id,
// 0).
DETLOGP_HD uint32_t sample_word(uint64_t seed, uint64_t position, uint32_t id) {
  const Philox4x32 out = philox4x32_10(
      Philox4x32{{static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), id, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return out.v[0];
}

// The uniform of a word x: u = (2 * (x >> 9) + 1) * 2^-24, exact in fp32, in (0, 1), never 0
// or 1.
DETLOGP_HD float uniform_of_word(uint32_t x) {
  const uint32_t odd = 2u * (x >> 9) + 1u;                  // < 2^24: exact as a float
  return static_cast<float>(odd) * 5.9604644775390625e-8f;  // 2^-24, exact
}

// The uniform of vocabulary id `id` at (seed, position).
DETLOGP_HD float sample_uniform(uint64_t seed, uint64_t position, uint32_t id) {
  return uniform_of_word(sample_word(seed, position, id));
}

// Bounds of the noise -det_log(-det_log(u)) over every u the generator gives (from -2.81 at
// u = 2^-24 to 16.64 at u = 1 - 2^-24; the unit tests check every u): a key is within
// [z + kGumbelNoiseMin, z + kGumbelNoiseMax] after rounding, so a scan may skip an id whose key
// cannot reach the best one without computing it (the bits are those of the full scan).
inline constexpr float kGumbelNoiseMin = -3.0f;
inline constexpr float kGumbelNoiseMax = 17.0f;

// The noise -det_log(-det_log(u)) is nondecreasing in x >> 9 (the unit tests check every
// value), so the noise of the last value of a bucket of consecutive x >> 9 bounds the bucket's:
// a scan may skip an id whose key, with its bucket's bound, cannot reach the best, without the
// two det_log. Buckets of 2^11 values of x >> 9: bucket x >> kNoiseBucketShift of word x.
inline constexpr int kNoiseBucketShift = 20;

// The Gumbel-max key of a scored value z with uniform u: z - det_log(-det_log(u)), fp32 (z plus
// the standard Gumbel noise -log(-log(u))). The row's token is the id of the largest key.
DETLOGP_HD float gumbel_key(float z, float u) { return z - det_log(-det_log(u)); }

}  // namespace detlogp::canon

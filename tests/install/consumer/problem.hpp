// The small problem both consumer projects score: fp32 logits over a 1000-token vocabulary
// padded to Megatron's width, deterministic pseudo-random values (no <random>: the same numbers
// on every rank and every standard library).
#pragma once

#include <cstdint>
#include <vector>

#include <detlogp/detlogp.hpp>

namespace consumer {

constexpr int64_t kRows = 6;
constexpr int64_t kReal = 1000;

inline std::vector<float> logits(int64_t padded) {
  std::vector<float> z(static_cast<std::size_t>(kRows * padded));
  uint32_t state = 12345u;
  for (float& v : z) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / 16777216.0f * 8.0f - 4.0f;  // [-4, 4)
  }
  return z;
}

inline std::vector<int64_t> targets() {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < kRows; ++i) t.push_back((i * 389 + 7) % kReal);
  return t;
}

inline detlogp::LogprobContract contract(const detlogp::VocabLayout& layout, int64_t rank) {
  return detlogp::LogprobContract({
      .role = detlogp::Role::train,
      .dtype = detlogp::DType::fp32,
      .mask = detlogp::MaskSpec::all_active(kRows),
      .sharding = detlogp::ShardingSpec(
          {.tp_rank = rank,
           .tp_world_size = static_cast<int64_t>(layout.vocab_shard_bounds.size()),
           .vocab_shard_bounds = layout.vocab_shard_bounds,
           .real_vocab_size = kReal,
           .padded_vocab_size = layout.padded_vocab_size}),
      .tile_width = 64,
  });
}

}  // namespace consumer

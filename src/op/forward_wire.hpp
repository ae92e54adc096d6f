#pragma once
// The wire format of the forward all-gather, written once. Every rank sends one block of the
// same size and block r of the gathered buffer is rank r's:
//
//   [rows][width] node partials, each (m, s) or, when entropy is requested, (m, s, u);
//                 a rank with fewer than `width` nodes pads its rows with the identity
//   [rows]        target logits z (the owner's value; +0 from ranks that do not own it)
//
// all as fp32. Deterministic mode sends every node of the rank's canonical cover (width = the
// largest cover of any rank); non-deterministic mode one folded partial per row (width 1).

#include <cstddef>
#include <cstdint>
#include <span>

#include "detlogp/numerics.hpp"
#include "numerics/canon.hpp"

namespace detlogp::op {

class ForwardWire {
 public:
  ForwardWire(int64_t rows, std::size_t width, bool entropy)
      : rows_(static_cast<std::size_t>(rows)),
        width_(width),
        floats_per_partial_(entropy ? 3 : 2) {}

  // fp32 values in one rank's block.
  std::size_t block_floats() const { return rows_ * (width_ * floats_per_partial_ + 1); }
  int64_t block_bytes() const { return static_cast<int64_t>(block_floats() * sizeof(float)); }
  std::size_t width() const { return width_; }

  // Partial j of `row` in `block` (j < width), identity where the sender had none.
  void put_partial(std::span<float> block, int64_t row, std::size_t j, const NodePartial& p) const {
    float* at = block.data() + partial_offset(row, j);
    at[0] = p.m;
    at[1] = p.s;
    if (floats_per_partial_ == 3) at[2] = p.u;
  }
  void pad_partials(std::span<float> block, int64_t row, std::size_t from) const {
    for (std::size_t j = from; j < width_; ++j)
      put_partial(block, row, j, canon::identity_partial());
  }
  NodePartial partial(std::span<const float> block, int64_t row, std::size_t j) const {
    const float* at = block.data() + partial_offset(row, j);
    return NodePartial{at[0], at[1], floats_per_partial_ == 3 ? at[2] : 0.0f};
  }

  void put_target(std::span<float> block, int64_t row, float z) const {
    block[target_offset(row)] = z;
  }
  float target(std::span<const float> block, int64_t row) const {
    return block[target_offset(row)];
  }

  // Rank r's block of a gathered buffer.
  std::span<const float> block_of(std::span<const float> gathered, int64_t rank) const {
    return gathered.subspan(static_cast<std::size_t>(rank) * block_floats(), block_floats());
  }

 private:
  std::size_t partial_offset(int64_t row, std::size_t j) const {
    return (static_cast<std::size_t>(row) * width_ + j) * floats_per_partial_;
  }
  std::size_t target_offset(int64_t row) const {
    return rows_ * width_ * floats_per_partial_ + static_cast<std::size_t>(row);
  }

  std::size_t rows_;
  std::size_t width_;
  std::size_t floats_per_partial_;
};

}  // namespace detlogp::op

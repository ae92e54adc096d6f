#pragma once
// The pieces `detlogp run` shares between the in-process and the MPI paths: the vocabulary
// layout of a TP degree, and the checks (padding gradient, float64 reference on sampled rows).

#include <cstdint>
#include <span>

#include "detlogp/detlogp.hpp"
#include "reference.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {

inline constexpr int64_t kSampleRows = 16;

// Megatron's padded vocabulary and equal shards (megatron_bounds); when those bounds are not
// multiples of the tile width, whole tiles instead (even_tile_aligned_bounds).
VocabLayout run_layout(int64_t real_vocab, int64_t tp, int64_t tile_width);

// True when columns [real, grad.cols) of every row are exactly +0.
bool padding_is_zero(const LogitsView& grad, int64_t real);

// The float64 reference on kSampleRows rows of the whole batch: logits regenerated from
// `spec`, outputs and gradient (`grad`: [tokens, >= real], any row_stride) from the operator.
Accuracy check_sampled_rows(const SyntheticSpec& spec, const SyntheticRows& rows, float temperature,
                            std::span<const float> logp, std::span<const float> lse,
                            std::span<const float> entropy, const LogitsView& grad);

}  // namespace detlogp::cli

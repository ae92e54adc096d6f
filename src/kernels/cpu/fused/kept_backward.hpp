#pragma once
// The CPU fused kernels' backward over kept sets (FusedKernels::kept_backward) (docs/numerics.md
// "Kept sets"): the canon's logit gradient g(i, c) of each row's kept columns this rank holds (one
// canonical dot each), then the fused canon's two chains over the kept columns only: grad_weight
// rows of kept ids over the tokens in increasing order (every other row +0), and per vocabulary
// tile the grad_hidden chain over the tile's kept columns in increasing column, merged into the
// sums of this rank's cover nodes by the canonical tree.

#include <cstdint>
#include <span>

#include "detlogp/kernels.hpp"

namespace detlogp::fused {

// `kept`: the resolved ids [rows, width]; `in`: as for FusedKernels::backward (grad_logp already
// +0 on inactive rows and on rows whose target is outside their set); grad_weight skipped when
// its data is null, hidden_sums (nodes.size() planes of [rows, H]) when empty.
void kept_backward(const FusedShard& shard, std::span<const int64_t> kept, int64_t width,
                   std::span<const TreeNode> nodes, const BackwardInputs& in,
                   const MutableLogitsView& grad_weight, std::span<float> hidden_sums);

}  // namespace detlogp::fused

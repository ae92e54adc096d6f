#pragma once
// The forward's exchange, after each rank computed its node partials and the target logits it
// owns, the same for every operator: pack this rank's block (op/forward_wire.hpp), one
// all-gather, every rank's nodes merged into the roots by the canonical tree, logp from the
// owner's target logit.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/kernels.hpp"
#include "op/forward_wire.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp::op {

// This rank's block: row i's `nodes` partials (local[i * nodes + j]), padded with the identity
// up to the wire's width, and its target logit target_z[i].
std::vector<float> pack_forward_block(const ForwardWire& wire, std::span<const NodePartial> local,
                                      std::size_t nodes, std::span<const float> target_z);

// Every rank's block in rank order: one all-gather (none with one rank). A transport failure
// names `step` (collective_step).
std::vector<float> all_gather_blocks(Communicator& comm, std::vector<float> send,
                                     std::string_view step);

// LSE (and entropy) of every row from every rank's cover nodes, merged by the canonical tree.
void merge_cover_roots(const ShardKernels& kernels, const TileGeometry& geometry,
                       const Covers& covers, const ForwardWire& wire,
                       std::span<const float> gathered, int64_t rows, RootsOut roots,
                       const ExecOptions& exec);

// logp = z[target] - LSE with z copied from the owner's block (never summed, so -0.0 stays
// -0.0); exactly 0 on inactive rows, NaN on an active row whose target has no owner.
std::vector<float> selected_logps(const ForwardWire& wire, std::span<const float> gathered,
                                  const TargetOwners& owners, std::span<const float> lse);

}  // namespace detlogp::op

#include "op/forward_exchange.hpp"

#include "numerics/canon.hpp"
#include "op/preflight.hpp"

namespace detlogp::op {

std::vector<float> pack_forward_block(const ForwardWire& wire, std::span<const NodePartial> local,
                                      std::size_t nodes, std::span<const float> target_z) {
  std::vector<float> send(wire.block_floats());
  for (std::size_t i = 0; i < target_z.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    for (std::size_t j = 0; j < nodes; ++j) wire.put_partial(send, row, j, local[i * nodes + j]);
    wire.pad_partials(send, row, nodes);
    wire.put_target(send, row, target_z[i]);
  }
  return send;
}

std::vector<float> all_gather_blocks(Communicator& comm, std::vector<float> send,
                                     std::string_view step) {
  if (comm.size() <= 1) return send;
  std::vector<float> recv(send.size() * static_cast<std::size_t>(comm.size()));
  collective_step(step,
                  [&] { all_gather(comm, std::span<const float>(send), std::span<float>(recv)); });
  return recv;
}

void merge_cover_roots(const ShardKernels& kernels, const TileGeometry& geometry,
                       const Covers& covers, const ForwardWire& wire,
                       std::span<const float> gathered, int64_t rows, RootsOut roots,
                       const ExecOptions& exec) {
  const std::vector<TreeNode> all_nodes = covers.all();
  std::vector<NodePartial> all(static_cast<std::size_t>(rows) * all_nodes.size());
  for (int64_t i = 0; i < rows; ++i) {
    std::size_t k = 0;
    for (std::size_t r = 0; r < covers.of_rank.size(); ++r) {
      const std::span<const float> block = wire.block_of(gathered, static_cast<int64_t>(r));
      for (std::size_t j = 0; j < covers.of_rank[r].size(); ++j) {
        all[i * all_nodes.size() + k++] = wire.partial(block, i, j);
      }
    }
  }
  kernels.merge_roots(geometry, all_nodes, all, rows, roots, exec);
}

std::vector<float> selected_logps(const ForwardWire& wire, std::span<const float> gathered,
                                  const TargetOwners& owners, std::span<const float> lse) {
  std::vector<float> logp(lse.size(), 0.0f);
  for (std::size_t i = 0; i < logp.size(); ++i) {
    if (!owners.active[i]) continue;
    if (owners.owner[i] < 0) {  // an out-of-range active target with validate=false
      logp[i] = canon::canonical_nan();
      continue;
    }
    const float z = wire.target(wire.block_of(gathered, owners.owner[i]), static_cast<int64_t>(i));
    logp[i] = canon::selected_logp(z, lse[i]);
  }
  return logp;
}

}  // namespace detlogp::op

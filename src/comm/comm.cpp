// Communicator preconditions, SelfComm and the TP x CP rank map.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"

namespace detlogp {

void Communicator::all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
  const auto n = static_cast<std::size_t>(size());
  const std::size_t bytes = send.size();
  if (bytes > std::numeric_limits<std::size_t>::max() / n || recv.size() != n * bytes) {
    throw ContractError(name() + " all_gather: recv has " + std::to_string(recv.size()) +
                        " bytes but must hold size() * send.size() = " + std::to_string(n) + " * " +
                        std::to_string(bytes) + " bytes (one block per rank, rank-major)");
  }
  bool in_place = false;
  if (bytes > 0) {
    const auto s = reinterpret_cast<std::uintptr_t>(send.data());
    const auto r = reinterpret_cast<std::uintptr_t>(recv.data());
    const std::uintptr_t own = r + static_cast<std::uintptr_t>(rank()) * bytes;
    if (s == own) {
      in_place = true;
    } else if (s < r + recv.size() && r < s + bytes) {
      throw ContractError(name() +
                          " all_gather: send overlaps recv; send must be disjoint from "
                          "recv or be exactly this rank's block of recv (in place)");
    }
  }
  do_all_gather(send, recv, in_place);
}

void SelfComm::do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             bool in_place) {
  if (!in_place && !send.empty()) std::memcpy(recv.data(), send.data(), send.size());
}

RankPlacement place_rank(int world_rank, int world_size, int tp, int cp) {
  if (tp < 1 || cp < 1) {
    throw ContractError("rank map: tp and cp must be >= 1; got tp=" + std::to_string(tp) +
                        ", cp=" + std::to_string(cp));
  }
  if (world_size < 1 || static_cast<long long>(tp) * cp > world_size ||
      world_size % (tp * cp) != 0) {
    throw ContractError("world size " + std::to_string(world_size) +
                        " does not match TP*CP = " + std::to_string(tp) + "*" + std::to_string(cp) +
                        " (it must equal TP*CP, or a multiple of it for data-parallel replicas)");
  }
  if (world_rank < 0 || world_rank >= world_size) {
    throw ContractError("rank map: world rank " + std::to_string(world_rank) + " is outside [0, " +
                        std::to_string(world_size) + ")");
  }
  RankPlacement p;
  p.tp = tp;
  p.cp = cp;
  p.dp = world_size / (tp * cp);
  p.tp_rank = world_rank % tp;
  p.cp_rank = (world_rank / tp) % cp;
  p.dp_rank = world_rank / (tp * cp);
  p.tp_group_first = world_rank - p.tp_rank;
  p.cp_group_first = p.dp_rank * tp * cp + p.tp_rank;
  return p;
}

}  // namespace detlogp

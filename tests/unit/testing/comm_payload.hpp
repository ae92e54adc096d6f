#pragma once
// The bytes each rank sends in the communicator tests (in-process and MPI alike): distinct per
// collective, rank and position, so that a gathered buffer shows any block out of place.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "detlogp/comm.hpp"

namespace detlogp::testing {

// Byte i of rank r's payload in collective number `round`: distinct per (round, rank, i).
inline std::byte payload_byte(int round, int rank, std::size_t i) {
  return static_cast<std::byte>((round * 131 + rank * 31 + static_cast<int>(i) * 7 + 1) & 0xff);
}

inline std::vector<std::byte> payload(int round, int rank, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = payload_byte(round, rank, i);
  return v;
}

// An in-place all_gather of `bytes` per rank: this rank's payload for `round` is written into its
// own block of a buffer (the rest 0xEE), that block is the send span, and the whole buffer is the
// receive span. Returns the gathered buffer.
inline std::vector<std::byte> all_gather_in_place(Communicator& c, int round, std::size_t bytes) {
  std::vector<std::byte> buf(bytes * static_cast<std::size_t>(c.size()), std::byte{0xEE});
  const std::vector<std::byte> mine = payload(round, c.rank(), bytes);
  const std::size_t at = static_cast<std::size_t>(c.rank()) * bytes;
  std::copy(mine.begin(), mine.end(), buf.begin() + static_cast<std::ptrdiff_t>(at));
  std::span<std::byte> all(buf);
  c.all_gather(all.subspan(at, bytes), all);
  return buf;
}

}  // namespace detlogp::testing

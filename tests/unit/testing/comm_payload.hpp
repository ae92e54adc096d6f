#pragma once
// The bytes each rank sends in the communicator tests (in-process and MPI alike): distinct per
// collective, rank and position, so that a gathered buffer shows any block out of place.

#include <cstddef>
#include <vector>

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

}  // namespace detlogp::testing

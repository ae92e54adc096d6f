#include "op/preflight.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "detlogp/errors.hpp"

namespace detlogp::op {
namespace {

// Fixed-size text fields are NUL-padded; a longer value is cut, which can only make two
// different long ids look equal if they share their first 127 bytes.
template <std::size_t N>
void put_text(std::array<char, N>& field, const std::string& text) {
  field.fill('\0');
  std::memcpy(field.data(), text.data(), std::min(text.size(), N - 1));
}

template <std::size_t N>
std::string get_text(const std::array<char, N>& field) {
  return std::string(field.data(), strnlen(field.data(), N));
}

// The wire record. Plain bytes, same layout on every rank (ranks run the same build).
struct Record {
  std::array<char, 72> fingerprint;
  std::array<char, 128> backend_id;
  std::array<char, 48> numerics_version;
  int64_t tile_width;
  int64_t local_begin;
  int64_t local_end;
  int64_t rows;
  uint8_t deterministic;
  uint8_t entropy;
  uint8_t local_ok;
  std::array<char, 509> local_error;
};
static_assert(std::is_trivially_copyable_v<Record>);

Record encode(const PreflightFacts& f) {
  Record r{};
  put_text(r.fingerprint, f.fingerprint);
  put_text(r.backend_id, f.backend_id);
  put_text(r.numerics_version, f.numerics_version);
  r.tile_width = f.tile_width;
  r.local_begin = f.local_begin;
  r.local_end = f.local_end;
  r.rows = f.rows;
  r.deterministic = f.deterministic ? 1 : 0;
  r.entropy = f.entropy ? 1 : 0;
  r.local_ok = f.local_error ? 0 : 1;
  put_text(r.local_error, f.local_error.value_or(""));
  return r;
}

struct Field {
  const char* name;
  std::string (*show)(const Record&);
};

const Field kAgreedFields[] = {
    {"contract fingerprint", [](const Record& r) { return get_text(r.fingerprint); }},
    {"backend id", [](const Record& r) { return get_text(r.backend_id); }},
    {"numerics version", [](const Record& r) { return get_text(r.numerics_version); }},
    {"deterministic",
     [](const Record& r) { return std::string(r.deterministic ? "true" : "false"); }},
    {"entropy", [](const Record& r) { return std::string(r.entropy ? "true" : "false"); }},
    {"tile width", [](const Record& r) { return std::to_string(r.tile_width); }},
    {"row count", [](const Record& r) { return std::to_string(r.rows); }},
};

constexpr const char* kAgreeOn =
    "all TP ranks must agree on the contract fingerprint, backend id, numerics version, "
    "deterministic mode, entropy flag, tile width and row count before any collective";

}  // namespace

int64_t preflight_record_bytes() { return static_cast<int64_t>(sizeof(Record)); }

void run_preflight(Communicator& comm, const PreflightFacts& mine) {
  const Record own = encode(mine);
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  all_gather(comm, std::span<const Record>(&own, 1), std::span<Record>(all));

  // Every rank walks the same records in the same order, so every rank reaches the same
  // verdict and throws the same message (except the failing rank, which keeps its own).
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].local_ok) {
      if (static_cast<int>(r) == comm.rank()) throw ContractError(*mine.local_error);
      throw ContractError(
          fmt::format("cross-rank preflight failed: rank {} failed local validation: {}", r,
                      get_text(all[r].local_error)));
    }
  }
  for (const Field& field : kAgreedFields) {
    const std::string first = field.show(all[0]);
    for (std::size_t r = 1; r < all.size(); ++r) {
      const std::string other = field.show(all[r]);
      if (other != first) {
        throw ContractError(
            fmt::format("cross-rank preflight failed: rank 0 has {} {} but rank {} has {}; {}",
                        field.name, first, r, other, kAgreeOn));
      }
    }
  }
  // Local ranges must tile the vocabulary in rank order (the fingerprint covers the bounds;
  // this catches a rank that passed a shard other than the one its contract names).
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].local_begin != all[r - 1].local_end) {
      throw ContractError(fmt::format(
          "cross-rank preflight failed: rank {} has local range [{}, {}) but rank {} ends at {}; "
          "ranks must hold contiguous shards in rank order",
          r, all[r].local_begin, all[r].local_end, r - 1, all[r - 1].local_end));
    }
  }
}

}  // namespace detlogp::op

#pragma once
// The preflight's fixed-size wire record and its comparison. Besides the contract fingerprint
// the record carries each part of the contract separately (a short value or digest per part)
// and a digest of the active targets, so that a mismatch names the part that differs and
// shows both ranks' values instead of two opaque fingerprints. It stays one fixed-size
// all-gather: every field has a fixed width.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "op/preflight.hpp"

namespace detlogp::op {

// The contract parts compared one by one, in the order a mismatch is looked for.
inline constexpr std::array<const char*, 8> kContractPartNames = {
    "role", "dtype", "mask", "sharding", "reduction", "output", "temperature", "softcap"};

inline constexpr std::size_t kPartBytes = 168;  // one part's value text, NUL-padded

struct PreflightRecord {
  std::array<char, 24> phase;  // the call (forward, fused forward, fused backward)
  std::array<char, 72> fingerprint;
  std::array<char, 128> backend_id;
  std::array<char, 48> numerics_version;
  std::array<std::array<char, kPartBytes>, kContractPartNames.size()> parts;
  std::array<char, 40> targets_digest;
  std::array<char, 40> row_temperature_digest;  // empty text: no per-row temperatures
  std::array<char, 48> kept_digest;             // empty text: no kept sets
  std::array<char, 40> top_k_digest;            // empty text: no top_k
  std::array<char, 40> top_p_digest;            // empty text: no top_p
  std::array<char, 40> seeds_digest;            // empty text: no seeds (not a sampler call)
  std::array<char, 40> positions_digest;        // empty text: no positions
  std::array<char, 64> rows_layout;
  int64_t tile_width;
  int64_t local_begin;
  int64_t local_end;
  int64_t rows;
  int64_t num_logprobs;
  uint8_t deterministic;
  uint8_t entropy;
  uint8_t local_ok;
  uint8_t has_contract;  // 0 for a rank that only reports its local error
  std::array<char, 508> local_error;
};
static_assert(std::is_trivially_copyable_v<PreflightRecord>);

// The per-part values of a contract, in kContractPartNames order. Short values appear as
// they are (dtype, temperature, ...); long ones as a summary plus a SHA-256 prefix.
std::array<std::string, kContractPartNames.size()> contract_parts(const LogprobContract& c);

// A 128-bit digest (32 hex digits) of the targets of the active rows, in row order (inactive
// rows may hold anything, so they do not count). Cheap: one pass, no allocation.
std::string targets_digest(std::span<const int64_t> targets, const std::vector<bool>& active);

// A 128-bit digest (32 hex digits) of per-row temperatures (every row, in row order, by their
// bits); empty for none.
std::string row_temperature_digest(std::span<const float> row_temperature);

// A digest of kept sets: 32 hex digits of each row's set (whatever the order of its ids and the
// padding), then the outside mode and the empty-row mode ("empty": error, "full": the full
// vocabulary); empty for none.
std::string kept_digest(const KeptSetOptions& kept);

// 128-bit digests (32 hex digits) of per-row top_k and top_p values (every row, in row order,
// by their bits); empty for none.
std::string top_k_digest(std::span<const int32_t> top_k);
std::string top_p_digest(std::span<const float> top_p);

// 128-bit digests (32 hex digits) of the sampler's per-row seeds and positions (every row, in
// row order, by their bits); empty for none.
std::string seeds_digest(std::span<const int64_t> seeds);
std::string positions_digest(std::span<const int64_t> positions);

PreflightRecord encode_record(const PreflightFacts& facts);

// The text after "cross-rank preflight failed: " when the ranks are in different calls (one in
// forward, another in backward), else nullopt. Records without a phase are skipped. Checked
// first.
std::optional<std::string> phase_disagreement(std::span<const PreflightRecord> all);

// The text after "cross-rank preflight failed: " when the ranks' rows layouts differ (their
// row i is not the same token), else nullopt. Checked before first_disagreement.
std::optional<std::string> layout_disagreement(std::span<const PreflightRecord> all);

// The first disagreement between the records (all ranks' records, in rank order) as the
// text after "cross-rank preflight failed: ", or nullopt when they agree. Every rank calls it
// on the same records and so gets the same text. Local errors are not looked at here.
std::optional<std::string> first_disagreement(std::span<const PreflightRecord> all);

// The text after "cross-rank preflight failed: " when the ranks' per-row temperatures differ
// (or some pass them and others do not), else nullopt. Checked after first_disagreement.
std::optional<std::string> row_temperature_disagreement(std::span<const PreflightRecord> all);

// The text after "cross-rank preflight failed: " when the ranks' kept sets differ (or some pass
// them and others do not), else nullopt. Checked after row_temperature_disagreement.
std::optional<std::string> kept_disagreement(std::span<const PreflightRecord> all);

// The text after "cross-rank preflight failed: " when the ranks' top_k (`field` "top_k") or
// top_p ("top_p") values differ (or some pass them and others do not), else nullopt. Checked
// after kept_disagreement.
std::optional<std::string> kept_selection_disagreement(std::span<const PreflightRecord> all,
                                                       std::string_view field);

// The text after "cross-rank preflight failed: " when the ranks' sampler inputs differ:
// `field` "seeds", "positions" or "num_logprobs"; else nullopt. Checked last.
std::optional<std::string> sample_disagreement(std::span<const PreflightRecord> all,
                                               std::string_view field);

}  // namespace detlogp::op

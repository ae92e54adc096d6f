#include "op/preflight_record.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <type_traits>

#include <fmt/format.h>

#include "contract/contract_json.hpp"
#include "numerics/mix64.hpp"

namespace detlogp::op {
namespace {

// Fixed-size text fields are NUL-padded; a longer value is cut, which can only make two
// different long values look equal if they share their first N-1 bytes (long parts are
// summaries with a digest well inside that limit).
template <std::size_t N>
void put_text(std::array<char, N>& field, const std::string& text) {
  field.fill('\0');
  std::memcpy(field.data(), text.data(), std::min(text.size(), N - 1));
}

template <std::size_t N>
std::string get_text(const std::array<char, N>& field) {
  return std::string(field.data(), strnlen(field.data(), N));
}

std::string short_sha(std::string_view bytes) { return sha256_hex(bytes).substr(0, 16); }

using numerics::mix64;

struct Field {
  const char* name;
  std::string (*show)(const PreflightRecord&);
};

// Checked after the row count and the contract parts; the fingerprint last, as the catch-all
// for a contract difference no part shows.
const Field kAgreedFields[] = {
    {"deterministic mode",
     [](const PreflightRecord& r) { return std::string(r.deterministic ? "true" : "false"); }},
    {"tile width", [](const PreflightRecord& r) { return std::to_string(r.tile_width); }},
    {"entropy", [](const PreflightRecord& r) { return std::string(r.entropy ? "true" : "false"); }},
    {"backend id", [](const PreflightRecord& r) { return get_text(r.backend_id); }},
    {"numerics version", [](const PreflightRecord& r) { return get_text(r.numerics_version); }},
    {"contract fingerprint", [](const PreflightRecord& r) { return get_text(r.fingerprint); }},
};

constexpr const char* kAgreeOn =
    "all TP ranks must agree on the row count, the contract (role, dtype, mask, sharding, "
    "reduction, output, temperature, softcap), deterministic mode, tile width, entropy flag, "
    "backend "
    "id, numerics version, the active targets, the per-row temperatures, the kept sets, the "
    "per-row top_k and top_p and the sampler's seeds, positions and num_logprobs before any "
    "collective";

std::optional<std::string> compare(const char* name, std::span<const PreflightRecord> all,
                                   const std::function<std::string(const PreflightRecord&)>& show) {
  const std::string first = show(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::string other = show(all[r]);
    if (other != first) {
      return fmt::format("ranks disagree on the {}: rank 0 has {} {} but rank {} has {} {}; {}",
                         name, name, first, r, name, other, kAgreeOn);
    }
  }
  return std::nullopt;
}

}  // namespace

std::array<std::string, kContractPartNames.size()> contract_parts(const LogprobContract& c) {
  const MaskSpec& m = c.mask();
  const ShardingSpec& s = c.sharding();
  const ReductionSpec& r = c.reduction();
  const OutputSpec& o = c.output();
  std::string bounds;
  for (const VocabRange& b : s.vocab_shard_bounds())
    bounds += fmt::format("{},{};", b.start, b.end);
  return {
      std::string(to_string(c.role())),
      std::string(to_string(c.dtype())),
      fmt::format("(num_tokens={} active={} ignore_index={} sha256={})", m.num_tokens(),
                  m.active_token_count(), m.ignore_index(), m.active_mask_sha256().substr(0, 16)),
      fmt::format("(tp_world_size={} cp_world_size={} real_vocab_size={} padded_vocab_size={} "
                  "bounds sha256={})",
                  s.tp_world_size(), s.cp_world_size(), s.real_vocab_size(), s.padded_vocab_size(),
                  short_sha(bounds)),
      fmt::format("({}/{}/{}/{}/{}/{}/{}/{})", to_string(r.merge()), to_string(r.merge_axis()),
                  to_string(r.acc_dtype()), to_string(r.order()), to_string(r.transport()),
                  to_string(r.downcast_at()), to_string(r.engine()),
                  to_string(r.determinism_scope())),
      fmt::format("({}/{}/{} export_lse={})", to_string(o.selected_logp_dtype()),
                  to_string(o.lse_dtype()), to_string(o.tp_placement()), c.export_lse()),
      python_float_repr(static_cast<double>(c.temperature())),
      c.softcap() ? python_float_repr(static_cast<double>(*c.softcap())) : std::string("None"),
  };
}

std::string targets_digest(std::span<const int64_t> targets, const std::vector<bool>& active) {
  // Two independent sums of mixed (row, target) pairs: order-sensitive through the row index,
  // and the loop has no carried dependency other than the sums.
  uint64_t a = 0, b = 0;
  const std::size_t n = std::min(targets.size(), active.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    const uint64_t t = static_cast<uint64_t>(targets[i]);
    a += mix64(t ^ mix64(i + 0x9e3779b97f4a7c15ULL));
    b += mix64(t + mix64(i ^ 0xd1b54a32d192ed03ULL) * 3);
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

namespace {

// A 128-bit digest of 32-bit per-row values (every row, in row order, by their bits).
template <class T>
std::string per_row_digest(std::span<const T> values) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  if (values.empty()) return {};
  uint64_t a = 0, b = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint64_t t = std::bit_cast<Bits>(values[i]);
    a += mix64(t ^ mix64(i + 0x9e3779b97f4a7c15ULL));
    b += mix64(t + mix64(i ^ 0xd1b54a32d192ed03ULL) * 3);
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

}  // namespace

std::string row_temperature_digest(std::span<const float> row_temperature) {
  return per_row_digest(row_temperature);
}

std::string top_k_digest(std::span<const int32_t> top_k) { return per_row_digest(top_k); }

std::string top_p_digest(std::span<const float> top_p) { return per_row_digest(top_p); }

std::string seeds_digest(std::span<const int64_t> seeds) { return per_row_digest(seeds); }

std::string positions_digest(std::span<const int64_t> positions) {
  return per_row_digest(positions);
}

std::string kept_digest(const KeptSetOptions& kept) {
  if (!kept.given()) return {};
  // Per row a sum over its ids (-1 skipped): the same for any order of a row's ids, different
  // for another set in the row.
  uint64_t a = 0, b = 0;
  const std::size_t width = kept.width > 0 ? static_cast<std::size_t>(kept.width) : 1;
  for (std::size_t k = 0; k < kept.ids.size(); ++k) {
    if (kept.ids[k] == -1) continue;
    const auto t = static_cast<uint64_t>(kept.ids[k]);
    const uint64_t row = k / width;
    a += mix64(t ^ mix64(row + 0x9e3779b97f4a7c15ULL));
    b += mix64(t + mix64(row ^ 0xd1b54a32d192ed03ULL) * 3);
  }
  return fmt::format("{:016x}{:016x} {} {}", a, b,
                     kept.outside == OutsideKept::error ? "error" : "neg_inf",
                     kept.empty_rows == EmptyKeptRow::error ? "empty" : "full");
}

PreflightRecord encode_record(const PreflightFacts& f) {
  PreflightRecord r{};
  put_text(r.phase, std::string(f.phase));
  put_text(r.fingerprint, f.fingerprint);
  put_text(r.backend_id, f.backend_id);
  put_text(r.numerics_version, f.numerics_version);
  for (auto& part : r.parts) part.fill('\0');
  if (f.contract != nullptr) {
    const auto parts = contract_parts(*f.contract);
    for (std::size_t i = 0; i < parts.size(); ++i) put_text(r.parts[i], parts[i]);
    put_text(r.targets_digest, targets_digest(f.targets, f.contract->mask().active_mask()));
    r.has_contract = 1;
  }
  put_text(r.row_temperature_digest, row_temperature_digest(f.row_temperature));
  put_text(r.kept_digest, kept_digest(f.kept));
  put_text(r.top_k_digest, top_k_digest(f.top_k));
  put_text(r.top_p_digest, top_p_digest(f.top_p));
  put_text(r.seeds_digest, seeds_digest(f.seeds));
  put_text(r.positions_digest, positions_digest(f.positions));
  r.num_logprobs = f.num_logprobs;
  r.tile_width = f.tile_width;
  r.local_begin = f.local_begin;
  r.local_end = f.local_end;
  r.rows = f.rows;
  put_text(r.rows_layout, f.rows_layout);
  r.deterministic = f.deterministic ? 1 : 0;
  r.entropy = f.entropy ? 1 : 0;
  r.local_ok = f.local_error ? 0 : 1;
  put_text(r.local_error, f.local_error.value_or(""));
  return r;
}

std::optional<std::string> layout_disagreement(std::span<const PreflightRecord> all) {
  const auto show = [](const PreflightRecord& r) {
    const std::string layout = get_text(r.rows_layout);
    return layout.empty() ? std::string("(rows are the tokens in order)") : layout;
  };
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].rows_layout != all[0].rows_layout) {
      return fmt::format(
          "ranks disagree on the rows layout: rank 0 has rows layout {} but rank {} has rows "
          "layout {}; row i must be the same token on every rank (the logits of the ranks are "
          "laid out differently in memory: pass them in one layout, or contiguous)",
          show(all[0]), r, show(all[r]));
    }
  }
  return std::nullopt;
}

std::optional<std::string> phase_disagreement(std::span<const PreflightRecord> all) {
  // A record without a phase (a rank with no tokens, which joins whichever call its peers
  // make) is compared by the other fields only.
  std::optional<std::size_t> first;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (get_text(all[r].phase).empty()) continue;
    if (!first) {
      first = r;
    } else if (get_text(all[r].phase) != get_text(all[*first].phase)) {
      return fmt::format(
          "ranks are in different calls: rank {} is in {} but rank {} is in {}; every TP rank "
          "must make the same operator calls in the same order (forward with forward, backward "
          "with backward)",
          *first, get_text(all[*first].phase), r, get_text(all[r].phase));
    }
  }
  return std::nullopt;
}

std::optional<std::string> first_disagreement(std::span<const PreflightRecord> all) {
  if (all.size() < 2) return std::nullopt;
  if (auto d = compare("row count", all,
                       [](const PreflightRecord& r) { return std::to_string(r.rows); })) {
    return d;
  }
  for (std::size_t p = 0; p < kContractPartNames.size(); ++p) {
    if (auto d = compare(kContractPartNames[p], all,
                         [p](const PreflightRecord& r) { return get_text(r.parts[p]); })) {
      return d;
    }
  }
  for (const Field& field : kAgreedFields) {
    if (auto d = compare(field.name, all, field.show)) return d;
  }
  if (auto d = compare("targets", all, [](const PreflightRecord& r) {
        return "digest " + get_text(r.targets_digest) + " (active rows)";
      })) {
    return d;
  }
  return std::nullopt;
}

std::optional<std::string> row_temperature_disagreement(std::span<const PreflightRecord> all) {
  if (all.size() < 2) return std::nullopt;
  return compare("per-row temperatures", all, [](const PreflightRecord& r) {
    const std::string digest = get_text(r.row_temperature_digest);
    return digest.empty() ? std::string("none") : "digest " + digest;
  });
}

std::optional<std::string> kept_disagreement(std::span<const PreflightRecord> all) {
  if (all.size() < 2) return std::nullopt;
  return compare("kept sets", all, [](const PreflightRecord& r) {
    const std::string digest = get_text(r.kept_digest);
    return digest.empty() ? std::string("none") : "digest " + digest;
  });
}

std::optional<std::string> kept_selection_disagreement(std::span<const PreflightRecord> all,
                                                       std::string_view field) {
  if (all.size() < 2) return std::nullopt;
  const bool k = field == "top_k";
  return compare(k ? "top_k values" : "top_p values", all, [k](const PreflightRecord& r) {
    const std::string digest = get_text(k ? r.top_k_digest : r.top_p_digest);
    return digest.empty() ? std::string("none") : "digest " + digest;
  });
}

std::optional<std::string> sample_disagreement(std::span<const PreflightRecord> all,
                                               std::string_view field) {
  if (all.size() < 2) return std::nullopt;
  if (field == "num_logprobs") {
    return compare("num_logprobs", all,
                   [](const PreflightRecord& r) { return std::to_string(r.num_logprobs); });
  }
  const bool seeds = field == "seeds";
  return compare(seeds ? "seeds" : "positions", all, [seeds](const PreflightRecord& r) {
    const std::string digest = get_text(seeds ? r.seeds_digest : r.positions_digest);
    return digest.empty() ? std::string("none") : "digest " + digest;
  });
}

}  // namespace detlogp::op

// The logprob contract types: validation, derived values, JSON and fingerprint.

#include "detlogp/contract.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "contract/contract_json.hpp"
#include "detlogp/version.hpp"

namespace detlogp {
namespace {

void require_positive(int64_t value, std::string_view field) {
  if (value <= 0) {
    throw ContractError(ErrorCode::out_of_range, field,
                        fmt::format("{} must be a positive integer; got {}", field, value));
  }
}

void require_non_negative(int64_t value, std::string_view field) {
  if (value < 0) {
    throw ContractError(ErrorCode::out_of_range, field,
                        fmt::format("{} must be a non-negative integer; got {}", field, value));
  }
}

// A process's rank in a group of `world` processes (TP or CP): world > 0, 0 <= rank < world.
void require_rank_in_group(int64_t rank, std::string_view rank_field, int64_t world,
                           std::string_view world_field) {
  require_positive(world, world_field);
  require_non_negative(rank, rank_field);
  if (rank >= world) {
    throw ContractError(
        ErrorCode::conflicting_fields, rank_field,
        fmt::format("{}={} must be smaller than {}={}", rank_field, rank, world_field, world));
  }
}

// Shortest round-trip text of a float ("0.7", "1", "nan", "-inf") for messages.
std::string float_text(float value) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardingSpec

ShardingSpec::ShardingSpec(const ShardingParams& p)
    : tp_rank_(p.tp_rank.value),
      tp_world_size_(p.tp_world_size),
      bounds_(p.vocab_shard_bounds),
      real_vocab_size_(p.real_vocab_size),
      padded_vocab_size_(p.padded_vocab_size),
      cp_rank_(p.cp_rank),
      cp_world_size_(p.cp_world_size) {
  require_rank_in_group(tp_rank_, "tp_rank", tp_world_size_, "tp_world_size");
  require_rank_in_group(cp_rank_, "cp_rank", cp_world_size_, "cp_world_size");
  require_positive(real_vocab_size_, "real_vocab_size");
  require_positive(padded_vocab_size_, "padded_vocab_size");
  if (padded_vocab_size_ < real_vocab_size_) {
    throw ContractError(
        ErrorCode::conflicting_fields, "padded_vocab_size",
        fmt::format("padded_vocab_size={} must not be smaller than real_vocab_size={}",
                    padded_vocab_size_, real_vocab_size_));
  }
  if (static_cast<int64_t>(bounds_.size()) != tp_world_size_) {
    throw ContractError(ErrorCode::bad_shard_bounds, "vocab_shard_bounds",
                        fmt::format("vocab_shard_bounds must contain exactly one (start, end) pair "
                                    "per TP rank; got {} pairs for tp_world_size={}",
                                    bounds_.size(), tp_world_size_));
  }
  int64_t expected_start = 0;
  for (std::size_t r = 0; r < bounds_.size(); ++r) {
    const auto [start, end] = bounds_[r];
    if (end < start) {  // end == start: a rank that holds no columns
      throw ContractError(
          ErrorCode::bad_shard_bounds, "vocab_shard_bounds",
          fmt::format("vocab_shard_bounds[{}] must satisfy end >= start; got [{}, {})", r, start,
                      end));
    }
    if (start != expected_start) {
      throw ContractError(
          ErrorCode::bad_shard_bounds, "vocab_shard_bounds",
          fmt::format(
              "vocab_shard_bounds must form a contiguous [0, padded_vocab_size) partition in "
              "TP-rank order; rank {} starts at {}, expected {}",
              r, start, expected_start));
    }
    expected_start = end;
  }
  if (expected_start != padded_vocab_size_) {
    throw ContractError(
        ErrorCode::bad_shard_bounds, "vocab_shard_bounds",
        fmt::format(
            "vocab_shard_bounds must cover padded_vocab_size exactly; covered {}, declared {}",
            expected_start, padded_vocab_size_));
  }
}

int64_t ShardingSpec::owner_rank(int64_t token_id) const {
  if (token_id < 0 || token_id >= real_vocab_size_) {
    throw ContractError(
        ErrorCode::token_out_of_vocab, "token_id",
        fmt::format(
            "token_id={} is outside the real vocabulary [0, {}); mask it as inactive instead",
            token_id, real_vocab_size_));
  }
  // The last shard whose start is <= token_id (the bounds are a contiguous partition).
  const auto it = std::upper_bound(bounds_.begin(), bounds_.end(), token_id,
                                   [](int64_t t, const VocabRange& b) { return t < b.start; });
  return static_cast<int64_t>(it - bounds_.begin()) - 1;
}

// ---------------------------------------------------------------------------------------------
// MaskSpec

MaskSpec::MaskSpec(const MaskParams& p)
    : num_tokens_(p.num_tokens), active_mask_(p.active_mask), ignore_index_(p.ignore_index) {
  require_positive(num_tokens_, "num_tokens");
  if (static_cast<int64_t>(active_mask_.size()) != num_tokens_) {
    throw ContractError(ErrorCode::wrong_shape, "active_mask",
                        fmt::format("active_mask must contain exactly one entry per token; got {} "
                                    "entries for num_tokens={}",
                                    active_mask_.size(), num_tokens_));
  }
  std::string bytes(active_mask_.size(), '\0');
  active_token_count_ = 0;
  for (std::size_t i = 0; i < active_mask_.size(); ++i) {
    if (active_mask_[i]) {
      bytes[i] = '\x01';
      ++active_token_count_;
    }
  }
  active_mask_sha256_ = sha256_hex(bytes);
}

MaskSpec MaskSpec::all_active(int64_t num_tokens, int64_t ignore_index) {
  require_positive(num_tokens, "num_tokens");
  return MaskSpec({.num_tokens = num_tokens,
                   .active_mask = std::vector<bool>(static_cast<std::size_t>(num_tokens), true),
                   .ignore_index = ignore_index});
}

// ---------------------------------------------------------------------------------------------
// ReductionSpec, OutputSpec

ReductionSpec::ReductionSpec() : ReductionSpec(ReductionParams{}) {}

ReductionSpec::ReductionSpec(const ReductionParams& p) : p_(p) {
  check_enum(p_.merge, "merge");
  check_enum(p_.merge_axis, "merge_axis");
  check_enum(p_.acc_dtype, "acc_dtype");
  check_enum(p_.order, "order");
  check_enum(p_.transport, "transport");
  check_enum(p_.downcast_at, "downcast_at");
  check_enum(p_.engine, "engine");
  check_enum(p_.determinism_scope, "determinism_scope");
  if (p_.acc_dtype != DType::fp32) {
    throw ContractError(
        ErrorCode::unsupported_value, "acc_dtype",
        fmt::format("TP logprob accumulation must be fp32; got {}", to_string(p_.acc_dtype)));
  }
}

OutputSpec::OutputSpec() : OutputSpec(OutputParams{}) {}

OutputSpec::OutputSpec(const OutputParams& p) : p_(p) {
  check_enum(p_.selected_logp_dtype, "selected_logp_dtype");
  check_enum(p_.lse_dtype, "lse_dtype");
  check_enum(p_.tp_placement, "tp_placement");
  if (p_.selected_logp_dtype != DType::fp32) {
    throw ContractError(ErrorCode::unsupported_value, "selected_logp_dtype",
                        fmt::format("selected logprob output must be fp32; got {}",
                                    to_string(p_.selected_logp_dtype)));
  }
  if (p_.lse_dtype != DType::fp32) {
    throw ContractError(
        ErrorCode::unsupported_value, "lse_dtype",
        fmt::format("vocab LSE output must be fp32; got {}", to_string(p_.lse_dtype)));
  }
}

// ---------------------------------------------------------------------------------------------
// LogprobContract

LogprobContract::LogprobContract(const ContractParams& p)
    : role_(p.role.value),
      dtype_(p.dtype.value),
      mask_(p.mask),
      sharding_(p.sharding),
      reduction_(p.reduction),
      output_(p.output),
      export_lse_(p.export_lse),
      temperature_(p.temperature),
      softcap_(p.softcap),
      tile_width_(kDefaultTileWidth) {
  check_enum(role_, "role");
  check_enum(dtype_, "dtype");
  if (!export_lse_) {
    throw ContractError(
        ErrorCode::unsupported_value, "export_lse",
        "export_lse must be True: the vocab-parallel contract always exports the vocab-domain "
        "LSE (for drift checks)");
  }
  const int64_t ignore_index = mask_.ignore_index();
  const int64_t real = sharding_.real_vocab_size();
  if (ignore_index >= 0 && ignore_index < real) {
    throw ContractError(
        ErrorCode::conflicting_fields, "ignore_index",
        fmt::format("ignore_index={} must not collide with the real vocabulary [0, {})",
                    ignore_index, real));
  }
  if (p.tile_width) {
    require_positive(*p.tile_width, "tile_width");
    // No vocabulary comes near 2^31 columns; the bound keeps every tile and column index
    // product far from int64 overflow.
    if (*p.tile_width > kMaxTileWidth) {
      throw ContractError(
          ErrorCode::out_of_range, "tile_width",
          fmt::format("tile_width must be at most {}; got {}", kMaxTileWidth, *p.tile_width));
    }
    tile_width_ = *p.tile_width;
  }
  if (p.num_vocab_tiles) {
    const int64_t n = *p.num_vocab_tiles;
    const int64_t padded = sharding_.padded_vocab_size();
    require_positive(n, "num_vocab_tiles");
    if (padded % n != 0) {
      throw ContractError(
          ErrorCode::conflicting_fields, "num_vocab_tiles",
          fmt::format("num_vocab_tiles={} must divide padded_vocab_size={} exactly", n, padded));
    }
    if (p.tile_width && *p.tile_width != padded / n) {
      throw ContractError(
          ErrorCode::conflicting_fields, "tile_width",
          fmt::format(
              "tile_width={} disagrees with num_vocab_tiles={} (padded_vocab_size={} / {} = {}); "
              "give only one of them",
              *p.tile_width, n, padded, n, padded / n));
    }
    tile_width_ = padded / n;
  }
  if (!std::isfinite(temperature_) || !(temperature_ > 0.0f)) {
    throw ContractError(
        ErrorCode::out_of_range, "temperature",
        fmt::format("temperature must be a finite number > 0; got {}", float_text(temperature_)));
  }
  if (softcap_ && (!std::isfinite(*softcap_) || !(*softcap_ > 0.0f))) {
    throw ContractError(
        ErrorCode::out_of_range, "softcap",
        fmt::format("softcap must be a finite number > 0 (or absent for no cap); got {}",
                    float_text(*softcap_)));
  }
}

std::string_view LogprobContract::numerics_version() const { return kNumericsVersion; }

std::optional<std::string> tile_alignment_problem(const LogprobContract& contract) {
  const ShardingSpec& s = contract.sharding();
  const int64_t w = contract.tile_width();
  const auto& bounds = s.vocab_shard_bounds();
  for (std::size_t r = 0; r < bounds.size(); ++r) {
    const auto [start, end] = bounds[r];
    const bool start_ok = start % w == 0;
    const bool end_ok = end % w == 0 || end == s.padded_vocab_size();
    if (!start_ok || !end_ok) {
      return fmt::format(
          "vocab_shard_bounds[{}]=[{}, {}) is not aligned to the vocab tile size {} (tile_width); "
          "the CUDA kernels need tile-aligned shard bounds (the logits op and the fused lm_head "
          "on the CPU kernels accept any)",
          r, start, end, w);
    }
  }
  return std::nullopt;
}

void LogprobContract::check_tile_alignment() const {
  if (auto problem = tile_alignment_problem(*this)) {
    throw ContractError(ErrorCode::tile_misaligned, "vocab_shard_bounds", *problem);
  }
}

nlohmann::json contract_to_json(const LogprobContract& c) {
  using nlohmann::json;
  const MaskSpec& m = c.mask();
  const ShardingSpec& s = c.sharding();
  const ReductionSpec& r = c.reduction();
  const OutputSpec& o = c.output();

  json bounds = json::array();
  for (const VocabRange& b : s.vocab_shard_bounds()) {
    bounds.push_back(json::array({b.start, b.end}));
  }

  json out = json::object();
  out["semantic_operator"] = "selected_token_logprob";
  out["role"] = to_string(c.role());
  out["dtype"] = to_string(c.dtype());
  out["export_lse"] = c.export_lse();
  out["lse_domain"] = "vocab";
  out["mask"] = {{"num_tokens", m.num_tokens()},
                 {"active_token_count", m.active_token_count()},
                 {"active_mask_sha256", m.active_mask_sha256()},
                 {"ignore_index", m.ignore_index()}};
  out["sharding"] = {{"tp_rank", s.tp_rank()},
                     {"tp_world_size", s.tp_world_size()},
                     {"cp_rank", s.cp_rank()},
                     {"cp_world_size", s.cp_world_size()},
                     {"vocab_shard_bounds", bounds},
                     {"real_vocab_size", s.real_vocab_size()},
                     {"padded_vocab_size", s.padded_vocab_size()},
                     {"local_vocab_start", s.local_vocab_start()},
                     {"local_vocab_end", s.local_vocab_end()}};
  out["reduction"] = {{"merge", to_string(r.merge())},
                      {"merge_axis", to_string(r.merge_axis())},
                      {"acc_dtype", to_string(r.acc_dtype())},
                      {"order", to_string(r.order())},
                      {"transport", to_string(r.transport())},
                      {"downcast_at", to_string(r.downcast_at())},
                      {"engine", to_string(r.engine())},
                      {"determinism_scope", to_string(r.determinism_scope())},
                      {"cp_is_merge_axis", ReductionSpec::cp_is_merge_axis()},
                      {"tile_width", c.tile_width()}};
  out["output"] = {{"selected_logp_dtype", to_string(o.selected_logp_dtype())},
                   {"lse_dtype", to_string(o.lse_dtype())},
                   {"tp_placement", to_string(o.tp_placement())}};
  out["temperature"] = static_cast<double>(c.temperature());
  // Only when set: a contract without a cap keeps the JSON, and so the fingerprint, it always had.
  if (c.softcap()) out["softcap"] = static_cast<double>(*c.softcap());
  out["numerics_version"] = kNumericsVersion;
  return out;
}

std::string LogprobContract::to_json() const { return canonical_json(contract_to_json(*this)); }

std::string LogprobContract::cross_rank_fingerprint() const {
  nlohmann::json j = contract_to_json(*this);
  nlohmann::json& sharding = j["sharding"];
  for (const char* key : {"tp_rank", "cp_rank", "local_vocab_start", "local_vocab_end"}) {
    sharding.erase(key);
  }
  return sha256_hex(canonical_json(j));
}

// ---------------------------------------------------------------------------------------------
// Shard-bound helpers

namespace {

// a * b of non-negative sizes, or ContractError naming the field and the values.
int64_t checked_mul(int64_t a, int64_t b, std::string_view field) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw ContractError(fmt::format("{} overflows 64-bit sizes: {} x {} exceeds {}", field, a, b,
                                    std::numeric_limits<int64_t>::max()));
  }
  return out;
}

// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

std::vector<VocabRange> even_bounds(int64_t padded_vocab_size, int64_t tp_world_size) {
  require_positive(padded_vocab_size, "padded_vocab_size");
  require_positive(tp_world_size, "tp_world_size");
  if (padded_vocab_size < tp_world_size) {
    throw ContractError(
        ErrorCode::conflicting_fields, "padded_vocab_size",
        fmt::format(
            "padded_vocab_size={} is smaller than tp_world_size={}: some shard would be empty",
            padded_vocab_size, tp_world_size));
  }
  // r * shard <= padded for every r < tp: no product overflows.
  const int64_t shard = padded_vocab_size / tp_world_size;
  std::vector<VocabRange> bounds;
  bounds.reserve(static_cast<std::size_t>(tp_world_size));
  for (int64_t r = 0; r < tp_world_size; ++r) {
    bounds.push_back({r * shard, r + 1 == tp_world_size ? padded_vocab_size : (r + 1) * shard});
  }
  return bounds;
}

std::vector<VocabRange> even_tile_aligned_bounds(int64_t padded_vocab_size, int64_t tp_world_size,
                                                 int64_t tile_width) {
  require_positive(padded_vocab_size, "padded_vocab_size");
  require_positive(tp_world_size, "tp_world_size");
  require_positive(tile_width, "tile_width");
  const int64_t tiles = ceil_div(padded_vocab_size, tile_width);
  if (tiles < tp_world_size) {
    throw ContractError(
        ErrorCode::conflicting_fields, "padded_vocab_size",
        fmt::format(
            "padded_vocab_size={} has {} tiles of width {}, fewer than tp_world_size={}: every TP "
            "rank needs at least one tile",
            padded_vocab_size, tiles, tile_width, tp_world_size));
  }
  const int64_t base = tiles / tp_world_size;
  const int64_t extra = tiles % tp_world_size;
  std::vector<VocabRange> bounds;
  bounds.reserve(static_cast<std::size_t>(tp_world_size));
  int64_t start = 0;
  for (int64_t r = 0; r < tp_world_size; ++r) {
    const int64_t count = base + (r < extra ? 1 : 0);
    // count * tile_width can pass INT64_MAX only for the last, partial tile: clamp to padded.
    const int64_t room = padded_vocab_size - start;
    const int64_t end = count > room / tile_width
                            ? padded_vocab_size
                            : std::min(start + count * tile_width, padded_vocab_size);
    bounds.push_back({start, end});
    start = end;
  }
  return bounds;
}

int64_t megatron_padded_vocab(int64_t real_vocab_size, int64_t tp_world_size, int64_t multiple) {
  require_positive(real_vocab_size, "real_vocab_size");
  require_positive(tp_world_size, "tp_world_size");
  require_positive(multiple, "multiple");
  const int64_t step = checked_mul(multiple, tp_world_size, "multiple * tp_world_size");
  return checked_mul(
      ceil_div(real_vocab_size, step), step,
      fmt::format("real_vocab_size={} rounded up to a multiple of {}", real_vocab_size, step));
}

VocabLayout megatron_bounds(int64_t real_vocab_size, int64_t tp_world_size, int64_t multiple) {
  const int64_t padded = megatron_padded_vocab(real_vocab_size, tp_world_size, multiple);
  const int64_t shard = padded / tp_world_size;  // (r + 1) * shard <= padded: no overflow
  VocabLayout layout{.padded_vocab_size = padded};
  layout.vocab_shard_bounds.reserve(static_cast<std::size_t>(tp_world_size));
  for (int64_t r = 0; r < tp_world_size; ++r) {
    layout.vocab_shard_bounds.push_back({r * shard, (r + 1) * shard});
  }
  return layout;
}

}  // namespace detlogp

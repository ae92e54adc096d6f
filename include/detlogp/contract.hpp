#pragma once
// The logprob contract: a typed, validated description of one selected-token logprob request
// (docs/contract.md, with detlogp's additions to the original contract: tile width,
// canonical_tile_tree order, temperature, numerics version). See docs/contract.md.
//
// Every type is an immutable value built from a plain params struct, so call sites read well
// with designated initializers; construction validates everything and throws ContractError
// with a message that names the field, the bad value and the rule:
//
//   detlogp::ShardingSpec sharding({.tp_rank = 0, .tp_world_size = 2,
//                                   .vocab_shard_bounds = {{0, 76032}, {76032, 152064}},
//                                   .real_vocab_size = 151936, .padded_vocab_size = 152064});
//   detlogp::LogprobContract contract({.role = detlogp::Role::train,
//                                      .dtype = detlogp::DType::bf16,
//                                      .mask = detlogp::MaskSpec::all_active(1024),
//                                      .sharding = sharding});
//   std::string fp = contract.cross_rank_fingerprint();  // equal on every rank of the call

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "detlogp/dtype.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"

namespace detlogp {

// A params field with no default: leaving it out of a designated initializer does not compile
// (instead of silently meaning rank 0 or Role::train).
template <typename T>
struct Required {
  Required(T v) : value(v) {}  // NOLINT(google-explicit-constructor): implicit by design
  T value;
};

// A half-open range [start, end) of global vocabulary columns.
struct VocabRange {
  int64_t start = 0;
  int64_t end = 0;
  int64_t size() const { return end - start; }
  friend bool operator==(const VocabRange&, const VocabRange&) = default;
};

// ---------------------------------------------------------------------------------------------
// ShardingSpec: which TP rank holds which vocabulary columns.

struct ShardingParams {
  Required<int64_t> tp_rank;
  int64_t tp_world_size = 0;
  // One [start, end) per TP rank, indexed by rank: the FULL table on every rank.
  std::vector<VocabRange> vocab_shard_bounds = {};
  int64_t real_vocab_size = 0;    // tokenizer vocabulary R
  int64_t padded_vocab_size = 0;  // weight / shard-covered vocabulary P >= R
  int64_t cp_rank = 0;
  int64_t cp_world_size = 1;
};

class ShardingSpec {
 public:
  // Validates, in order: tp_world_size > 0, tp_rank >= 0, tp_rank < tp_world_size; the same
  // for cp; real and padded sizes > 0, padded >= real; one bound pair per TP rank; per rank
  // end > start and contiguity from 0; the last end == padded.
  explicit ShardingSpec(const ShardingParams& params);

  int64_t tp_rank() const { return tp_rank_; }
  int64_t tp_world_size() const { return tp_world_size_; }
  int64_t cp_rank() const { return cp_rank_; }
  int64_t cp_world_size() const { return cp_world_size_; }
  const std::vector<VocabRange>& vocab_shard_bounds() const { return bounds_; }
  int64_t real_vocab_size() const { return real_vocab_size_; }
  int64_t padded_vocab_size() const { return padded_vocab_size_; }

  // This rank's columns.
  int64_t local_vocab_start() const { return bounds_[tp_rank_].start; }
  int64_t local_vocab_end() const { return bounds_[tp_rank_].end; }
  int64_t local_vocab_size() const { return local_vocab_end() - local_vocab_start(); }

  // The unique TP rank whose shard holds `token_id`; a token outside [0, real_vocab_size)
  // (padding columns included) throws ContractError.
  int64_t owner_rank(int64_t token_id) const;

  friend bool operator==(const ShardingSpec&, const ShardingSpec&) = default;

 private:
  int64_t tp_rank_;
  int64_t tp_world_size_;
  std::vector<VocabRange> bounds_;
  int64_t real_vocab_size_;
  int64_t padded_vocab_size_;
  int64_t cp_rank_;
  int64_t cp_world_size_;
};

// ---------------------------------------------------------------------------------------------
// MaskSpec: which tokens are scored. Inactive tokens get logp exactly 0 and their
// targets are unconstrained (they may hold ignore_index or anything else).

struct MaskParams {
  int64_t num_tokens = 0;
  std::vector<bool> active_mask = {};  // one entry per token
  int64_t ignore_index = -100;
};

class MaskSpec {
 public:
  // Validates: num_tokens > 0; active_mask.size() == num_tokens. All-inactive is legal.
  explicit MaskSpec(const MaskParams& params);

  // Every one of `num_tokens` tokens active.
  static MaskSpec all_active(int64_t num_tokens, int64_t ignore_index = -100);

  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<bool>& active_mask() const { return active_mask_; }
  int64_t ignore_index() const { return ignore_index_; }
  int64_t active_token_count() const { return active_token_count_; }
  // Hex SHA-256 (64 lowercase chars) of one byte per token: 0x01 active, 0x00 inactive.
  const std::string& active_mask_sha256() const { return active_mask_sha256_; }

  friend bool operator==(const MaskSpec&, const MaskSpec&) = default;

 private:
  int64_t num_tokens_;
  std::vector<bool> active_mask_;
  int64_t ignore_index_;
  int64_t active_token_count_;
  std::string active_mask_sha256_;
};

// ---------------------------------------------------------------------------------------------
// ReductionSpec: how the vocab-parallel partials merge. Normative math: columns
// [real, padded) never contribute; per partial fp32 (m, s); partials move by all-gather (a
// collective never does arithmetic); every rank merges in the same fixed order; identity
// partial (-inf, 0); downcast only at the final write. detlogp's default order is the canonical
// tile tree of docs/numerics.md.

struct ReductionParams {
  Merge merge = Merge::max_sumexp;
  MergeAxis merge_axis = MergeAxis::tp_vocab;
  DType acc_dtype = DType::fp32;
  ReductionOrder order = ReductionOrder::canonical_tile_tree;
  Transport transport = Transport::all_gather;
  DowncastPoint downcast_at = DowncastPoint::final_write;
  Engine engine = Engine::in_op_reference;
  DeterminismScope determinism_scope = DeterminismScope::cross_tp_bitwise;
};

class ReductionSpec {
 public:
  ReductionSpec();  // every default
  // Validates each enum value in field order, then acc_dtype == fp32.
  explicit ReductionSpec(const ReductionParams& params);

  Merge merge() const { return p_.merge; }
  MergeAxis merge_axis() const { return p_.merge_axis; }
  DType acc_dtype() const { return p_.acc_dtype; }
  ReductionOrder order() const { return p_.order; }
  Transport transport() const { return p_.transport; }
  DowncastPoint downcast_at() const { return p_.downcast_at; }
  Engine engine() const { return p_.engine; }
  DeterminismScope determinism_scope() const { return p_.determinism_scope; }
  // Context parallelism splits tokens, never the merge: always false.
  static constexpr bool cp_is_merge_axis() { return false; }

  friend bool operator==(const ReductionSpec& a, const ReductionSpec& b) {
    return a.p_.merge == b.p_.merge && a.p_.merge_axis == b.p_.merge_axis &&
           a.p_.acc_dtype == b.p_.acc_dtype && a.p_.order == b.p_.order &&
           a.p_.transport == b.p_.transport && a.p_.downcast_at == b.p_.downcast_at &&
           a.p_.engine == b.p_.engine && a.p_.determinism_scope == b.p_.determinism_scope;
  }

 private:
  ReductionParams p_;
};

// ---------------------------------------------------------------------------------------------
// OutputSpec (alias LogprobOutputSpec): fp32 outputs, replicated on every TP
// rank.

struct OutputParams {
  DType selected_logp_dtype = DType::fp32;
  DType lse_dtype = DType::fp32;
  TPPlacement tp_placement = TPPlacement::replicated;
};

class OutputSpec {
 public:
  OutputSpec();  // every default
  // Validates: selected_logp_dtype == fp32, lse_dtype == fp32, tp_placement valid.
  explicit OutputSpec(const OutputParams& params);

  DType selected_logp_dtype() const { return p_.selected_logp_dtype; }
  DType lse_dtype() const { return p_.lse_dtype; }
  TPPlacement tp_placement() const { return p_.tp_placement; }

  friend bool operator==(const OutputSpec& a, const OutputSpec& b) {
    return a.p_.selected_logp_dtype == b.p_.selected_logp_dtype &&
           a.p_.lse_dtype == b.p_.lse_dtype && a.p_.tp_placement == b.p_.tp_placement;
  }

 private:
  OutputParams p_;
};

using LogprobOutputSpec = OutputSpec;

// ---------------------------------------------------------------------------------------------
// LogprobContract: the request itself, with detlogp's tile width and temperature.

// Tile width used when neither tile_width nor num_vocab_tiles is given.
inline constexpr int64_t kDefaultTileWidth = 128;
// The largest tile width a contract accepts (2^31).
inline constexpr int64_t kMaxTileWidth = int64_t{1} << 31;

struct ContractParams {
  Required<Role> role;
  Required<DType> dtype;  // dtype of the logits
  MaskSpec mask;
  ShardingSpec sharding;
  ReductionSpec reduction = ReductionSpec();
  OutputSpec output = OutputSpec();
  bool export_lse = true;  // must be true (the vocab-domain LSE is always exported)
  // Scores are computed on logits / temperature. Finite and > 0.
  float temperature = 1.0f;
  // Logit softcap: scores are computed on cap * tanh(logits / cap), then divided by the
  // temperature (docs/numerics.md "Softcap"). Absent: no cap. Finite and > 0.
  std::optional<float> softcap = std::nullopt;
  // Vocab tile width W. Give at most one of the two; neither means W = 128. The tile-count
  // form num_vocab_tiles = n means W = padded_vocab_size / n and must divide it exactly.
  std::optional<int64_t> tile_width = std::nullopt;
  std::optional<int64_t> num_vocab_tiles = std::nullopt;
};

class LogprobContract {
 public:
  // Validates, in order: role and dtype values; export_lse; ignore_index outside the real
  // vocabulary; tile_width / num_vocab_tiles; temperature; softcap. (MaskSpec, ShardingSpec,
  // ReductionSpec and OutputSpec validated themselves when they were built.)
  explicit LogprobContract(const ContractParams& params);

  Role role() const { return role_; }
  DType dtype() const { return dtype_; }
  const MaskSpec& mask() const { return mask_; }
  const ShardingSpec& sharding() const { return sharding_; }
  const ReductionSpec& reduction() const { return reduction_; }
  const OutputSpec& output() const { return output_; }
  bool export_lse() const { return export_lse_; }
  float temperature() const { return temperature_; }
  // The logit softcap, or nullopt when there is none.
  std::optional<float> softcap() const { return softcap_; }
  // The resolved vocab tile width W.
  int64_t tile_width() const { return tile_width_; }
  // The numerics canon this build implements (kNumericsVersion).
  std::string_view numerics_version() const;

  // Throws ContractError when a shard bound is not a multiple of tile_width() (the last end
  // may equal padded_vocab_size). Not checked at construction: the operator calls it in
  // deterministic mode, and the non-deterministic mode ignores tiles.
  void check_tile_alignment() const;

  // Provenance: compact JSON with sorted keys (docs/contract.md shows the schema).
  std::string to_json() const;
  // Hex SHA-256 of the canonical JSON of to_json() without the rank-local sharding keys
  // (tp_rank, cp_rank, local_vocab_start, local_vocab_end): equal on every rank of one call,
  // different when anything numerics-relevant differs.
  std::string cross_rank_fingerprint() const;

  friend bool operator==(const LogprobContract&, const LogprobContract&) = default;

 private:
  Role role_;
  DType dtype_;
  MaskSpec mask_;
  ShardingSpec sharding_;
  ReductionSpec reduction_;
  OutputSpec output_;
  bool export_lse_;
  float temperature_;
  std::optional<float> softcap_;
  int64_t tile_width_;
};

// The tile-alignment problem of the contract's shard bounds, if any (the message
// check_tile_alignment() throws), else nullopt.
std::optional<std::string> tile_alignment_problem(const LogprobContract& contract);

// ---------------------------------------------------------------------------------------------
// Shard-bound helpers. All throw ContractError on non-positive arguments.

// Even bounds: shard = padded / tp, the last rank takes the remainder.
// Qwen3 at TP=2: {{0, 76032}, {76032, 152064}}.
std::vector<VocabRange> even_bounds(int64_t padded_vocab_size, int64_t tp_world_size);

// Whole tiles of `tile_width`, the first (tiles mod tp) ranks take one extra tile; the last tile
// may be partial when padded % tile_width != 0. Throws when there are fewer tiles than ranks.
std::vector<VocabRange> even_tile_aligned_bounds(int64_t padded_vocab_size, int64_t tp_world_size,
                                                 int64_t tile_width);

// Megatron's padded vocabulary: real rounded up to a multiple of multiple * tp.
// Qwen3 (151936): 151936 at TP=1, 152064 at TP=2, 3 and 4, 152576 at TP=8.
int64_t megatron_padded_vocab(int64_t real_vocab_size, int64_t tp_world_size,
                              int64_t multiple = 128);

struct VocabLayout {
  int64_t padded_vocab_size = 0;
  std::vector<VocabRange> vocab_shard_bounds = {};
};

// Megatron's layout: the padded vocabulary above, cut into tp equal shards.
VocabLayout megatron_bounds(int64_t real_vocab_size, int64_t tp_world_size, int64_t multiple = 128);

}  // namespace detlogp

// Prints contracts and capabilities for tests/python/check_fingerprint.py, one per line:
//   contract<TAB><cross_rank_fingerprint><TAB><to_json>
//   capability<TAB>-<TAB><to_json>
// The Python side recomputes every fingerprint with json + hashlib and checks that every JSON
// text is already canonical (json.dumps(json.loads(s), sort_keys=True, separators=(",", ":"))).

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"

using namespace detlogp;

namespace {

MaskSpec qwen3_mask() {
  return MaskSpec(
      {.num_tokens = 8, .active_mask = {false, false, true, true, true, true, true, false}});
}

ShardingSpec qwen3_sharding(int64_t tp_rank, int64_t cp_rank) {
  return ShardingSpec({.tp_rank = tp_rank,
                       .tp_world_size = 2,
                       .vocab_shard_bounds = {{0, 76032}, {76032, 152064}},
                       .real_vocab_size = 151936,
                       .padded_vocab_size = 152064,
                       .cp_rank = cp_rank,
                       .cp_world_size = 2});
}

void print_contract(const LogprobContract& c) {
  std::printf("contract\t%s\t%s\n", c.cross_rank_fingerprint().c_str(), c.to_json().c_str());
}

}  // namespace

int main() {
  // The Qwen3-8B example on every rank of its TP2 x CP2 group.
  for (int64_t cp = 0; cp < 2; ++cp) {
    for (int64_t tp = 0; tp < 2; ++tp) {
      print_contract(LogprobContract({.role = Role::train,
                                      .dtype = DType::bf16,
                                      .mask = qwen3_mask(),
                                      .sharding = qwen3_sharding(tp, cp)}));
    }
  }
  // Temperatures whose decimal forms exercise Python's float repr layout.
  const float temperatures[] = {0.7f,
                                0.1f,
                                1e-5f,
                                1e-4f,
                                2.5f,
                                123456.79f,
                                1e15f,
                                1e16f,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::denorm_min(),
                                std::nextafter(1.0f, 2.0f)};
  for (float t : temperatures) {
    print_contract(LogprobContract({.role = Role::infer,
                                    .dtype = DType::fp32,
                                    .mask = MaskSpec::all_active(3, -1),
                                    .sharding = qwen3_sharding(1, 0),
                                    .temperature = t}));
  }
  // Other shapes: TP=4 Megatron layout, shard-index order and tile count, fixed_topology, fp16.
  const VocabLayout tp8 = megatron_bounds(151936, 8);
  print_contract(LogprobContract(
      {.role = Role::train,
       .dtype = DType::fp16,
       .mask = MaskSpec::all_active(1),
       .sharding = ShardingSpec({.tp_rank = 5,
                                 .tp_world_size = 8,
                                 .vocab_shard_bounds = tp8.vocab_shard_bounds,
                                 .real_vocab_size = 151936,
                                 .padded_vocab_size = tp8.padded_vocab_size}),
       .reduction = ReductionSpec({.determinism_scope = DeterminismScope::fixed_topology})}));
  print_contract(LogprobContract(
      {.role = Role::train,
       .dtype = DType::bf16,
       .mask = qwen3_mask(),
       .sharding = qwen3_sharding(0, 1),
       .reduction = ReductionSpec({.order = ReductionOrder::global_vocab_shard_index}),
       .num_vocab_tiles = 64}));
  print_contract(LogprobContract(
      {.role = Role::infer,
       .dtype = DType::bf16,
       .mask = MaskSpec({.num_tokens = 6,
                         .active_mask = {true, true, true, true, true, false},
                         .ignore_index = 40}),
       .sharding = ShardingSpec({.tp_rank = 3,
                                 .tp_world_size = 4,
                                 .vocab_shard_bounds = {{0, 4}, {4, 16}, {16, 24}, {24, 32}},
                                 .real_vocab_size = 27,
                                 .padded_vocab_size = 32}),
       .tile_width = 4}));

  // Capabilities, including a backend id that needs escaping.
  const BackendCapability caps[] = {
      BackendCapability({.backend_id = "cpu-canonical",
                         .roles = {Role::train, Role::infer},
                         .dtypes = {DType::bf16, DType::fp16, DType::fp32},
                         .supports_vocab_padding = true,
                         .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
                         .exports_vocab_lse = true,
                         .determinism_scopes = {DeterminismScope::cross_tp_bitwise,
                                                DeterminismScope::fixed_topology},
                         .supports_temperature = true}),
      BackendCapability({.backend_id = "  caf\xc3\xa9-\"\\-\xf0\x9f\x98\x80\t ",
                         .roles = {Role::infer},
                         .dtypes = {DType::fp32},
                         .tp_world_sizes = std::vector<int64_t>{1},
                         .cp_world_sizes = std::vector<int64_t>{2, 1},
                         .implementation_kind = ImplementationKind::reference,
                         .tile_widths = std::vector<int64_t>{128, 64},
                         .reduction_orders = {ReductionOrder::global_vocab_shard_index}}),
  };
  for (const BackendCapability& cap : caps)
    std::printf("capability\t-\t%s\n", cap.to_json().c_str());
  return 0;
}

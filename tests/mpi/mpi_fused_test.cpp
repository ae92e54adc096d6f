// The fused lm_head across real processes (mpirun -np 2 / 4): every rank's logp, LSE, entropy
// and full grad_hidden, and its grad_weight shard, bitwise equal to TP=1 computed in this
// process, with tile-aligned bounds and bounds that split tiles; a rank with bad inputs fails
// every rank.
#include <gtest/gtest.h>

#include "detlogp/fused.hpp"
#include "detlogp/mpi_comm.hpp"
#include "mpi_inputs.hpp"
#include "op/fused_test_util.hpp"

namespace detlogp::testing {
namespace {

constexpr int64_t kW = 16;
constexpr int64_t kReal = 200;
constexpr int64_t kH = 37;
constexpr int64_t kRows = 6;

std::vector<int64_t> targets_for(int64_t rows) { return spread_targets(rows, kReal, 61, 7); }

void check_layout(Communicator& comm, const Layout& layout, DType dtype, const std::string& what) {
  const FullLogits hidden = make_matrix(dtype, kRows, kH, 5, 1.0f);
  const FullLogits weight = make_matrix(dtype, layout.padded, kH, 6, 0.5f);
  const std::vector<int64_t> targets = targets_for(kRows);
  const GradInputs g = patterned_grads(kRows);
  const ContractOptions copt{.dtype = dtype, .tile_width = kW};
  const FusedRunOptions o{.fused = {.entropy = true, .exec = {.threads = 1}}, .grads = g};
  const Layout one{kReal, layout.padded, {{0, layout.padded}}};
  const FusedRun ref = run_fused(hidden, weight, one, targets, copt, o);

  const int r = comm.rank();
  const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
  const FusedLinearLogprob op;
  const LogprobContract c = make_contract(layout, r, kRows, copt);
  const FusedLogprobResult res =
      op.forward(whole(hidden), row_range(weight, b.start, b.end), targets, c, comm, o.fused);
  EXPECT_EQ(bits(res.logp), bits(ref.ranks[0].logp)) << what;
  EXPECT_EQ(bits(res.lse), bits(ref.ranks[0].lse)) << what;
  EXPECT_EQ(bits(res.entropy), bits(ref.ranks[0].entropy)) << what;
  std::vector<float> gh(static_cast<std::size_t>(kRows * kH));
  std::vector<float> gw(static_cast<std::size_t>(b.size() * kH));
  op.backward(res,
              {.grad_logp = g.grad_logp, .grad_lse = g.grad_lse, .grad_entropy = g.grad_entropy},
              MutableLogitsView{gh.data(), DType::fp32, kRows, kH, kH},
              MutableLogitsView{gw.data(), DType::fp32, b.size(), kH, kH}, comm);
  EXPECT_EQ(bits(gh), bits(ref.grad_hidden[0])) << what << ": grad_hidden";
  const std::vector<float> want(ref.grad_weight.begin() + b.start * kH,
                                ref.grad_weight.begin() + b.end * kH);
  EXPECT_EQ(bits(gw), bits(want)) << what << ": grad_weight shard";
}

TEST(MpiFused, EveryRankBitwiseEqualsTp1) {
  MpiComm world = MpiComm::world();
  const int tp = world.size();
  for (DType dt : {DType::bf16, DType::fp32}) {
    check_layout(world, padded_layout(kReal, tp, kW), dt, "even TP" + std::to_string(tp));
    // Uneven: one tile on each rank but the last, which holds the rest (13 real tiles).
    std::vector<int64_t> tiles(static_cast<std::size_t>(std::max(tp - 1, 0)), 1);
    tiles.push_back(13 - (tp - 1));
    check_layout(world, uneven_layout(kReal, tiles, kW), dt, "uneven TP" + std::to_string(tp));
  }
}

// Bounds that split tiles: the 200 rows split evenly (ceil(200 / TP) rows per rank, as vLLM
// splits, not multiples of W = 16), and a layout whose first rank holds no rows, whose second
// holds 5 rows inside one tile and whose others split the rest unevenly (the weight rows of
// split tiles cross processes).
TEST(MpiFused, UnalignedBoundsBitwiseEqualTp1) {
  MpiComm world = MpiComm::world();
  const int64_t tp = world.size();
  const int64_t padded = (kReal + 63) / 64 * 64;
  const int64_t per = (kReal + tp - 1) / tp;
  Layout even{kReal, kReal, {}};
  for (int64_t r = 0; r < tp; ++r) {
    even.bounds.push_back({std::min(r * per, kReal), std::min((r + 1) * per, kReal)});
  }
  Layout ragged{kReal, padded, {{0, 0}, {0, 5}}};
  for (int64_t r = 2, start = 5; r < tp; ++r) {
    const int64_t end = r + 1 == tp ? padded : start + 37 * r;
    ragged.bounds.push_back({start, end});
    start = end;
  }
  if (tp == 2) ragged.bounds = {{0, 21}, {21, padded}};
  for (DType dt : {DType::bf16, DType::fp32}) {
    check_layout(world, even, dt, "even split TP" + std::to_string(tp));
    check_layout(world, ragged, dt, "ragged TP" + std::to_string(tp));
  }
}

TEST(MpiFused, ABadRankFailsEveryRank) {
  MpiComm world = MpiComm::world();
  const Layout layout = padded_layout(kReal, world.size(), kW);
  const FullLogits hidden = make_matrix(DType::fp32, kRows, kH, 5, 1.0f);
  // The last rank passes a hidden size one short: every rank must throw, none may hang.
  const FullLogits weight = make_matrix(DType::fp32, layout.padded, kH, 6, 0.5f);
  const FullLogits narrow = make_matrix(DType::fp32, layout.padded, kH - 1, 6, 0.5f);
  const int r = world.rank();
  const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
  const bool bad = r == world.size() - 1;
  const LogprobContract c = make_contract(layout, r, kRows, {.tile_width = kW});
  const FusedLinearLogprob op;
  EXPECT_THROW(op.forward(whole(hidden), row_range(bad ? narrow : weight, b.start, b.end),
                          targets_for(kRows), c, world),
               ContractError);
}

}  // namespace
}  // namespace detlogp::testing

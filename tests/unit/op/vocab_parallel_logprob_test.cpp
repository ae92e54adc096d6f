// The vocab-parallel operator on the in-process rank group: bitwise invariance across TP
// layouts, replication, validation key phrases, preflight, gradients, non-deterministic mode.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

const ShardKernels& fast() { return simd_kernels(); }

VocabParallelLogprob canonical_op() { return VocabParallelLogprob(fast(), "test-canonical"); }

std::vector<int64_t> random_targets(int64_t rows, int64_t real, uint32_t stream) {
  std::mt19937 gen(stream);
  std::uniform_int_distribution<int64_t> dist(0, real - 1);
  std::vector<int64_t> t(static_cast<std::size_t>(rows));
  for (auto& v : t) v = dist(gen);
  return t;
}

std::vector<float> random_grads(int64_t rows, uint32_t stream) {
  std::mt19937 gen(stream);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(rows));
  for (auto& v : g) v = n(gen);
  return g;
}

// Uneven tile-aligned bounds: rank r gets (r + 1) units of tiles, the last rank the rest.
std::vector<VocabRange> uneven_bounds(int64_t padded, int64_t tp, int64_t w) {
  const int64_t tiles = (padded + w - 1) / w;
  std::vector<VocabRange> b;
  int64_t start = 0;
  const int64_t unit = std::max<int64_t>(1, tiles / (tp * (tp + 1)));
  for (int64_t r = 0; r < tp; ++r) {
    const int64_t end = r + 1 == tp ? padded : std::min(padded, start + (r + 1) * unit * w);
    b.push_back({start, end});
    start = end;
  }
  return b;
}

void expect_same_bits(const TpRun& a, const TpRun& b, int64_t real, bool entropy,
                      const std::string& what) {
  const LogprobResult& x = a.ranks[0].result;
  const LogprobResult& y = b.ranks[0].result;
  EXPECT_EQ(bits(x.logp), bits(y.logp)) << what << ": logp";
  EXPECT_EQ(bits(x.lse), bits(y.lse)) << what << ": lse";
  if (entropy) {
    EXPECT_EQ(bits(x.entropy), bits(y.entropy)) << what << ": entropy";
  }
  EXPECT_EQ(real_grad_bytes(a.grad, real), real_grad_bytes(b.grad, real)) << what << ": grad";
}

void expect_replicated(const TpRun& run, const std::string& what) {
  for (std::size_t r = 1; r < run.ranks.size(); ++r) {
    EXPECT_EQ(bits(run.ranks[r].result.logp), bits(run.ranks[0].result.logp)) << what;
    EXPECT_EQ(bits(run.ranks[r].result.lse), bits(run.ranks[0].result.lse)) << what;
    EXPECT_EQ(bits(run.ranks[r].result.entropy), bits(run.ranks[0].result.entropy)) << what;
  }
}

// Qwen3's real vocabulary with Megatron padding per TP degree: every TP degree gives the same
// bits for logp, LSE, entropy and the gradient (real columns), for every dtype, even and uneven.
TEST(VocabParallelLogprob, BitwiseAcrossTpDegreesMegatronPadding) {
  const int64_t real = 151936, rows = 6;
  const auto op = canonical_op();
  const std::vector<bool> active = {false, true, true, true, false, true};
  const auto targets = random_targets(rows, real, 11);
  GradInputs grads{random_grads(rows, 1), random_grads(rows, 2), random_grads(rows, 3)};
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32}) {
    ContractOptions copt{.dtype = dtype, .active = active};
    const ForwardOptions fopt{.entropy = true, .exec = {.threads = 1}};
    const int64_t padded1 = megatron_padded_vocab(real, 1);
    auto base_logits = make_logits(dtype, rows, real, padded1, 5);
    const TpRun base =
        run_tp(op, base_logits, {real, padded1, {{0, padded1}}}, targets, copt, fopt, grads);
    for (int64_t tp : {2, 3, 4, 8}) {
      const VocabLayout ml = megatron_bounds(real, tp);
      // Same real logits, different padding width (and garbage in the padding).
      auto logits = make_logits(dtype, rows, real, ml.padded_vocab_size, 5);
      const Layout even{real, ml.padded_vocab_size, ml.vocab_shard_bounds};
      const Layout uneven{real, ml.padded_vocab_size, uneven_bounds(ml.padded_vocab_size, tp, 128)};
      for (const Layout& layout : {even, uneven}) {
        const TpRun run = run_tp(op, logits, layout, targets, copt, fopt, grads);
        const std::string what = "dtype " + std::string(to_string(dtype)) + " TP " +
                                 std::to_string(tp) + (&layout == &even ? " even" : " uneven");
        expect_same_bits(base, run, real, true, what);
        expect_replicated(run, what);
      }
    }
  }
}

TEST(VocabParallelLogprob, InactiveRowsLogpZeroLseFiniteAndGradAsymmetry) {
  const int64_t real = 27, padded = 32, rows = 6;
  const auto op = canonical_op();
  ContractOptions copt{.active = {true, true, true, true, true, false}, .tile_width = 4};
  std::vector<int64_t> targets = {1, 5, 26, 0, 13, -100};
  auto logits = make_logits(DType::fp32, rows, real, padded, 2026, 1.0f, 1e4f);
  const Layout layout{real, padded, {{0, padded}}};
  // logp-only gradient: the inactive row gets nothing.
  TpRun run =
      run_tp(op, logits, layout, targets, copt, {}, {.grad_logp = std::vector<float>(6, 1.0f)});
  const LogprobResult r = run.ranks[0].result;  // a copy: `run` is reassigned below
  EXPECT_EQ(canon::bits_of(r.logp[5]), canon::bits_of(0.0f));
  EXPECT_TRUE(std::isfinite(r.lse[5]));
  for (int64_t c = 0; c < padded; ++c) EXPECT_EQ(std::fabs(run.grad.at(5, c)), 0.0f);
  // lse-only gradient: the inactive row gets softmax.
  run = run_tp(op, logits, layout, targets, copt, {}, {.grad_lse = std::vector<float>(6, 1.0f)});
  double sum = 0;
  for (int64_t c = 0; c < real; ++c) sum += run.grad.at(5, c);
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Padding logits (1e4) never leak: LSE equals the real-column logsumexp, padding grads are +0.
  for (int64_t i = 0; i < rows; ++i) {
    long double s = 0;
    for (int64_t c = 0; c < real; ++c) s += std::exp(static_cast<long double>(logits.at(i, c)));
    EXPECT_NEAR(r.lse[i], static_cast<double>(std::log(s)), 1e-5);
    for (int64_t c = real; c < padded; ++c) EXPECT_EQ(canon::bits_of(run.grad.at(i, c)), 0u);
  }
}

TEST(VocabParallelLogprob, GradientsMatchAnalyticFormulaAndFiniteDifferences) {
  const int64_t real = 27, padded = 32, rows = 6;
  const auto op = canonical_op();
  ContractOptions copt{.active = {true, true, true, true, true, false}, .tile_width = 4};
  std::vector<int64_t> targets = {1, 5, 26, 0, 13, -100};
  auto logits = make_logits(DType::fp32, rows, real, padded, 2026, 1.0f);
  const Layout layout{real, padded, {{0, 8}, {8, 16}, {16, 24}, {24, 32}}};
  // loss = sum(a * logp) + sum(b * lse) + sum(c * entropy)
  GradInputs g{random_grads(rows, 7), random_grads(rows, 8), random_grads(rows, 9)};
  TpRun run = run_tp(op, logits, layout, targets, copt, {.entropy = true}, g);
  auto loss = [&](const std::vector<double>& z, int64_t i) {
    double mx = -INFINITY;
    for (int64_t c = 0; c < real; ++c) mx = std::max(mx, z[c]);
    double s = 0;
    for (int64_t c = 0; c < real; ++c) s += std::exp(z[c] - mx);
    const double lse = mx + std::log(s);
    double h = 0;
    for (int64_t c = 0; c < real; ++c) {
      const double p = std::exp(z[c] - lse);
      h -= p * (z[c] - lse);
    }
    const double logp = copt.active[i] ? z[targets[i]] - lse : 0.0;
    return g.grad_logp[i] * logp + g.grad_lse[i] * lse + g.grad_entropy[i] * h;
  };
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> z(real);
    for (int64_t c = 0; c < real; ++c) z[c] = logits.at(i, c);
    for (int64_t c = 0; c < real; ++c) {
      const double eps = 1e-5;
      auto zp = z, zm = z;
      zp[c] += eps;
      zm[c] -= eps;
      const double fd = (loss(zp, i) - loss(zm, i)) / (2 * eps);
      EXPECT_NEAR(run.grad.at(i, c), fd, 1e-4 + 1e-3 * std::fabs(fd))
          << "row " << i << " col " << c;
    }
  }
}

TEST(VocabParallelLogprob, RepeatRunsAndRowAloneAreBitwiseEqual) {
  const int64_t real = 1000, padded = 1024, rows = 7;
  const auto op = canonical_op();
  auto logits = make_logits(DType::bf16, rows, real, padded, 3);
  const auto targets = random_targets(rows, real, 4);
  ContractOptions copt{.dtype = DType::bf16, .tile_width = 32};
  const Layout layout{real, padded, {{0, 512}, {512, 1024}}};
  const TpRun a = run_tp(op, logits, layout, targets, copt, {.entropy = true}, {});
  const TpRun b = run_tp(op, logits, layout, targets, copt, {.entropy = true}, {});
  EXPECT_EQ(bits(a.ranks[0].result.lse), bits(b.ranks[0].result.lse));
  EXPECT_EQ(bits(a.ranks[0].result.logp), bits(b.ranks[0].result.logp));
  // Row 3 alone (a one-row matrix with the same values).
  FullLogits one = logits;
  one.rows = 1;
  one.half.assign(logits.half.begin() + 3 * padded, logits.half.begin() + 4 * padded);
  const TpRun alone = run_tp(op, one, layout, {targets[3]}, copt, {.entropy = true}, {});
  EXPECT_EQ(canon::bits_of(alone.ranks[0].result.lse[0]), canon::bits_of(a.ranks[0].result.lse[3]));
  EXPECT_EQ(canon::bits_of(alone.ranks[0].result.logp[0]),
            canon::bits_of(a.ranks[0].result.logp[3]));
}

TEST(VocabParallelLogprob, EntropyMatchesDefinition) {
  const int64_t real = 1000, padded = 1024, rows = 5;
  const auto op = canonical_op();
  auto logits = make_logits(DType::fp32, rows, real, padded, 8);
  const TpRun run = run_tp(op, logits, {real, padded, {{0, padded}}}, random_targets(rows, real, 1),
                           {.tile_width = 32}, {.entropy = true}, {});
  for (int64_t i = 0; i < rows; ++i) {
    long double mx = -INFINITY, s = 0, h = 0;
    for (int64_t c = 0; c < real; ++c) mx = std::max<long double>(mx, logits.at(i, c));
    for (int64_t c = 0; c < real; ++c) s += std::exp(logits.at(i, c) - mx);
    const long double lse = mx + std::log(s);
    for (int64_t c = 0; c < real; ++c) {
      const long double p = std::exp(logits.at(i, c) - lse);
      h -= p * (logits.at(i, c) - lse);
    }
    EXPECT_NEAR(run.ranks[0].result.entropy[i], static_cast<double>(h), 1e-5);
  }
}

TEST(VocabParallelLogprob, ValidationKeyPhrases) {
  const int64_t real = 27, padded = 32, rows = 6;
  const auto op = canonical_op();
  ContractOptions copt{.tile_width = 4};
  auto logits = make_logits(DType::fp32, rows, real, padded, 1, 1.0f);
  std::vector<int64_t> targets = {1, 5, 26, 0, 13, 2};
  const Layout layout{real, padded, {{0, padded}}};
  SelfComm self;
  auto expect_phrase = [&](const std::function<void()>& f, const std::string& phrase) {
    try {
      f();
      ADD_FAILURE() << "expected ContractError containing '" << phrase << "'";
    } catch (const ContractError& e) {
      EXPECT_THAT(e.what(), HasSubstr(phrase));
    }
  };
  const LogprobContract c = make_contract(layout, 0, rows, copt);
  expect_phrase([&] { op.forward(logits.shard(0, 31), targets, c, self); }, "vocab columns");
  expect_phrase([&] { op.forward(logits.shard(0, 32), std::vector<int64_t>(5, 0), c, self); },
                "one entry per token");
  FullLogits fewer = logits;
  fewer.rows = 5;
  expect_phrase([&] { op.forward(fewer.shard(0, 32), std::vector<int64_t>(5, 0), c, self); },
                "num_tokens");
  auto bf = make_logits(DType::bf16, rows, real, padded, 1, 1.0f);
  expect_phrase([&] { op.forward(bf.shard(0, 32), targets, c, self); }, "dtype");
  std::vector<int64_t> bad_targets = targets;
  bad_targets[2] = real;
  expect_phrase([&] { op.forward(logits.shard(0, 32), bad_targets, c, self); }, "real vocabulary");
  auto neg = logits;
  for (int64_t col = 0; col < padded; ++col) neg.f32[2 * padded + col] = -INFINITY;
  expect_phrase([&] { op.forward(neg.shard(0, 32), targets, c, self); }, "non-finite");
  // deterministic=false needs fixed_topology.
  expect_phrase(
      [&] { op.forward(logits.shard(0, 32), targets, c, self, {.deterministic = false}); },
      "cross_tp_bitwise");
}

// The same checks by code and field, where the wording is not the point.
TEST(VocabParallelLogprob, ValidationErrorCodes) {
  const int64_t real = 27, padded = 32, rows = 6;
  const auto op = canonical_op();
  auto logits = make_logits(DType::fp32, rows, real, padded, 1, 1.0f);
  std::vector<int64_t> targets = {1, 5, 26, 0, 13, 2};
  const Layout layout{real, padded, {{0, padded}}};
  const LogprobContract c = make_contract(layout, 0, rows, {.tile_width = 4});
  SelfComm self;
  auto code_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ContractError& e) {
      return std::string(to_string(e.code())) + ":" + e.field();
    }
    return "no ContractError";
  };
  EXPECT_EQ(code_of([&] { op.forward(logits.shard(0, 31), targets, c, self); }),
            "wrong_shape:local_logits");
  auto bf = make_logits(DType::bf16, rows, real, padded, 1, 1.0f);
  EXPECT_EQ(code_of([&] { op.forward(bf.shard(0, 32), targets, c, self); }),
            "wrong_dtype:local_logits");
  std::vector<int64_t> bad_targets = targets;
  bad_targets[2] = real;
  EXPECT_EQ(code_of([&] { op.forward(logits.shard(0, 32), bad_targets, c, self); }),
            "token_out_of_vocab:target_ids");
  EXPECT_EQ(
      code_of([&] { op.forward(logits.shard(0, 32), targets, c, self, {.deterministic = false}); }),
      "mode_mismatch:deterministic");
  EXPECT_EQ(code_of([&] { op.forward(logits.shard(0, 32), targets, c, self); }),
            "no ContractError");

  // Two ranks, one of which passes the wrong dtype: it keeps its own code through the
  // preflight, the other learns of it as ranks_disagree.
  const Layout two{real, padded, {{0, 16}, {16, 32}}};
  std::vector<std::string> codes(2);
  run_ranks(2, [&](Communicator& comm) {
    const auto cc = make_contract(two, comm.rank(), rows, {.tile_width = 4});
    const VocabRange b = two.bounds[static_cast<std::size_t>(comm.rank())];
    codes[static_cast<std::size_t>(comm.rank())] = code_of([&] {
      op.forward(comm.rank() == 0 ? bf.shard(b.start, b.end) : logits.shard(b.start, b.end),
                 targets, cc, comm);
    });
  });
  EXPECT_EQ(codes[0], "wrong_dtype:local_logits");
  EXPECT_EQ(codes[1], "ranks_disagree:");
}

// Every rank throws "cross-rank preflight failed" (or its own local error) and nobody hangs.
void expect_all_ranks_fail(int tp, const std::function<void(Communicator&)>& body) {
  const RankErrors run = rank_errors(tp, body);
  ASSERT_TRUE(run.finished) << "hang";
  const std::vector<std::string>& errors = run.errors;
  int preflight = 0;
  for (const auto& e : errors) {
    EXPECT_FALSE(e.empty()) << "a rank did not throw";
    preflight += e.find("cross-rank preflight failed") != std::string::npos;
  }
  EXPECT_GE(preflight, 1);
}

TEST(VocabParallelLogprob, PreflightMismatchesFailOnEveryRank) {
  const int64_t real = 1000, padded = 1024, rows = 4;
  const auto op = canonical_op();
  auto logits = make_logits(DType::fp32, rows, real, padded, 1);
  const auto targets = random_targets(rows, real, 2);
  const Layout layout{real, padded, {{0, 512}, {512, 1024}}};
  // Each rank runs its own shard of `layout` under its own contract options.
  const auto forward_own_shard = [&](Communicator& comm, const ContractOptions& o,
                                     const ForwardOptions& f) {
    auto c = make_contract(layout, comm.rank(), rows, o);
    auto b = layout.bounds[static_cast<std::size_t>(comm.rank())];
    op.forward(logits.shard(b.start, b.end), targets, c, comm, f);
  };
  for (bool validate : {true, false}) {
    const ForwardOptions fopt{.validate = validate};
    // Tile width differs (both aligned locally).
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      forward_own_shard(comm, {.tile_width = comm.rank() == 0 ? 64 : 128}, fopt);
    });
    // Mask differs.
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      forward_own_shard(comm, {.active = {true, comm.rank() == 0, true, true}}, fopt);
    });
    // Contract differs (temperature).
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      forward_own_shard(comm, {.temperature = comm.rank() == 0 ? 1.0f : 0.7f}, fopt);
    });
    // Deterministic mode differs (fixed_topology so that false is legal).
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      forward_own_shard(comm, {.scope = DeterminismScope::fixed_topology},
                        {.deterministic = comm.rank() == 0, .validate = validate});
    });
    // Entropy requested on one rank only (it changes the payload size).
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      forward_own_shard(comm, {}, {.validate = validate, .entropy = comm.rank() == 0});
    });
    // One rank's contract says TP=1 (its whole-vocabulary shard) while the other says TP=2.
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      if (comm.rank() == 0) {
        const Layout whole{real, padded, {{0, padded}}};
        auto c = make_contract(whole, 0, rows, {});
        op.forward(logits.shard(0, padded), targets, c, comm, fopt);
      } else {
        auto c = make_contract(layout, 1, rows, {});
        op.forward(logits.shard(512, 1024), targets, c, comm, fopt);
      }
    });
    // Row count differs (each rank's contract agrees with its own logits).
    expect_all_ranks_fail(2, [&](Communicator& comm) {
      const int64_t n = comm.rank() == 0 ? rows : rows - 1;
      auto c = make_contract(layout, comm.rank(), n, {});
      auto b = layout.bounds[static_cast<std::size_t>(comm.rank())];
      FullLogits l = logits;
      l.rows = n;
      op.forward(l.shard(b.start, b.end),
                 std::vector<int64_t>(targets.begin(), targets.begin() + n), c, comm, fopt);
    });
  }
}

TEST(VocabParallelLogprob, NonDeterministicModeIsCloseReplicatedAndIgnoresTiles) {
  const int64_t real = 1000, padded = 1024, rows = 8;
  const auto op = canonical_op();
  auto logits = make_logits(DType::fp32, rows, real, padded, 12);
  const auto targets = random_targets(rows, real, 13);
  GradInputs g{random_grads(rows, 1), random_grads(rows, 2), {}};
  const ContractOptions fixed{.scope = DeterminismScope::fixed_topology, .tile_width = 32};
  const TpRun det = run_tp(op, logits, {real, padded, {{0, padded}}}, targets, fixed, {}, g);
  // Bounds that are not tile-aligned are fine without determinism.
  const Layout mis{real, padded, {{0, 250}, {250, 600}, {600, 777}, {777, 1024}}};
  const TpRun nd = run_tp(op, logits, mis, targets, fixed, {.deterministic = false}, g);
  expect_replicated(nd, "non-deterministic TP4");
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_NEAR(nd.ranks[0].result.lse[i], det.ranks[0].result.lse[i], 1e-5);
    EXPECT_NEAR(nd.ranks[0].result.logp[i], det.ranks[0].result.logp[i], 1e-5);
    for (int64_t c = 0; c < padded; ++c) {
      EXPECT_NEAR(nd.grad.at(i, c), det.grad.at(i, c), 1e-6);
      if (c >= real) {
        EXPECT_EQ(canon::bits_of(nd.grad.at(i, c)), 0u);
      }
    }
  }
}

TEST(VocabParallelLogprob, BackwardRejectsAnotherOperatorsResultAndBadViews) {
  const int64_t real = 32, padded = 32, rows = 2;
  auto logits = make_logits(DType::fp32, rows, real, padded, 3, 1.0f);
  SelfComm self;
  const LogprobContract c = make_contract({real, padded, {{0, padded}}}, 0, rows, {});
  const auto canonical = canonical_op();
  const BatchInvariantLogprob single("test-batch-invariant");
  const std::vector<int64_t> targets = {1, 2};
  std::vector<float> grad(static_cast<std::size_t>(rows * padded));
  const MutableLogitsView g{.data = grad.data(),
                            .dtype = DType::fp32,
                            .rows = rows,
                            .cols = padded,
                            .row_stride = padded};
  const std::vector<float> ones(rows, 1.0f);
  const LogprobResult a = canonical.forward(logits.shard(0, padded), targets, c, self);
  const LogprobResult b = single.forward(logits.shard(0, padded), targets, c, self);
  EXPECT_THROW(single.backward(a, {.grad_logp = ones}, g), ContractError);
  EXPECT_THROW(canonical.backward(b, {.grad_logp = ones}, g), ContractError);
  // Null data is an error, not a crash, for both operators.
  const LogitsView null_view{
      .data = nullptr, .dtype = DType::fp32, .rows = rows, .cols = padded, .row_stride = padded};
  EXPECT_THROW(canonical.forward(null_view, targets, c, self), ContractError);
  EXPECT_THROW(single.forward(null_view, targets, c, self), ContractError);
  // backward uses its own copies of LSE: moving the outputs out of the result is fine.
  LogprobResult moved = canonical.forward(logits.shard(0, padded), targets, c, self);
  const std::vector<float> lse = std::move(moved.lse);
  EXPECT_NO_THROW(canonical.backward(moved, {.grad_logp = ones}, g));
  EXPECT_EQ(lse.size(), static_cast<std::size_t>(rows));
}

}  // namespace
}  // namespace detlogp::testing

// Per-row temperatures (ForwardOptions / FusedOptions::row_temperature) through the logits
// operator and the fused lm_head on the in-process rank group: each row gets the bits of the
// scalar-temperature call with its own temperature (with and without a softcap, every SIMD
// target and the reference); bitwise across TP degrees with uneven shards, row permutations
// (the temperature travels with its row) and thread counts; logp and LSE against a float64
// oracle; bad values and ranks that disagree fail together naming the temperature.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "detlogp/fused.hpp"
#include "fused_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

// Row i's temperature: a few distinct values, repeated and interleaved (runs of equal values
// and single rows), 1 among them.
std::vector<float> temperatures_for(int64_t rows) {
  const float values[] = {0.7f, 0.7f, 1.0f, 1.9f, 0.25f, 1.9f, 3.0f};
  std::vector<float> t(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[static_cast<std::size_t>(i)] = values[i % 7];
  return t;
}

// Every row of a per-row call has the bits of the scalar call with that row's temperature:
// bf16 and fp32, with and without a softcap, the reference and every SIMD target, two ranks.
TEST(RowTemperature, EachRowEqualsTheScalarCallWithItsTemperature) {
  const int64_t real = 1000, padded = 1024, rows = 11;
  const Layout layout{real, padded, {{0, 384}, {384, padded}}};
  const auto targets = targets_for(rows, real, 5);
  const GradInputs grads{grads_for(rows, 6), grads_for(rows, 7), grads_for(rows, 8)};
  const std::vector<float> temps = temperatures_for(rows);
  std::vector<const ShardKernels*> kernels = {&reference_kernels()};
  for (const std::string& t : simd_targets()) kernels.push_back(&simd_kernels_for(t));
  for (DType dtype : {DType::bf16, DType::fp32}) {
    FullLogits logits = make_logits(dtype, rows, real, padded, 9, 12.0f);
    for (std::optional<float> cap : {std::optional<float>(), std::optional<float>(5.0f)}) {
      for (const ShardKernels* k : kernels) {
        const VocabParallelLogprob op(*k, "test");
        const std::string what = std::string(to_string(dtype)) + (cap ? " cap " : " ") + k->name();
        const TpRun per_row =
            run_tp(op, logits, layout, targets, {.dtype = dtype, .softcap = cap},
                   {.entropy = true, .exec = {.threads = 2}, .row_temperature = temps}, grads);
        for (float tau : {0.7f, 1.0f, 1.9f, 0.25f, 3.0f}) {
          const TpRun scalar = run_tp(op, logits, layout, targets,
                                      {.dtype = dtype, .temperature = tau, .softcap = cap},
                                      {.entropy = true, .exec = {.threads = 2}}, grads);
          for (int64_t i = 0; i < rows; ++i) {
            if (temps[static_cast<std::size_t>(i)] == tau) {
              expect_row_same(per_row, i, scalar, i, real, what + " tau " + std::to_string(tau));
            }
          }
        }
        // Not the scalar call: the temperatures matter.
        const TpRun ones = run_tp(op, logits, layout, targets, {.dtype = dtype, .softcap = cap},
                                  {.entropy = true}, grads);
        EXPECT_NE(bits(ones.ranks[0].result.lse), bits(per_row.ranks[0].result.lse)) << what;
      }
    }
  }
}

// TP 1, 2, 4, 8 with even and uneven shards, the reference at TP 1 against the SIMD kernels.
TEST(RowTemperature, BitwiseAcrossTpDegreesWithUnevenShards) {
  const int64_t real = 20000, rows = 5, w = 128;
  const auto targets = targets_for(rows, real, 13);
  const GradInputs grads{grads_for(rows, 14), grads_for(rows, 15), grads_for(rows, 16)};
  const std::vector<float> temps = temperatures_for(rows);
  const VocabParallelLogprob simd(simd_kernels(), "test-simd");
  const VocabParallelLogprob ref(reference_kernels(), "test-reference");
  const ForwardOptions fopt{.entropy = true, .exec = {.threads = 2}, .row_temperature = temps};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    for (std::optional<float> cap : {std::optional<float>(), std::optional<float>(30.0f)}) {
      const ContractOptions copt{.dtype = dtype, .softcap = cap};
      const std::string what0 = std::string(to_string(dtype)) + (cap ? " cap" : "");
      const FullLogits base = make_logits(dtype, rows, real, real, 17, 20.0f);
      const Layout one{real, real, {{0, real}}};
      const TpRun want = run_tp(ref, base, one, targets, copt, fopt, grads);
      expect_same(want, run_tp(simd, base, one, targets, copt, fopt, grads), real, what0 + " TP 1");
      for (int64_t tp : {2, 4, 8}) {
        const VocabLayout ml = megatron_bounds(real, tp);
        const FullLogits logits = make_logits(dtype, rows, real, ml.padded_vocab_size, 17, 20.0f);
        const Layout even{real, ml.padded_vocab_size, ml.vocab_shard_bounds};
        // Shards of 1 + 5r tiles, the last one to the padded end.
        Layout odd{real, ml.padded_vocab_size, {}};
        int64_t start = 0;
        for (int64_t r = 0; r < tp; ++r) {
          const int64_t end = r + 1 == tp ? ml.padded_vocab_size : start + (1 + 5 * r) * w;
          odd.bounds.push_back({start, end});
          start = end;
        }
        for (const Layout* layout : {&even, const_cast<const Layout*>(&odd)}) {
          expect_same(
              want, run_tp(simd, logits, *layout, targets, copt, fopt, grads), real,
              what0 + " TP " + std::to_string(tp) + (layout == &even ? " even" : " uneven"));
        }
      }
    }
  }
}

// Rows permuted (logits, targets, temperatures and gradients together), a row alone, and
// thread counts: the same bits for each row.
TEST(RowTemperature, TheTemperatureTravelsWithItsRow) {
  const int64_t real = 700, padded = 768, rows = 9;
  const Layout layout{real, padded, {{0, 256}, {256, padded}}};
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::bf16, rows, real, padded, 21, 15.0f);
  const auto targets = targets_for(rows, real, 22);
  const GradInputs grads{grads_for(rows, 23), grads_for(rows, 24), grads_for(rows, 25)};
  const std::vector<float> temps = temperatures_for(rows);
  const ContractOptions copt{.dtype = DType::bf16, .softcap = 9.0f};
  const TpRun batch =
      run_tp(op, logits, layout, targets, copt,
             {.entropy = true, .exec = {.threads = 1}, .row_temperature = temps}, grads);
  for (int threads : {2, 3}) {
    expect_same(
        batch,
        run_tp(op, logits, layout, targets, copt,
               {.entropy = true, .exec = {.threads = threads}, .row_temperature = temps}, grads),
        real, "threads " + std::to_string(threads));
  }
  std::vector<int64_t> order(static_cast<std::size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(26);
  std::shuffle(order.begin(), order.end(), gen);
  const std::vector<float> ptemps = take(temps, order);
  const TpRun permuted = run_tp(
      op, take_rows(logits, order), layout, take(targets, order), copt,
      {.entropy = true, .row_temperature = ptemps},
      {take(grads.grad_logp, order), take(grads.grad_lse, order), take(grads.grad_entropy, order)});
  for (int64_t i = 0; i < rows; ++i) {
    expect_row_same(permuted, i, batch, order[static_cast<std::size_t>(i)], real, "permuted");
  }
  for (int64_t i : {0, 4, 8}) {
    const auto idx = static_cast<std::size_t>(i);
    const std::vector<float> t1 = {temps[idx]};
    const TpRun alone =
        run_tp(op, take_rows(logits, {i}), layout, {targets[idx]}, copt,
               {.entropy = true, .row_temperature = t1},
               {{grads.grad_logp[idx]}, {grads.grad_lse[idx]}, {grads.grad_entropy[idx]}});
    expect_row_same(alone, 0, batch, i, real, "alone");
  }
}

// logp and LSE within the documented bounds of the float64 values, the gradient close to the
// float64 gradient.
TEST(RowTemperature, AccurateAgainstFloat64) {
  const int64_t real = 5000, padded = 5120, rows = 7;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 31, 8.0f);
  const auto targets = targets_for(rows, real, 32);
  const std::vector<float> temps = temperatures_for(rows);
  const Layout layout{real, padded, {{0, 2560}, {2560, padded}}};
  const TpRun run = run_tp(op, logits, layout, targets, {}, {.row_temperature = temps},
                           {.grad_logp = std::vector<float>(rows, 1.0f)});
  const LogprobResult& r = run.ranks[0].result;
  for (int64_t i = 0; i < rows; ++i) {
    const double tau = temps[static_cast<std::size_t>(i)];
    std::vector<double> z(static_cast<std::size_t>(real));
    double mx = -INFINITY;
    for (int64_t c = 0; c < real; ++c) {
      z[c] = static_cast<double>(logits.at(i, c)) / tau;
      mx = std::max(mx, z[c]);
    }
    double s = 0.0;
    for (int64_t c = 0; c < real; ++c) s += std::exp(z[c] - mx);
    const double lse = mx + std::log(s);
    const double logp = z[targets[i]] - lse;
    const auto ulp = [](double v) { return std::ldexp(1.0, std::ilogb(v) - 23); };
    EXPECT_NEAR(r.lse[i], lse, ulp(lse) / 2 + 1e-5 + 4e-6 * std::abs(lse)) << "row " << i;
    EXPECT_NEAR(r.logp[i], logp, ulp(lse) / 2 + ulp(logp) / 2 + 1e-5 + 4e-6 * std::abs(lse))
        << "row " << i;
    for (int64_t c = 0; c < real; c += 41) {
      const double want = ((c == targets[i] ? 1.0 : 0.0) - std::exp(z[c] - lse)) / tau;
      EXPECT_NEAR(run.grad.at(i, c), want, 1e-5 / tau + 1e-5 * std::abs(want))
          << "row " << i << " column " << c;
    }
  }
}

// A bad value on one rank, a wrong count, a contract temperature other than 1: every rank
// fails, naming the temperature (the bad rank its row and value).
TEST(RowTemperature, BadValuesFailOnEveryRankNamingRowAndValue) {
  const int64_t real = 256, rows = 4;
  const Layout layout{real, real, {{0, 128}, {128, real}}};
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 3);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const std::vector<int64_t> targets = {0, 1, 2, 3};
  const std::pair<float, const char*> bad_values[] = {
      {0.0f, "0"},
      {-1.0f, "-1"},
      {std::numeric_limits<float>::infinity(), "inf"},
      {std::numeric_limits<float>::quiet_NaN(), "nan"}};
  for (const auto& [bad, text] : bad_values) {
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const LogprobContract c = make_contract(layout, r, rows, {});
      std::vector<float> temps = {1.0f, 0.5f, 2.0f, 1.0f};
      if (r == 1) temps[2] = bad;
      const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
      op.forward(logits.shard(b.start, b.end), targets, c, comm, {.row_temperature = temps});
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) {
      EXPECT_THAT(e, HasSubstr(std::string("temperature of row 2 is ") + text));
    }
  }
  // On one rank: the code and field.
  const Layout solo{real, real, {{0, real}}};
  const LogprobContract c1 = make_contract(solo, 0, rows, {});
  const LogprobContract c07 = make_contract(solo, 0, rows, {.temperature = 0.7f});
  const std::vector<float> three = {1.0f, 1.0f, 1.0f};
  const std::vector<float> four = {1.0f, 1.0f, -2.0f, 1.0f};
  const std::vector<float> good = {1.0f, 0.5f, 2.0f, 1.0f};
  struct Case {
    const LogprobContract* c;
    std::span<const float> t;
    ErrorCode code;
  };
  for (const Case& k :
       {Case{&c1, three, ErrorCode::wrong_shape}, Case{&c1, four, ErrorCode::out_of_range},
        Case{&c07, good, ErrorCode::conflicting_fields}}) {
    run_ranks(1, [&](Communicator& comm) {
      try {
        op.forward(logits.shard(0, real), targets, *k.c, comm, {.row_temperature = k.t});
        ADD_FAILURE() << "accepted";
      } catch (const ContractError& e) {
        EXPECT_EQ(e.code(), k.code) << e.what();
        EXPECT_EQ(e.field(), "temperature") << e.what();
      }
    });
  }
}

// Ranks that pass different temperatures (or only some pass them) fail together, naming them.
TEST(RowTemperature, RanksThatDisagreeFailTogether) {
  const int64_t real = 256, rows = 2;
  const Layout layout{real, real, {{0, 128}, {128, real}}};
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 3);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  for (bool second_has_none : {false, true}) {
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const LogprobContract c = make_contract(layout, r, rows, {});
      const std::vector<float> temps = {0.5f, r == 0 ? 2.0f : 2.5f};
      const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
      const std::vector<int64_t> targets = {0, 1};
      ForwardOptions o;
      if (r == 0 || !second_has_none) o.row_temperature = temps;
      try {
        op.forward(logits.shard(b.start, b.end), targets, c, comm, o);
      } catch (const ContractError& e) {
        EXPECT_EQ(e.code(), ErrorCode::ranks_disagree);
        EXPECT_EQ(e.field(), "temperature");
        throw;
      }
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("per-row temperatures"));
    if (second_has_none) {
      EXPECT_THAT(errs.errors[0], HasSubstr("none"));
    }
  }
}

// The fused lm_head: each row's logp, LSE, entropy and grad_hidden are the scalar call's with
// that row's temperature; uniform row temperatures give the scalar call's grad_weight; every
// kernel and TP degree give the same bits.
TEST(RowTemperature, FusedEachRowEqualsTheScalarCall) {
  const int64_t real = 900, hs = 24, rows = 9, w = 64;
  const FullLogits hidden = make_matrix(DType::bf16, rows, hs, 41, 1.0f);
  const Layout base = padded_layout(real, 1, w);
  const std::vector<Layout> layouts = {padded_layout(real, 2, w),
                                       uneven_layout(real, {3, 7, 5}, w)};
  int64_t widest = base.padded;
  for (const Layout& l : layouts) widest = std::max(widest, l.padded);
  const FullLogits weight = make_matrix(DType::bf16, widest, hs, 42, 1.0f);
  const auto targets = targets_for(rows, real, 43);
  const GradInputs grads{grads_for(rows, 44), grads_for(rows, 45), grads_for(rows, 46)};
  const std::vector<float> temps = temperatures_for(rows);
  const ContractOptions copt{.tile_width = w, .softcap = 4.0f};
  const FusedRunOptions o{.fused = {.entropy = true, .row_temperature = temps}, .grads = grads};
  const FusedRun got = run_fused(hidden, weight, base, targets, copt, o);
  for (float tau : {0.7f, 1.0f, 1.9f, 0.25f}) {
    ContractOptions ct = copt;
    ct.temperature = tau;
    const FusedRun scalar =
        run_fused(hidden, weight, base, targets, ct, {.fused = {.entropy = true}, .grads = grads});
    for (int64_t i = 0; i < rows; ++i) {
      if (temps[static_cast<std::size_t>(i)] != tau) continue;
      EXPECT_EQ(canon::bits_of(got.ranks[0].logp[i]), canon::bits_of(scalar.ranks[0].logp[i]));
      EXPECT_EQ(canon::bits_of(got.ranks[0].lse[i]), canon::bits_of(scalar.ranks[0].lse[i]));
      EXPECT_EQ(canon::bits_of(got.ranks[0].entropy[i]),
                canon::bits_of(scalar.ranks[0].entropy[i]));
      for (int64_t h = 0; h < hs; ++h) {
        EXPECT_EQ(canon::bits_of(got.grad_hidden[0][i * hs + h]),
                  canon::bits_of(scalar.grad_hidden[0][i * hs + h]))
            << "row " << i;
      }
    }
    const std::vector<float> uniform(static_cast<std::size_t>(rows), tau);
    FusedRunOptions ou = o;
    ou.fused.row_temperature = uniform;
    const FusedRun u = run_fused(hidden, weight, base, targets, copt, ou);
    EXPECT_EQ(bits(u.grad_weight), bits(scalar.grad_weight)) << "tau " << tau;
    EXPECT_EQ(bits(u.grad_hidden[0]), bits(scalar.grad_hidden[0])) << "tau " << tau;
  }
  const auto same = [&](const FusedRun& b, const std::string& what) {
    for (const FusedLogprobResult& r : b.ranks) {
      EXPECT_EQ(bits(got.ranks[0].logp), bits(r.logp)) << what;
      EXPECT_EQ(bits(got.ranks[0].lse), bits(r.lse)) << what;
      EXPECT_EQ(bits(got.ranks[0].entropy), bits(r.entropy)) << what;
    }
    for (const auto& gh : b.grad_hidden) EXPECT_EQ(bits(got.grad_hidden[0]), bits(gh)) << what;
    EXPECT_EQ(
        bits(std::vector<float>(got.grad_weight.begin(), got.grad_weight.begin() + real * hs)),
        bits(std::vector<float>(b.grad_weight.begin(), b.grad_weight.begin() + real * hs)))
        << what;
  };
  for (const Layout& l : layouts) {
    same(run_fused(hidden, weight, l, targets, copt, o), "TP " + std::to_string(l.bounds.size()));
  }
  for (const std::string& k : fused_kernel_names()) {
    FusedRunOptions ok = o;
    ok.kernel = k;
    ok.fused.exec.threads = 3;
    ok.fused.row_block = 4;
    same(run_fused(hidden, weight, base, targets, copt, ok), "kernel " + k);
  }
}

}  // namespace
}  // namespace detlogp::testing

// The preflight names the part of the call that differs between ranks (rows layout, row count,
// each contract part, tile width, targets), with both ranks' values, on every rank; a rank
// without tokens agrees only with ranks without tokens; and the record stays one fixed size
// whatever the call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "op/preflight_record.hpp"
#include "op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kReal = 1000, kPadded = 1024, kRows = 6;
const Layout kLayout{kReal, kPadded, {{0, 512}, {512, 1024}}};

VocabParallelLogprob op() { return VocabParallelLogprob(simd_kernels(), "test-canonical"); }

std::vector<int64_t> targets() { return {3, 17, 990, 512, 0, 700}; }

// Runs `body` on two in-process ranks; returns each rank's exception message ("" if none).
std::vector<std::string> messages(const std::function<void(Communicator&)>& body) {
  const RankErrors run = rank_errors(2, body);
  EXPECT_TRUE(run.finished) << "hang";
  return run.errors;
}

// A forward whose contract options, row count, targets and rows layout may differ per rank.
void forward(Communicator& comm, ContractOptions o, int64_t rows, std::vector<int64_t> tg,
             Layout layout = kLayout, const std::string& rows_layout = {}) {
  const FullLogits logits = make_logits(o.dtype, rows, kReal, kPadded, 7);
  tg.resize(static_cast<std::size_t>(rows));
  auto c = make_contract(layout, comm.rank(), rows, o);
  auto b = layout.bounds[static_cast<std::size_t>(comm.rank())];
  op().forward(logits.shard(b.start, b.end), tg, c, comm, {.rows_layout = rows_layout});
}

void expect_named(const std::vector<std::string>& errors, const std::string& part,
                  const std::string& value0, const std::string& value1) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    EXPECT_THAT(errors[r],
                HasSubstr("cross-rank preflight failed: ranks disagree on the " + part + ":"))
        << "rank " << r;
    EXPECT_THAT(errors[r], HasSubstr("rank 0 has " + part + " " + value0)) << "rank " << r;
    EXPECT_THAT(errors[r], HasSubstr("rank 1 has " + part + " " + value1)) << "rank " << r;
  }
  EXPECT_EQ(errors[0], errors[1]) << "every rank reports the same disagreement";
}

// One part of the call differs between the ranks (a contract option or the row count); the
// preflight names that part with both ranks' values.
struct Disagreement {
  std::string part;
  ContractOptions options0, options1;  // rank 0's and rank 1's
  std::string value0, value1;          // how the message shows them
  int64_t rows0 = kRows, rows1 = kRows;
};

TEST(PreflightRecord, NamesTheDifferingPart) {
  const std::vector<Disagreement> cases = {
      {"mask",
       {.active = {true, true, true, true, true, true}},
       {.active = {true, false, true, true, true, true}},
       "(num_tokens=6 active=6",
       "(num_tokens=6 active=5"},
      // (the differing field shows in the values: cross_tp_bitwise vs fixed_topology)
      {"reduction",
       {.scope = DeterminismScope::cross_tp_bitwise},
       {.scope = DeterminismScope::fixed_topology},
       "(max_sumexp/",
       "(max_sumexp/"},
      {"temperature", {.temperature = 1.0f}, {.temperature = 0.5f}, "1.0", "0.5"},
      {"softcap", {.softcap = 30.0f}, {.softcap = 50.0f}, "30.0", "50.0"},
      {"softcap", {.softcap = 30.0f}, {}, "30.0", "None"},
      {"dtype", {.dtype = DType::fp32}, {.dtype = DType::bf16}, "fp32", "bf16"},
      {"tile width", {.tile_width = 64}, {.tile_width = 128}, "64", "128"},
      {"row count", {}, {}, "6", "5", kRows, kRows - 1},
  };
  for (const Disagreement& d : cases) {
    SCOPED_TRACE(d.part);
    expect_named(messages([&](Communicator& comm) {
                   const bool first = comm.rank() == 0;
                   forward(comm, first ? d.options0 : d.options1, first ? d.rows0 : d.rows1,
                           targets());
                 }),
                 d.part, d.value0, d.value1);
  }
}

TEST(PreflightRecord, NamesTheSharding) {
  expect_named(messages([](Communicator& comm) {
                 const Layout l{comm.rank() == 0 ? kReal : kReal - 1, kPadded, kLayout.bounds};
                 forward(comm, {}, kRows, targets(), l);
               }),
               "sharding", "(tp_world_size=2 cp_world_size=1 real_vocab_size=1000",
               "(tp_world_size=2 cp_world_size=1 real_vocab_size=999");
}

TEST(PreflightRecord, NamesTheTargets) {
  const auto errors = messages([](Communicator& comm) {
    auto tg = targets();
    if (comm.rank() == 1) tg[2] = 998;
    forward(comm, {}, kRows, tg);
  });
  expect_named(errors, "targets", "digest ", "digest ");
  EXPECT_THAT(errors[0], HasSubstr("(active rows)"));
}

TEST(PreflightRecord, InactiveTargetsDoNotCount) {
  const auto errors = messages([](Communicator& comm) {
    auto tg = targets();
    if (comm.rank() == 1) tg[1] = -100;  // row 1 is inactive on both ranks
    forward(comm, {.active = {true, false, true, true, true, true}}, kRows, tg);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(PreflightRecord, TargetsDigestSeesValueAndPosition) {
  const std::vector<bool> all(4, true);
  const std::vector<int64_t> a{1, 2, 3, 4}, swapped{2, 1, 3, 4}, changed{1, 2, 3, 5};
  const std::string d = op::targets_digest(a, all);
  EXPECT_EQ(d.size(), 32u);
  EXPECT_EQ(d, op::targets_digest(a, all));
  EXPECT_NE(d, op::targets_digest(swapped, all));
  EXPECT_NE(d, op::targets_digest(changed, all));
  EXPECT_NE(d, op::targets_digest(a, {true, true, true, false}));
}

TEST(PreflightRecord, RowsLayoutIsComparedFirstWithItsOwnField) {
  // Rows that are different tokens on the two ranks make every other part differ too (or,
  // worse, agree by chance): the layout is reported first, with a field a binding can act on.
  std::vector<std::string> fields(2);
  const auto errors = messages([&](Communicator& comm) {
    try {
      forward(comm, {}, comm.rank() == 0 ? kRows : kRows - 1, targets(), kLayout,
              comm.rank() == 0 ? "shape [2, 3] rows 6 steps [1, 2]" : "");
    } catch (const ContractError& e) {
      fields[static_cast<std::size_t>(comm.rank())] = e.field();
      EXPECT_EQ(e.code(), ErrorCode::ranks_disagree);
      throw;
    }
  });
  expect_named(errors, "rows layout", "shape [2, 3] rows 6 steps [1, 2]",
               "(rows are the tokens in order)");
  EXPECT_EQ(fields[0], "rows_layout");
  EXPECT_EQ(fields[1], "rows_layout");
  // The same layout on every rank agrees.
  const auto same = messages([](Communicator& comm) {
    forward(comm, {}, kRows, targets(), kLayout, "shape [2, 3] rows 6 steps [1, 2]");
  });
  EXPECT_EQ(same[0], "");
  EXPECT_EQ(same[1], "");
}

TEST(PreflightRecord, NoTokensAgreesOnlyWithNoTokens) {
  const auto empty = messages([](Communicator& comm) { preflight_no_tokens(comm); });
  EXPECT_EQ(empty[0], "");
  EXPECT_EQ(empty[1], "");
  const auto errors = messages([](Communicator& comm) {
    if (comm.rank() == 0) {
      preflight_no_tokens(comm);
    } else {
      forward(comm, {}, kRows, targets());
    }
  });
  expect_named(errors, "row count", "0", "6");
}

TEST(PreflightRecord, FixedSize) {
  // One record per rank whatever the contract: the preflight is one fixed-size all-gather.
  EXPECT_EQ(op::preflight_record_bytes(), static_cast<int64_t>(sizeof(op::PreflightRecord)));
  EXPECT_LT(op::preflight_record_bytes(), 4096);
}

// A transport failure in the preflight says where in the call it happened, then the cause.
TEST(PreflightRecord, TransportFailureNamesThePhaseThenTheCause) {
  // A peer that left (its function returned without calling forward).
  std::string left;
  EXPECT_THROW(run_ranks(2,
                         [&](Communicator& comm) {
                           if (comm.rank() == 1) return;
                           try {
                             forward(comm, {}, kRows, targets());
                           } catch (const std::runtime_error& e) {
                             left = e.what();
                             throw;
                           }
                         }),
               std::runtime_error);
  // Rank 1 may return before or after rank 0 enters the all-gather: the group words the two
  // orders differently ("rank 1 returned from its function while ..." or "rank 0 entered
  // all_gather but rank 1 already returned from its function"); both name the phase first.
  EXPECT_THAT(left, ::testing::AllOf(
                        ::testing::StartsWith("cross-rank preflight all-gather of the forward: "
                                              "in-process rank group aborted: "),
                        ::testing::HasSubstr("rank 1"),
                        ::testing::HasSubstr("returned from its function")));
  // A peer that never arrives: the timeout, after the phase.
  std::string timed_out;
  std::promise<void> rank0_done;
  InProcessGroup group(2, {.collective_timeout = std::chrono::milliseconds(100)});
  std::thread waiter([&] { rank0_done.get_future().wait(); });  // rank 1: never joins
  try {
    forward(group.comm(0), {}, kRows, targets());
  } catch (const std::runtime_error& e) {
    timed_out = e.what();
  }
  rank0_done.set_value();
  waiter.join();
  EXPECT_THAT(timed_out, ::testing::StartsWith(
                             "cross-rank preflight all-gather of the forward: in-process rank "
                             "group aborted: rank 0 timed out after 100 ms in all_gather waiting "
                             "for rank 1"));
}

}  // namespace
}  // namespace detlogp::testing

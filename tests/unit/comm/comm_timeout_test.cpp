// Collective timeouts and limits of the in-process group: the default is finite, a rank that
// never calls forward makes its peer throw the timeout error (naming the collective, the rank
// that did not arrive and the timeout), fail_preflight releases the peers at once, and groups
// above kMaxInProcessRanks are refused.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../op/op_test_util.hpp"
#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"

namespace detlogp {
namespace {

using namespace std::chrono_literals;
using testing::Layout;

// Runs `body` on a thread; fails the test (instead of hanging it) past `limit`.
template <class F>
void within(std::chrono::seconds limit, F body) {
  auto done = std::async(std::launch::async, body);
  ASSERT_EQ(done.wait_for(limit), std::future_status::ready) << "hang";
  done.get();
}

TEST(CollectiveTimeout, DefaultReportsAMissingRankWithinTwoMinutes) {
  // Above a slow first call's skew, well below the ten minutes a stranded rank used to wait.
  EXPECT_EQ(kDefaultCollectiveTimeout, std::chrono::seconds(120));
  EXPECT_EQ(InProcessOptions{}.collective_timeout, kDefaultCollectiveTimeout);
  EXPECT_EQ(kDefaultCollectiveTimeoutSeconds, 120.0);
}

TEST(CollectiveTimeout, GroupsAboveTheLimitAreRefused) {
  EXPECT_NO_THROW(InProcessGroup group(kMaxInProcessRanks));
  try {
    InProcessGroup group(kMaxInProcessRanks + 1);
    FAIL() << "no error";
  } catch (const ContractError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exceeds the limit of " + std::to_string(kMaxInProcessRanks)),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("square"), std::string::npos) << what;
  }
}

struct Fixture {
  Layout layout{1000, 1024, {{0, 512}, {512, 1024}}};
  int64_t rows = 4;
  testing::FullLogits logits = testing::make_logits(DType::fp32, rows, 1000, 1024, 7);
  std::vector<int64_t> targets = {1, 600, 999, 3};
  LogprobContract contract(int rank) const {
    return testing::make_contract(layout, rank, rows, {});
  }
};

TEST(CollectiveTimeout, RankThatNeverCallsForwardTimesOutItsPeer) {
  const Fixture f;
  InProcessGroup group(2, {.collective_timeout = 2s});
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  within(60s, [&] {
    // Rank 1 never calls forward (its thread is not even started).
    const LogprobContract c = f.contract(0);
    const DispatchResult d = get_logprob_op(c);
    try {
      d.op->forward(f.logits.shard(0, 512), f.targets, c, group.comm(0), {});
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank 0 gave up after %.2f s: %s\n", waited, error.c_str());
  EXPECT_NE(error.find("timed out after 2000 ms in all_gather waiting for rank 1"),
            std::string::npos)
      << error;
  EXPECT_GE(waited, 1.9);
  // The late rank finds the group aborted instead of waiting in its turn.
  const LogprobContract c1 = f.contract(1);
  const DispatchResult d1 = get_logprob_op(c1);
  EXPECT_THROW(d1.op->forward(f.logits.shard(512, 1024), f.targets, c1, group.comm(1), {}),
               std::runtime_error);
}

TEST(CollectiveTimeout, FailPreflightReleasesThePeerAtOnce) {
  const Fixture f;
  InProcessGroup group(2, {.collective_timeout = 60s});
  std::vector<std::string> errors(2);
  const auto t0 = std::chrono::steady_clock::now();
  within(60s, [&] {
    std::thread failing([&] {
      try {
        fail_preflight(group.comm(1), "rank 1 could not read its shard");
      } catch (const ContractError& e) {
        errors[1] = e.what();
      }
    });
    const LogprobContract c = f.contract(0);
    const DispatchResult d = get_logprob_op(c);
    try {
      d.op->forward(f.logits.shard(0, 512), f.targets, c, group.comm(0), {});
    } catch (const ContractError& e) {
      errors[0] = e.what();
    }
    failing.join();
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(errors[0].find("rank 1 failed local validation: rank 1 could not read its shard"),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[1], "rank 1 could not read its shard");
}

}  // namespace
}  // namespace detlogp

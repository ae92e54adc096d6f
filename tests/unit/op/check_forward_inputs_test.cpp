// check_forward_inputs: forward's checks before the transport, in forward's order and with its
// messages, for a binding that has no communicator to offer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckForwardInputs, SameOrderAndMessagesAsForward) {
  const int64_t real = 1000, padded = 1024, rows = 4;
  const VocabParallelLogprob op(simd_kernels(), "test-canonical");
  const auto logits = make_logits(DType::fp32, rows, real, padded, 5);
  const std::vector<int64_t> targets = {1, 2, 3, 4};
  SelfComm self;  // one rank: forward reaches its transport check last
  const ContractOptions copt{.tile_width = 64};
  const Layout misaligned{real, padded, {{0, 500}, {500, 1024}}};
  const Layout aligned{real, padded, {{0, 512}, {512, 1024}}};
  struct Case {
    Layout layout;
    int64_t cols;
    std::vector<int64_t> targets;
    const char* phrase;
  };
  for (const Case& k : {Case{misaligned, 400, targets, "has 400 vocab columns"},
                        Case{aligned, 400, targets, "has 400 vocab columns"},
                        Case{aligned, 512, {1, 2}, "one entry per token"}}) {
    const LogprobContract c = make_contract(k.layout, 0, rows, copt);
    const LogitsView v = logits.shard(0, k.cols);
    const std::string early = message_of([&] { check_forward_inputs(v, k.targets, c); });
    EXPECT_THAT(early, HasSubstr(k.phrase));
    EXPECT_EQ(early, message_of([&] { op.forward(v, k.targets, c, self); }));
  }
  // Inputs that are right: no complaint here; forward then fails on the transport alone.
  const LogprobContract c = make_contract(aligned, 0, rows, copt);
  EXPECT_NO_THROW(check_forward_inputs(logits.shard(0, 512), targets, c));
  EXPECT_THAT(message_of([&] { op.forward(logits.shard(0, 512), targets, c, self); }),
              HasSubstr("the communicator has 1 ranks"));
  // deterministic=false against cross_tp_bitwise is a mode problem, reported first too.
  EXPECT_THAT(message_of([&] {
                check_forward_inputs(logits.shard(0, 512), targets, c, {.deterministic = false});
              }),
              HasSubstr("cross_tp_bitwise"));
}

}  // namespace
}  // namespace detlogp::testing

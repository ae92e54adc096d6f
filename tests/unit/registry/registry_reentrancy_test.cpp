// Backend factories that call their registry back (introspection, registration, dispatch), on a
// fresh registry and on the process-wide one, and backends built by several threads at once.
// Each reentrant case runs in a child process with an alarm: a factory that deadlocks on the
// registry's lock then fails the test (SIGALRM) instead of hanging the suite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "detlogp/registry.hpp"
#include "op/op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::ExitedWithCode;
using ::testing::HasSubstr;

constexpr unsigned kWatchdogSeconds = 60;  // only a deadlock comes anywhere near this

LogprobContract tp2_contract() {
  ShardingSpec sh({.tp_rank = 0,
                   .tp_world_size = 2,
                   .vocab_shard_bounds = {{0, 512}, {512, 1024}},
                   .real_vocab_size = 1000,
                   .padded_vocab_size = 1024});
  return LogprobContract(
      {.role = Role::train, .dtype = DType::fp32, .mask = MaskSpec::all_active(4), .sharding = sh});
}

BackendCapability canon_cap(const std::string& id) {
  return cpu_kernels_capability("reference", id, ImplementationKind::reference);
}

// A reference backend whose factory first runs `reenter` (which calls the registry back).
Backend reentrant_backend(const std::string& name, const std::string& id,
                          std::function<void()> reenter) {
  return Backend{name, [id, reenter] {
                   reenter();
                   return std::make_shared<VocabParallelLogprob>(reference_kernels(), id);
                 }};
}

// Runs `body` in a child process under the watchdog; the child exits 0 when every check in it
// held (a failed check exits 1 with the reason on stderr).
#define EXPECT_NO_DEADLOCK(body)                           \
  EXPECT_EXIT(                                             \
      {                                                    \
        ::alarm(kWatchdogSeconds);                         \
        body;                                              \
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0); \
      },                                                   \
      ExitedWithCode(0), "")

void factory_calls_back(Registry& r) {
  std::vector<std::string> seen;
  bool failed_seen = true;
  r.register_logprob_backend(reentrant_backend("REENTRANT", "reentrant",
                                               [&] {
                                                 seen = r.contract_candidates("cpu");
                                                 failed_seen = r.failed_to_load("REENTRANT");
                                                 r.register_logprob_backend(
                                                     cpu_backend("LATE", "late", "reference"),
                                                     canon_cap("late"));
                                               }),
                             canon_cap("reentrant"), "cpu", /*prepend=*/true);
  const DispatchResult d = r.get_logprob_op(tp2_contract());
  EXPECT_EQ(d.actual_backend, "reentrant");
  EXPECT_EQ(seen.front(), "REENTRANT");
  EXPECT_FALSE(failed_seen);
  EXPECT_FALSE(r.failed_to_load("REENTRANT"));
  // The registration made inside the factory took effect, and dispatch still works.
  EXPECT_EQ(r.contract_candidates("cpu").back(), "LATE");
  EXPECT_EQ(r.get_logprob_op(tp2_contract(), "late").actual_backend, "late");
  EXPECT_EQ(r.get_logprob_op(tp2_contract()).op.get(), d.op.get());
}

TEST(RegistryReentrancy, FactoryMayCallItsRegistry) {
  EXPECT_NO_DEADLOCK({
    Registry r;
    factory_calls_back(r);
  });
}

TEST(RegistryReentrancy, FactoryMayCallTheProcessWideRegistry) {
  EXPECT_NO_DEADLOCK({
    factory_calls_back(Registry::global());
    // Every later dispatch of the process still gets through.
    EXPECT_EQ(get_logprob_op(tp2_contract(), kCpuCanonicalBackendId).actual_backend,
              kCpuCanonicalBackendId);
  });
}

TEST(RegistryReentrancy, FactoryThatDispatchesToItselfSkipsItself) {
  EXPECT_NO_DEADLOCK({
    Registry r;
    r.register_logprob_backend(cpu_backend("PLAIN", "plain", "reference"), canon_cap("plain"));
    std::string inner;
    r.register_logprob_backend(
        reentrant_backend("SELF", "self",
                          [&] { inner = r.get_logprob_op(tp2_contract()).actual_backend; }),
        canon_cap("self"), "cpu", /*prepend=*/true);
    EXPECT_EQ(r.get_logprob_op(tp2_contract()).actual_backend, "self");
    EXPECT_EQ(inner, "plain");  // the inner dispatch skipped the backend being built
    EXPECT_FALSE(r.failed_to_load("SELF"));
  });
}

TEST(RegistryReentrancy, ConcurrentFirstDispatchBuildsOnceAndRecordsAFailureOnce) {
  Registry r;
  std::atomic<int> good_calls{0}, bad_calls{0};
  r.register_logprob_backend(Backend{"GOOD",
                                     [&] {
                                       ++good_calls;
                                       return std::make_shared<VocabParallelLogprob>(
                                           reference_kernels(), "good");
                                     }},
                             canon_cap("good"));
  r.register_logprob_backend(Backend{"BAD",
                                     [&]() -> std::shared_ptr<LogprobOp> {
                                       ++bad_calls;
                                       throw std::runtime_error("cannot load");
                                     }},
                             canon_cap("bad"), "cpu", /*prepend=*/true);
  std::vector<const LogprobOp*> ops(8);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < ops.size(); ++t) {
    threads.emplace_back([&, t] { ops[t] = r.get_logprob_op(tp2_contract()).op.get(); });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(good_calls.load(), 1);
  EXPECT_EQ(bad_calls.load(), 1);
  EXPECT_TRUE(r.failed_to_load("BAD"));
  for (const LogprobOp* op : ops) EXPECT_EQ(op, ops[0]);
}

}  // namespace
}  // namespace detlogp::testing

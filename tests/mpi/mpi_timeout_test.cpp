// Under `mpirun -np 2`: what a rank that never calls forward does to its peer.
//   never-forward   rank 1 never calls forward; rank 0's forward must throw std::runtime_error
//                   naming the collective and the 2 s timeout, after which the poisoned
//                   communicator aborts the job (exit 124). Prints "TIMEOUT-OK" on success
//                   (ctest matches it), "TIMEOUT-WRONG" otherwise.
//   fail-preflight  rank 1 calls fail_preflight instead; rank 0's forward throws ContractError
//                   "rank 1 failed local validation" at once and the job ends normally.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "detlogp/errors.hpp"
#include "detlogp/mpi_comm.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "op/op_test_util.hpp"

namespace {

using namespace std::chrono_literals;
using namespace detlogp;

struct Batch {
  testing::Layout layout{1000, 1024, {{0, 512}, {512, 1024}}};
  int64_t rows = 4;
  testing::FullLogits logits = testing::make_logits(DType::fp32, rows, 1000, 1024, 11);
  std::vector<int64_t> targets = {1, 600, 999, 3};
};

void report(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "TIMEOUT-OK" : "TIMEOUT-WRONG", what.c_str());
  std::fflush(stdout);
}

int never_forward(MpiTpCpGroups& groups) {
  if (groups.placement.tp_rank == 1) {
    std::this_thread::sleep_for(60s);  // ended by rank 0's abort long before
    return 1;
  }
  const Batch b;
  const LogprobContract c = testing::make_contract(b.layout, 0, b.rows, {});
  const DispatchResult d = get_logprob_op(c);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    d.op->forward(b.logits.shard(0, 512), b.targets, c, groups.tp_group, {});
    report(false, "forward returned");
  } catch (const std::runtime_error& e) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string what = e.what();
    const bool ok =
        what.find("mpi all_gather timed out after 2000 ms on rank 0 of 2") != std::string::npos &&
        waited >= 1.9 && groups.tp_group.timed_out();
    report(ok, what + " (after " + std::to_string(waited) + " s)");
  }
  return 0;  // the poisoned tp_group aborts the job when it is destroyed
}

int fail_preflight_peer(MpiTpCpGroups& groups) {
  if (groups.placement.tp_rank == 1) {
    try {
      fail_preflight(groups.tp_group, "rank 1 could not read its shard");
    } catch (const ContractError& e) {
      return std::string(e.what()) == "rank 1 could not read its shard" ? 0 : 1;
    }
    return 1;
  }
  const Batch b;
  const LogprobContract c = testing::make_contract(b.layout, 0, b.rows, {});
  const DispatchResult d = get_logprob_op(c);
  try {
    d.op->forward(b.logits.shard(0, 512), b.targets, c, groups.tp_group, {});
  } catch (const ContractError& e) {
    const bool ok =
        std::string(e.what()).find(
            "rank 1 failed local validation: rank 1 could not read its shard") != std::string::npos;
    std::printf("rank 0: %s\n", e.what());
    return ok ? 0 : 1;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  const std::string scenario = argc > 1 ? argv[1] : "";
  int code = 1;
  {
    MpiComm world = MpiComm::world({.collective_timeout = 2s});
    if (world.size() != 2) {
      std::fprintf(stderr, "run with mpirun -np 2\n");
      return 2;
    }
    MpiTpCpGroups groups = split_tp_cp(world, 2);
    if (scenario == "never-forward") code = never_forward(groups);
    if (scenario == "fail-preflight") code = fail_preflight_peer(groups);
  }
  return code;
}

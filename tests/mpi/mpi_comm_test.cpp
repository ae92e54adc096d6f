// MpiComm under mpirun (-np 2 and -np 4): all_gather contents, repetition, barrier, the
// TP x CP split and the conversion of MPI errors into exceptions.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "detlogp/errors.hpp"
#include "detlogp/mpi_comm.hpp"
#include "testing/comm_payload.hpp"

namespace detlogp {
namespace {

using testing::all_gather_in_place;
using testing::payload;
using testing::payload_byte;

// Number of wrong bytes in recv against the expected concatenation.
std::size_t wrong_bytes(const std::vector<std::byte>& recv, int round, int ranks, std::size_t n) {
  std::size_t wrong = 0;
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) wrong += recv[r * n + i] != payload_byte(round, r, i);
  }
  return wrong;
}

int world_size() {
  int n = 0;
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &n), "MPI_Comm_size");
  return n;
}

TEST(MpiComm, WorldBasics) {
  MpiComm world = MpiComm::world();
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(world.rank(), rank);
  EXPECT_EQ(world.size(), world_size());
  EXPECT_GE(world.size(), 2) << "run this test with mpirun -np 2 or more";
  EXPECT_EQ(world.name(), "mpi");
  EXPECT_FALSE(world.owning());
  world.barrier();
}

TEST(MpiComm, AllGatherRankDistinctPayloads) {
  MpiComm world = MpiComm::world();
  const int n = world.size();
  for (std::size_t bytes : {0u, 1u, 3u, 8u, 1000u, (1u << 20) + 3u}) {
    auto send = payload(0, world.rank(), bytes);
    std::vector<std::byte> recv(bytes * n, std::byte{0xEE});
    world.all_gather(send, recv);
    EXPECT_EQ(wrong_bytes(recv, 0, n, bytes), 0u) << "bytes=" << bytes;
  }
}

TEST(MpiComm, AllGatherInPlaceAndTyped) {
  MpiComm world = MpiComm::world();
  const int n = world.size();
  const std::size_t bytes = 40;
  EXPECT_EQ(wrong_bytes(all_gather_in_place(world, 5, bytes), 5, n, bytes), 0u);

  std::vector<double> send = {world.rank() + 0.25, -1.0 * world.rank()};
  std::vector<double> recv(2 * n);
  all_gather<double>(world, send, recv);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(recv[2 * r], r + 0.25);
    EXPECT_EQ(recv[2 * r + 1], -1.0 * r);
  }
}

TEST(MpiComm, ManyRepeatedCollectives) {
  MpiComm world = MpiComm::world();
  const int n = world.size();
  std::size_t wrong = 0;
  for (int round = 0; round < 300; ++round) {
    const std::size_t bytes = static_cast<std::size_t>((round * 37) % 257);
    auto send = payload(round, world.rank(), bytes);
    std::vector<std::byte> recv(bytes * n);
    world.all_gather(send, recv);
    wrong += wrong_bytes(recv, round, n, bytes);
    if (round % 7 == 0) world.barrier();
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(MpiComm, BarrierWaitsForTheLateRank) {
  MpiComm world = MpiComm::world();
  world.barrier();
  const double start = MPI_Wtime();
  if (world.rank() == world.size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  world.barrier();
  const double waited = MPI_Wtime() - start;
  EXPECT_GE(waited, 0.25) << "rank " << world.rank() << " left the barrier early";
}

TEST(MpiComm, LocalPreconditionsAreContractErrors) {
  MpiComm world = MpiComm::world();
  std::vector<std::byte> send(8), recv(8 * world.size() - 1);
  EXPECT_THROW(world.all_gather(send, recv), ContractError);
  EXPECT_THROW(MpiComm(MPI_COMM_NULL), ContractError);
  world.barrier();  // nobody was stranded
}

TEST(MpiComm, BlocksOverIntMaxAreRejectedBeforeMpi) {
  MpiComm world = MpiComm::world();
  // Address space only, never touched (PROT_NONE): any access would crash the test.
  const std::size_t bytes = static_cast<std::size_t>(INT_MAX) + 1;
  const std::size_t total = bytes * (world.size() + 1);
  void* mem = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* base = static_cast<std::byte*>(mem);
  std::span<const std::byte> send(base, bytes);
  std::span<std::byte> recv(base + bytes, bytes * world.size());
  try {
    world.all_gather(send, recv);
    ADD_FAILURE() << "no exception";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("INT_MAX"), std::string::npos) << e.what();
  }
  munmap(mem, total);
  world.barrier();
}

TEST(MpiComm, MpiErrorsBecomeExceptions) {
  MpiComm world = MpiComm::world();
  // A negative color other than MPI_UNDEFINED is invalid: MPI returns MPI_ERR_ARG on every
  // rank, and the job goes on.
  try {
    MpiComm bad = world.split(-7, 0);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI_Comm_split failed: "), std::string::npos) << what;
    EXPECT_NE(what.find("MPI_ERR_ARG"), std::string::npos) << what;
  }
  world.barrier();

  try {
    mpi_check(MPI_ERR_COMM, "MPI_Fake_call");
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("MPI_Fake_call failed: MPI_ERR_COMM", 0), 0u) << what;
  }
  EXPECT_NO_THROW(mpi_check(MPI_SUCCESS, "MPI_Nothing"));
}

TEST(MpiComm, DupAndMoveKeepWorking) {
  MpiComm world = MpiComm::world();
  MpiComm d = world.dup();
  EXPECT_TRUE(d.owning());
  EXPECT_EQ(d.size(), world.size());
  EXPECT_EQ(d.rank(), world.rank());
  MpiComm moved(std::move(d));
  EXPECT_EQ(d.handle(), MPI_COMM_NULL);  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_THROW(d.barrier(), ContractError);
  std::vector<std::byte> send = payload(2, moved.rank(), 6), recv(6 * moved.size());
  moved.all_gather(send, recv);
  EXPECT_EQ(wrong_bytes(recv, 2, moved.size(), 6), 0u);
  MpiComm assigned = world.dup();
  assigned = std::move(moved);  // frees assigned's own duplicate
  assigned.barrier();
}

TEST(MpiComm, SplitTpCpFollowsTheRankMap) {
  MpiComm world = MpiComm::world();
  const int w = world.size();
  struct Layout {
    int tp, cp;
  };
  int layouts_run = 0;
  // The layouts as the world allows, plus the whole world as one TP or one CP group.
  for (Layout l : {Layout{1, 1}, Layout{2, 1}, Layout{1, 2}, Layout{2, 2}, Layout{4, 1},
                   Layout{1, 4}, Layout{w, 1}, Layout{1, w}}) {
    if (w % (l.tp * l.cp) != 0) continue;  // the same decision on every rank
    ++layouts_run;
    MpiTpCpGroups g = split_tp_cp(world, l.tp, l.cp);
    const int r = world.rank();
    const RankPlacement& p = g.placement;
    EXPECT_EQ(p.tp_rank, r % l.tp);
    EXPECT_EQ(p.cp_rank, (r / l.tp) % l.cp);
    EXPECT_EQ(p.dp_rank, r / (l.tp * l.cp));
    EXPECT_EQ(p.dp, w / (l.tp * l.cp));
    EXPECT_EQ(g.tp_group.size(), l.tp);
    EXPECT_EQ(g.tp_group.rank(), p.tp_rank);
    EXPECT_EQ(g.cp_group.size(), l.cp);
    EXPECT_EQ(g.cp_group.rank(), p.cp_rank);
    EXPECT_TRUE(g.tp_group.owning());

    // Members, in group-rank order, by gathering world ranks over each group.
    const int32_t me = r;
    std::vector<int32_t> tp_members(l.tp), cp_members(l.cp);
    all_gather<int32_t>(g.tp_group, std::span<const int32_t>(&me, 1), tp_members);
    all_gather<int32_t>(g.cp_group, std::span<const int32_t>(&me, 1), cp_members);
    for (int k = 0; k < l.tp; ++k) {
      EXPECT_EQ(tp_members[k], p.tp_group_first + k) << "tp=" << l.tp << " cp=" << l.cp;
    }
    for (int k = 0; k < l.cp; ++k) {
      EXPECT_EQ(cp_members[k], p.cp_group_first + k * l.tp) << "tp=" << l.tp << " cp=" << l.cp;
    }
  }
  EXPECT_GE(layouts_run, 3);
  world.barrier();
}

TEST(MpiComm, SplitTpCpRejectsWorldsThatDoNotFit) {
  MpiComm world = MpiComm::world();
  const int bad_tp = world.size() + 1;  // never divides the world
  try {
    split_tp_cp(world, bad_tp, 1);
    ADD_FAILURE() << "no exception";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("does not match TP*CP"), std::string::npos) << e.what();
  }
  if (world.size() == 4) {
    EXPECT_THROW(split_tp_cp(world, 3, 1), ContractError);
  }
  EXPECT_THROW(split_tp_cp(world, 2, 0), ContractError);
  world.barrier();  // every rank threw locally; nobody waits in a split
}

TEST(MpiSession, NestedSessionDoesNotOwnMpi) {
  // MPI is already initialised by main's session: a second session only checks the level.
  MpiSession nested;
  EXPECT_FALSE(nested.owns_mpi());
  EXPECT_GE(nested.thread_level(), MPI_THREAD_FUNNELED);
}

}  // namespace
}  // namespace detlogp

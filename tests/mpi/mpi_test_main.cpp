// main() for GoogleTest executables that run under mpirun: every rank runs every test, only
// rank 0 prints the usual report, other ranks print their failed assertions prefixed with their
// rank, and the failure flag is reduced so that every rank exits non-zero if any rank failed.
//
// Tests must call collectives unconditionally (EXPECT_*, not ASSERT_*, between collectives):
// a rank that skips a collective strands the others until mpirun's --timeout ends the job.
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>
#include <string>

#include "detlogp/mpi_comm.hpp"

namespace {

// Prints failed assertions of a non-zero rank, prefixed "[rank R]".
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock inside OnTestPartResult: gtest holds its
  // mutex there. Remember the name when the test starts instead.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    detlogp::MpiSession session(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    detlogp::mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    if (rank != 0) {
      ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
    }
    const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    int any_failed = 0;
    detlogp::mpi_check(
        MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
        "MPI_Allreduce");
    if (rank == 0 && any_failed && !local_failed) {
      std::fprintf(stderr, "FAILED on another rank (see the [rank R] lines above)\n");
    }
    return any_failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi test main: %s\n", e.what());
    std::fflush(stderr);
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    // Other ranks may be waiting for this one: end the whole job rather than hang.
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}

#pragma once
// MpiComm: the Communicator over MPI (Open MPI), in the detlogp::mpi library
// (target_link_libraries(app PRIVATE detlogp::mpi)). Only this header includes <mpi.h>.
//
// Every MPI call is checked: a communicator MpiComm uses gets MPI_ERRORS_RETURN, and a failing
// call throws std::runtime_error naming the call and carrying MPI_Error_string's text. Nothing
// aborts the job silently.
//
// Collective timeout (like NCCL's watchdog): all_gather, barrier, split and dup are nonblocking
// MPI operations polled against a deadline (MpiCommOptions::collective_timeout, by default
// kDefaultCollectiveTimeout). On expiry the waiting rank throws std::runtime_error
// "mpi <collective> timed out after T ms on rank r of n: ..." and the communicator is poisoned:
// every later call on it throws the same error, and destroying it writes the error to stderr
// and calls MPI_Abort(comm, kMpiTimeoutExitCode), so the job ends instead of hanging (an
// unfinished MPI collective can be neither cancelled nor finalized). MPI does not say which
// rank did not arrive.
//
// Typical executable (launch with mpirun; see docs/comm.md):
//   detlogp::MpiSession session(&argc, &argv);
//   detlogp::MpiComm world = detlogp::MpiComm::world();
//   detlogp::MpiTpCpGroups groups = detlogp::split_tp_cp(world, /*tp=*/2, /*cp=*/2);
//   ... operator(..., groups.tp_group) ...

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "detlogp/comm.hpp"

namespace detlogp {

// The exit code of a job that MpiComm aborts after a collective timeout (as timeout(1)).
inline constexpr int kMpiTimeoutExitCode = 124;

struct MpiCommOptions {
  // How long one rank waits in a collective for the others; zero: no limit.
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
};

// Throws std::runtime_error "<call> failed: <MPI_Error_string text> (MPI error code C, class K)"
// unless rc == MPI_SUCCESS. For the caller's own MPI calls too.
void mpi_check(int rc, std::string_view call);

// Initialises MPI for an executable (MPI_Init_thread) and finalises it when destroyed. If MPI
// is already initialised (by the application), the session only checks the thread level and
// leaves MPI_Finalize to whoever initialised it. Throws std::runtime_error if MPI cannot be
// initialised, was already finalised, or provides less than `required` thread support.
class MpiSession {
 public:
  explicit MpiSession(int* argc = nullptr, char*** argv = nullptr,
                      int required = MPI_THREAD_FUNNELED);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int thread_level() const { return provided_; }
  bool owns_mpi() const { return owns_; }

 private:
  int provided_ = 0;
  bool owns_ = false;
};

class MpiComm final : public Communicator {
 public:
  // Non-owning view of MPI_COMM_WORLD (sets MPI_ERRORS_RETURN on it).
  static MpiComm world(MpiCommOptions options = {});
  // Non-owning: wraps `comm`, which the caller keeps alive and frees. ContractError for
  // MPI_COMM_NULL or a negative timeout; std::runtime_error if MPI is not initialised.
  explicit MpiComm(MPI_Comm comm, MpiCommOptions options = {});
  // Owning: takes `comm` and calls MPI_Comm_free on it in the destructor.
  static MpiComm adopt(MPI_Comm comm, MpiCommOptions options = {});

  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  // Frees an owned communicator (unless MPI is already finalised); never throws. After a
  // collective timeout: MPI_Abort (see the top of this file).
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void barrier() override;

  MPI_Comm handle() const { return comm_; }
  bool owning() const { return owning_; }

  std::chrono::milliseconds collective_timeout() const { return options_.collective_timeout; }
  // ContractError for a negative timeout.
  void set_collective_timeout(std::chrono::milliseconds timeout);
  // Whether a collective on this communicator timed out (it is then unusable).
  bool timed_out() const { return !timeout_error_.empty(); }

  // MPI_Comm_split, collective over this communicator (preceded by a timed all-gather of the
  // colors, so that a rank that never arrives times out instead of hanging the split); the
  // result is owning and has this communicator's options. color must be >= 0 (MPI reports
  // other values as an error, which becomes std::runtime_error).
  MpiComm split(int color, int key) const;
  // MPI_Comm_idup, collective and timed; the result is owning, with the same options.
  MpiComm dup() const;

 protected:
  // MPI_Iallgather of MPI_BYTE through buffers the communicator owns (so that a collective
  // left unfinished by a timeout never writes into the caller's memory), polled against the
  // deadline. A block of more than INT_MAX bytes is a ContractError (MPI counts are int).
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool in_place) override;

 private:
  MpiComm(MPI_Comm comm, bool owning, MpiCommOptions options);
  void release() noexcept;
  void require_usable(const char* what) const;
  // Polls `request` until it completes or the deadline passes (then poisons and throws).
  void wait(MPI_Request& request, const char* collective) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owning_ = false;
  int rank_ = 0;
  int size_ = 0;
  MpiCommOptions options_;
  // Set by a timeout; the buffers of the unfinished collective stay alive until the abort.
  mutable std::string timeout_error_;
  mutable std::shared_ptr<void> pending_;
};

// The communicators of one rank in a TP x CP (x DP) layout, with the rank map of
// place_rank() (comm.hpp): TP group = contiguous block of tp world ranks (ordered by tp_rank),
// CP group = the cp ranks with this rank's tp_rank and dp_rank (ordered by cp_rank).
struct MpiTpCpGroups {
  MpiComm tp_group;  // owning; size tp, rank tp_rank
  MpiComm cp_group;  // owning; size cp, rank cp_rank
  RankPlacement placement;
};

// Collective over `world`. ContractError (before any MPI collective, the same on every rank)
// if world.size() is not a multiple of tp * cp ("does not match TP*CP") or tp, cp < 1.
MpiTpCpGroups split_tp_cp(const MpiComm& world, int tp, int cp = 1);

}  // namespace detlogp

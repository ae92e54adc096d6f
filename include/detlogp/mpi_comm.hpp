#pragma once
// MpiComm: the Communicator over MPI (Open MPI), in the detlogp::mpi library
// (target_link_libraries(app PRIVATE detlogp::mpi)). Only this header includes <mpi.h>.
//
// Every MPI call is checked: a communicator MpiComm uses gets MPI_ERRORS_RETURN, and a failing
// call throws std::runtime_error naming the call and carrying MPI_Error_string's text. Nothing
// aborts the job silently.
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

#include <string>
#include <string_view>

#include "detlogp/comm.hpp"

namespace detlogp {

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
  static MpiComm world();
  // Non-owning: wraps `comm`, which the caller keeps alive and frees. ContractError for
  // MPI_COMM_NULL; std::runtime_error if MPI is not initialised.
  explicit MpiComm(MPI_Comm comm);
  // Owning: takes `comm` and calls MPI_Comm_free on it in the destructor.
  static MpiComm adopt(MPI_Comm comm);

  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  // Frees an owned communicator (unless MPI is already finalised); never throws.
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void barrier() override;

  MPI_Comm handle() const { return comm_; }
  bool owning() const { return owning_; }

  // MPI_Comm_split, collective over this communicator; the result is owning. color must be
  // >= 0 (MPI reports other values as an error, which becomes std::runtime_error).
  MpiComm split(int color, int key) const;
  // MPI_Comm_dup, collective; the result is owning.
  MpiComm dup() const;

 protected:
  // MPI_Allgather of MPI_BYTE (MPI_IN_PLACE when in_place). A block of more than INT_MAX
  // bytes is a ContractError (MPI counts are int).
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool in_place) override;

 private:
  MpiComm(MPI_Comm comm, bool owning);
  void release() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owning_ = false;
  int rank_ = 0;
  int size_ = 0;
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

// MpiComm, MpiSession and the TP x CP split over Open MPI.
#include "detlogp/mpi_comm.hpp"

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>

#include "detlogp/errors.hpp"

namespace detlogp {

namespace {

std::string error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS || len <= 0) return "unknown MPI error";
  return std::string(buf, static_cast<std::size_t>(len));
}

void require_initialized(const char* what) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw std::runtime_error(std::string(what) + ": MPI is " +
                             (finalized ? "already finalized" : "not initialized") +
                             " (create a detlogp::MpiSession first)");
  }
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown thread level";
  }
}

}  // namespace

void mpi_check(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  int error_class = -1;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = -1;
  throw std::runtime_error(std::string(call) + " failed: " + error_text(rc) + " (MPI error code " +
                           std::to_string(rc) + ", class " + std::to_string(error_class) + ")");
}

// ---------------------------------------------------------------------------------------------
// MpiSession

MpiSession::MpiSession(int* argc, char*** argv, int required) {
  int initialized = 0;
  int finalized = 0;
  mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
  mpi_check(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized) {
    throw std::runtime_error(
        "MpiSession: MPI was already finalized; it cannot be initialized "
        "again in this process");
  }
  if (initialized) {
    mpi_check(MPI_Query_thread(&provided_), "MPI_Query_thread");
  } else {
    mpi_check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
    owns_ = true;
    // Errors on the world communicator come back as codes, not as a job abort.
    mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
  }
  if (provided_ < required) {
    if (owns_) MPI_Finalize();
    throw std::runtime_error(std::string("MpiSession: MPI provides ") +
                             thread_level_name(provided_) + " but " + thread_level_name(required) +
                             " is required");
  }
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(MPI_Comm comm) : MpiComm(comm, false) {}

MpiComm::MpiComm(MPI_Comm comm, bool owning) : comm_(comm), owning_(owning) {
  if (comm == MPI_COMM_NULL) {
    throw ContractError("MpiComm: the communicator is MPI_COMM_NULL");
  }
  try {
    require_initialized("MpiComm");
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  } catch (...) {
    release();
    throw;
  }
}

MpiComm MpiComm::world() { return MpiComm(MPI_COMM_WORLD, false); }

MpiComm MpiComm::adopt(MPI_Comm comm) { return MpiComm(comm, true); }

MpiComm::MpiComm(MpiComm&& other) noexcept
    : Communicator(other),
      comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      owning_(std::exchange(other.owning_, false)),
      rank_(other.rank_),
      size_(other.size_) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owning_ = std::exchange(other.owning_, false);
    rank_ = other.rank_;
    size_ = other.size_;
  }
  return *this;
}

MpiComm::~MpiComm() { release(); }

void MpiComm::release() noexcept {
  if (owning_ && comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  comm_ = MPI_COMM_NULL;
  owning_ = false;
}

void MpiComm::barrier() {
  if (comm_ == MPI_COMM_NULL) throw ContractError("MpiComm::barrier on a moved-from MpiComm");
  mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiComm::do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                            bool in_place) {
  if (comm_ == MPI_COMM_NULL) throw ContractError("MpiComm::all_gather on a moved-from MpiComm");
  if (send.size() > static_cast<std::size_t>(INT_MAX)) {
    throw ContractError("mpi all_gather: " + std::to_string(send.size()) +
                        " bytes per rank exceeds INT_MAX (" + std::to_string(INT_MAX) +
                        "), the largest MPI count; send it in smaller pieces");
  }
  const int count = static_cast<int>(send.size());
  // Some MPI builds reject a null buffer even with count 0.
  std::byte dummy{};
  void* recv_ptr = recv.empty() ? &dummy : recv.data();
  if (in_place) {
    mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv_ptr, count, MPI_BYTE, comm_),
              "MPI_Allgather");
  } else {
    const void* send_ptr = send.empty() ? &dummy : send.data();
    mpi_check(MPI_Allgather(send_ptr, count, MPI_BYTE, recv_ptr, count, MPI_BYTE, comm_),
              "MPI_Allgather");
  }
}

MpiComm MpiComm::split(int color, int key) const {
  if (comm_ == MPI_COMM_NULL) throw ContractError("MpiComm::split on a moved-from MpiComm");
  MPI_Comm out = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  if (out == MPI_COMM_NULL) {
    throw std::runtime_error("MPI_Comm_split returned MPI_COMM_NULL for color " +
                             std::to_string(color));
  }
  return adopt(out);
}

MpiComm MpiComm::dup() const {
  if (comm_ == MPI_COMM_NULL) throw ContractError("MpiComm::dup on a moved-from MpiComm");
  MPI_Comm out = MPI_COMM_NULL;
  mpi_check(MPI_Comm_dup(comm_, &out), "MPI_Comm_dup");
  return adopt(out);
}

// ---------------------------------------------------------------------------------------------
// TP x CP split

MpiTpCpGroups split_tp_cp(const MpiComm& world, int tp, int cp) {
  // Local and identical on every rank (same size, same arguments), so every rank throws.
  const RankPlacement p = place_rank(world.rank(), world.size(), tp, cp);
  MpiComm tp_group = world.split(/*color=*/world.rank() / tp, /*key=*/p.tp_rank);
  MpiComm cp_group = world.split(/*color=*/p.dp_rank * tp + p.tp_rank, /*key=*/p.cp_rank);
  if (tp_group.size() != tp || tp_group.rank() != p.tp_rank || cp_group.size() != cp ||
      cp_group.rank() != p.cp_rank) {
    throw std::runtime_error(
        "split_tp_cp: MPI_Comm_split produced groups that do not follow "
        "the rank map (tp group rank " +
        std::to_string(tp_group.rank()) + "/" + std::to_string(tp_group.size()) +
        ", cp group rank " + std::to_string(cp_group.rank()) + "/" +
        std::to_string(cp_group.size()) + ")");
  }
  return MpiTpCpGroups{std::move(tp_group), std::move(cp_group), p};
}

}  // namespace detlogp

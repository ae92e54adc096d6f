// MpiComm, MpiSession and the TP x CP split over Open MPI.
#include "detlogp/mpi_comm.hpp"

#include <climits>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

namespace {

void check_options(const MpiCommOptions& options) {
  if (options.collective_timeout.count() < 0) {
    throw ContractError("MpiComm: collective_timeout must be >= 0 ms (0 = no limit); got " +
                        std::to_string(options.collective_timeout.count()) + " ms");
  }
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, MpiCommOptions options) : MpiComm(comm, false, options) {}

MpiComm::MpiComm(MPI_Comm comm, bool owning, MpiCommOptions options)
    : comm_(comm), owning_(owning), options_(options) {
  if (comm == MPI_COMM_NULL) {
    throw ContractError("MpiComm: the communicator is MPI_COMM_NULL");
  }
  try {
    check_options(options_);
    require_initialized("MpiComm");
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  } catch (...) {
    release();
    throw;
  }
}

MpiComm MpiComm::world(MpiCommOptions options) { return MpiComm(MPI_COMM_WORLD, false, options); }

MpiComm MpiComm::adopt(MPI_Comm comm, MpiCommOptions options) {
  return MpiComm(comm, true, options);
}

MpiComm::MpiComm(MpiComm&& other) noexcept
    : Communicator(other),
      comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      owning_(std::exchange(other.owning_, false)),
      rank_(other.rank_),
      size_(other.size_),
      options_(other.options_),
      timeout_error_(std::exchange(other.timeout_error_, std::string())),
      pending_(std::move(other.pending_)) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owning_ = std::exchange(other.owning_, false);
    rank_ = other.rank_;
    size_ = other.size_;
    options_ = other.options_;
    timeout_error_ = std::exchange(other.timeout_error_, std::string());
    pending_ = std::move(other.pending_);
  }
  return *this;
}

MpiComm::~MpiComm() { release(); }

void MpiComm::release() noexcept {
  if (!timeout_error_.empty()) {
    // An unfinished collective: neither MPI_Comm_free nor MPI_Finalize may run now. End the job.
    const std::string line = "detlogp: " + timeout_error_ + "; aborting the job (MPI_Abort)\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, kMpiTimeoutExitCode);
  }
  if (owning_ && comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  comm_ = MPI_COMM_NULL;
  owning_ = false;
}

void MpiComm::set_collective_timeout(std::chrono::milliseconds timeout) {
  const MpiCommOptions options{.collective_timeout = timeout};
  check_options(options);
  options_ = options;
}

void MpiComm::require_usable(const char* what) const {
  if (comm_ == MPI_COMM_NULL) {
    throw ContractError(std::string("MpiComm::") + what + " on a moved-from MpiComm");
  }
  if (!timeout_error_.empty()) throw std::runtime_error(timeout_error_);
}

void MpiComm::wait(MPI_Request& request, const char* collective) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto limit = options_.collective_timeout;
  // Spin briefly (a collective usually completes in microseconds), then back off to sleeps of
  // up to 1 ms so that a long wait costs no core.
  auto pause = std::chrono::microseconds(0);
  for (long polls = 0;; ++polls) {
    int done = 0;
    mpi_check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (limit.count() > 0 && clock::now() - start >= limit) {
      timeout_error_ = "mpi " + std::string(collective) + " timed out after " +
                       std::to_string(limit.count()) + " ms on rank " + std::to_string(rank_) +
                       " of " + std::to_string(size_) +
                       ": another rank did not arrive (MPI does not say which; a rank that "
                       "failed before a collective should call fail_preflight, or the ranks "
                       "called different collectives)";
      throw std::runtime_error(timeout_error_);
    }
    if (polls > 2000) {
      pause = std::min<std::chrono::microseconds>(pause + std::chrono::microseconds(20),
                                                  std::chrono::microseconds(1000));
      std::this_thread::sleep_for(pause);
    }
  }
}

void MpiComm::barrier() {
  require_usable("barrier");
  MPI_Request request = MPI_REQUEST_NULL;
  mpi_check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait(request, "barrier");
}

void MpiComm::do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                            bool in_place) {
  require_usable("all_gather");
  if (send.size() > static_cast<std::size_t>(INT_MAX)) {
    throw ContractError("mpi all_gather: " + std::to_string(send.size()) +
                        " bytes per rank exceeds INT_MAX (" + std::to_string(INT_MAX) +
                        "), the largest MPI count; send it in smaller pieces");
  }
  const int count = static_cast<int>(send.size());
  // Buffers of our own: [send block][recv blocks] (at least one byte: some MPI builds reject a
  // null buffer even with count 0). After a timeout they stay alive in pending_.
  auto staging = std::make_shared<std::vector<std::byte>>(send.size() + recv.size() + 1);
  std::byte* own_send = staging->data();
  std::byte* own_recv = staging->data() + send.size();
  if (!send.empty()) {
    std::memcpy(
        own_send,
        in_place ? recv.data() + static_cast<std::size_t>(rank_) * send.size() : send.data(),
        send.size());
  }
  MPI_Request request = MPI_REQUEST_NULL;
  mpi_check(MPI_Iallgather(own_send, count, MPI_BYTE, own_recv, count, MPI_BYTE, comm_, &request),
            "MPI_Iallgather");
  try {
    wait(request, "all_gather");
  } catch (...) {
    if (!timeout_error_.empty()) pending_ = staging;
    throw;
  }
  if (!recv.empty()) std::memcpy(recv.data(), own_recv, recv.size());
}

MpiComm MpiComm::split(int color, int key) const {
  require_usable("split");
  // A timed all-gather first: once every rank has reached it, the blocking split completes.
  const int mine[2] = {color, key};
  std::vector<int> all(static_cast<std::size_t>(size_) * 2);
  const_cast<MpiComm*>(this)->all_gather(std::as_bytes(std::span<const int>(mine)),
                                         std::as_writable_bytes(std::span<int>(all)));
  MPI_Comm out = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  if (out == MPI_COMM_NULL) {
    throw std::runtime_error("MPI_Comm_split returned MPI_COMM_NULL for color " +
                             std::to_string(color));
  }
  return adopt(out, options_);
}

MpiComm MpiComm::dup() const {
  require_usable("dup");
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  mpi_check(MPI_Comm_idup(comm_, &out, &request), "MPI_Comm_idup");
  wait(request, "dup");
  return adopt(out, options_);
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

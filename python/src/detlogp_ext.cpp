// _detlogp: the pybind11 layer under the Python package `detlogp` (docs/python.md).
//
// This module is private: the pure-Python package (python/detlogp/) does the Python-side
// checks (docs/python.md; bools are not integers, mask elements must be real
// bools, ...) and turns NumPy arrays and torch tensors into raw views. Everything else is
// validated here by the C++ library, with its messages:
//   detlogp::ContractError -> detlogp.LogprobContractError (a ValueError subclass)
//   std::runtime_error     -> RuntimeError
// Enums cross this boundary as their value strings and are parsed by detlogp::parse_enum.
//
// Logits are never copied: forward receives the address, dtype, shape and row stride of the
// caller's buffer, and the returned ForwardHandle keeps a reference to the Python object that
// owns it until the handle (and with it backward's view of the logits) is gone. Forward and
// backward run without the GIL; the torch.distributed communicator takes it back only inside
// its collectives.

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "detlogp/capability.hpp"
#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/version.hpp"
#include "functional_bindings.hpp"
#include "python_bindings.hpp"

#ifdef DETLOGP_HAVE_CUDA
#include "detlogp/cuda.hpp"
#include "detlogp/cuda_registry.hpp"
#endif

namespace py = pybind11;

namespace {

using detlogp::BackendCapability;
using detlogp::Communicator;
using detlogp::ContractError;
using detlogp::DType;
using detlogp::LogprobContract;
using detlogp::LogprobOp;
using detlogp::MaskSpec;
using detlogp::OutputSpec;
using detlogp::ReductionSpec;
using detlogp::ShardingSpec;

using Bounds = std::vector<std::pair<int64_t, int64_t>>;

template <detlogp::ContractEnum E>
std::string str(E e) {
  return std::string(detlogp::to_string(e));
}

template <detlogp::ContractEnum E>
std::vector<std::string> strs(const std::set<E>& values) {
  std::vector<std::string> out;
  for (E e : values) out.push_back(str(e));
  return out;
}

template <detlogp::ContractEnum E>
std::set<E> parse_set(const std::vector<std::string>& values, std::string_view field) {
  std::set<E> out;
  for (const std::string& v : values) out.insert(detlogp::parse_enum<E>(v, field));
  return out;
}

Bounds bounds_of(const ShardingSpec& s) {
  Bounds out;
  for (const detlogp::VocabRange& r : s.vocab_shard_bounds()) out.emplace_back(r.start, r.end);
  return out;
}

std::vector<detlogp::VocabRange> ranges_of(const Bounds& b) {
  std::vector<detlogp::VocabRange> out;
  for (const auto& [s, e] : b) out.push_back({s, e});
  return out;
}

// ---------------------------------------------------------------------------------------------
// A Communicator whose collectives call back into Python (a torch.distributed process group,
// see python/detlogp/_comm.py). The operator calls it with the GIL released; every callback
// takes the GIL for its duration and turns a Python exception into std::runtime_error (never
// lets a py::error_already_set travel through the C++ operator).

class PyCallbackComm final : public Communicator {
 public:
  // all_gather_fn(send: memoryview, recv: memoryview, in_place: bool) fills recv with every
  // rank's send bytes in rank order; barrier_fn() returns once every rank has entered it.
  PyCallbackComm(int rank, int size, std::string name, py::function all_gather_fn,
                 py::function barrier_fn)
      : rank_(rank),
        size_(size),
        name_(std::move(name)),
        all_gather_fn_(std::move(all_gather_fn)),
        barrier_fn_(std::move(barrier_fn)) {
    if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
      throw ContractError("communicator rank=" + std::to_string(rank_) +
                          " and size=" + std::to_string(size_) + " must satisfy 0 <= rank < size");
    }
  }

  ~PyCallbackComm() override {
    py::gil_scoped_acquire gil;
    all_gather_fn_ = py::function();
    barrier_fn_ = py::function();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void barrier() override {
    py::gil_scoped_acquire gil;
    try {
      barrier_fn_();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(transport_failure(e, "barrier"));
    }
  }

 protected:
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool in_place) override {
    py::gil_scoped_acquire gil;
    try {
      static std::byte empty[1];
      // The Python side only reads `send`; it is exposed writable because torch.frombuffer
      // warns about read-only buffers.
      auto* send_ptr = send.empty() ? empty : const_cast<std::byte*>(send.data());
      auto* recv_ptr = recv.empty() ? empty : recv.data();
      py::memoryview send_view = py::memoryview::from_memory(
          static_cast<void*>(send_ptr), static_cast<py::ssize_t>(send.size()), false);
      py::memoryview recv_view = py::memoryview::from_memory(
          static_cast<void*>(recv_ptr), static_cast<py::ssize_t>(recv.size()), false);
      all_gather_fn_(send_view, recv_view, in_place);
      // The views must not outlive this call: release them so that a Python reference kept
      // by mistake cannot reach freed memory. Best effort: a view still exported (a tensor
      // that is not yet garbage) refuses, and the gather itself has succeeded.
      for (py::memoryview* view : {&send_view, &recv_view}) {
        try {
          view->attr("release")();
        } catch (py::error_already_set&) {
        }
      }
    } catch (py::error_already_set& e) {
      throw std::runtime_error(transport_failure(e, "all_gather"));
    }
  }

 private:
  // A RuntimeError is the transport's own report (TorchDistributedComm names the collective,
  // the rank and the cause first): passed on as it is. Anything else is a fault in the
  // callback, prefixed with where it happened.
  std::string transport_failure(py::error_already_set& e, const char* collective) const {
    if (e.matches(PyExc_RuntimeError)) return py::str(e.value());
    return name_ + " " + collective + " failed on rank " + std::to_string(rank_) + ": " + e.what();
  }

  int rank_;
  int size_;
  std::string name_;
  py::function all_gather_fn_;
  py::function barrier_fn_;
};

// ---------------------------------------------------------------------------------------------
// Raw views of caller memory, built by the Python package from a torch tensor or NumPy array.

DType parse_dtype(const std::string& s) { return detlogp::parse_dtype(s, "local_logits dtype"); }

detlogp::LogitsView logits_view(uintptr_t ptr, const std::string& dtype, int64_t rows, int64_t cols,
                                int64_t row_stride) {
  return detlogp::LogitsView{.data = reinterpret_cast<const void*>(ptr),
                             .dtype = parse_dtype(dtype),
                             .rows = rows,
                             .cols = cols,
                             .row_stride = row_stride};
}

// fp32 per-token vector as a fresh NumPy array (the outputs are [tokens], never [tokens, V]).
py::array_t<float> to_numpy(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(float));
  return out;
}

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

std::span<const float> span_of(const std::optional<F32Array>& a) {
  if (!a) return {};
  return {a->data(), static_cast<std::size_t>(a->size())};
}

// The result of one forward: outputs, backward's saved state and the owner of the logits.
struct ForwardHandle {
  std::shared_ptr<const LogprobOp> op;
  detlogp::LogprobResult result;
  py::object logits_owner;  // keeps the caller's logits buffer alive
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::fp32;
  bool entropy = false;
};

std::shared_ptr<ForwardHandle> run_forward(
    const std::shared_ptr<LogprobOp>& op, uintptr_t ptr, const std::string& dtype, int64_t rows,
    int64_t cols, int64_t row_stride, py::object owner, const I64Array& targets,
    const LogprobContract& contract, const std::shared_ptr<Communicator>& comm, bool deterministic,
    bool validate, bool entropy, int threads, bool entropy_grad, const std::string& rows_layout) {
  if (!op) throw ContractError("op must be a LogprobOp");
  detlogp::LogitsView view;
  try {
    view = logits_view(ptr, dtype, rows, cols, row_stride);
    if (targets.ndim() != 1) {
      throw ContractError("target_ids must be 1-D with one entry per token; got " +
                          std::to_string(targets.ndim()) + " dimensions");
    }
  } catch (const ContractError& e) {
    // The other ranks are about to wait in forward's preflight: fail together with them.
    if (comm) {
      py::gil_scoped_release nogil;
      detlogp::fail_preflight(*comm, e.what());
    }
    throw;
  }
  const std::span<const int64_t> tg(targets.data(), static_cast<std::size_t>(targets.size()));
  const detlogp::ForwardOptions opt{.deterministic = deterministic,
                                    .validate = validate,
                                    .entropy = entropy,
                                    .entropy_grad = entropy_grad,
                                    .exec = {.threads = threads},
                                    .rows_layout = rows_layout};
  auto handle = std::make_shared<ForwardHandle>();
  handle->op = op;
  handle->logits_owner = std::move(owner);
  handle->rows = rows;
  handle->cols = cols;
  handle->dtype = view.dtype;
  handle->entropy = entropy;
  {
    py::gil_scoped_release nogil;
    detlogp::SelfComm self;
    Communicator& c = comm ? *comm : static_cast<Communicator&>(self);
    handle->result = op->forward(view, tg, contract, c, opt);
  }
  return handle;
}

void run_backward(ForwardHandle& h, const std::optional<F32Array>& grad_logp,
                  const std::optional<F32Array>& grad_lse,
                  const std::optional<F32Array>& grad_entropy, uintptr_t out_ptr,
                  const std::string& out_dtype, int64_t out_rows, int64_t out_cols,
                  int64_t out_row_stride) {
  const detlogp::MutableLogitsView grad{.data = reinterpret_cast<void*>(out_ptr),
                                        .dtype = parse_dtype(out_dtype),
                                        .rows = out_rows,
                                        .cols = out_cols,
                                        .row_stride = out_row_stride};
  for (const auto* g : {&grad_logp, &grad_lse, &grad_entropy}) {
    if (*g && (*g)->ndim() != 1) throw ContractError("incoming gradients must be 1-D [tokens]");
  }
  const detlogp::LogprobGrads grads{.grad_logp = span_of(grad_logp),
                                    .grad_lse = span_of(grad_lse),
                                    .grad_entropy = span_of(grad_entropy)};
  py::gil_scoped_release nogil;
  h.op->backward(h.result, grads, grad);
}

// ---------------------------------------------------------------------------------------------
// A test hook: the same forward run by the C++ library alone, TP ranks as threads of an
// InProcessGroup (no Python in the loop). Returns each rank's (logp, lse, entropy).

py::list in_process_forward(
    const std::shared_ptr<LogprobOp>& op, const std::string& dtype,
    const std::vector<std::tuple<uintptr_t, int64_t, int64_t, int64_t>>& shards,
    const std::vector<LogprobContract>& contracts, const I64Array& targets, bool deterministic,
    bool entropy) {
  if (shards.size() != contracts.size() || shards.empty()) {
    throw ContractError("in_process_forward needs one shard per contract");
  }
  const int n = static_cast<int>(shards.size());
  std::vector<detlogp::LogprobResult> results(static_cast<std::size_t>(n));
  const std::span<const int64_t> tg(targets.data(), static_cast<std::size_t>(targets.size()));
  {
    py::gil_scoped_release nogil;
    detlogp::run_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      const auto& [ptr, rows, cols, stride] = shards[static_cast<std::size_t>(r)];
      results[static_cast<std::size_t>(r)] = op->forward(
          logits_view(ptr, dtype, rows, cols, stride), tg, contracts[static_cast<std::size_t>(r)],
          comm, {.deterministic = deterministic, .entropy = entropy});
    });
  }
  py::list out;
  for (const auto& r : results) {
    out.append(py::make_tuple(to_numpy(r.logp), to_numpy(r.lse), to_numpy(r.entropy)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The cuda platform (CUDA torch tensors). The backend is registered on the global registry the
// first time it is asked for, and only where a device exists: the registry is never handed a
// backend it cannot load.

// (built with CUDA, device count, why none).
std::tuple<bool, int, std::string> cuda_backend_status() {
#ifdef DETLOGP_HAVE_CUDA
  std::string why;
  const int n = detlogp::cuda_device_count(&why);
  return {true, n, why};
#else
  return {false, 0, "built without CUDA"};
#endif
}

// Throws ContractError unless the cuda platform can run; registers its backend once.
void ensure_cuda_backend() {
#ifdef DETLOGP_HAVE_CUDA
  std::string why;
  if (detlogp::cuda_device_count(&why) == 0) {
    throw ContractError("CUDA logits: no CUDA device (" + why + ")");
  }
  detlogp::ensure_cuda_backend_registered();
#else
  throw ContractError(
      "CUDA logits need the CUDA backend, but this detlogp was built without CUDA (no CUDA "
      "compiler, or DETLOGP_WITH_CUDA=OFF); pass CPU tensors or rebuild with CUDA");
#endif
}

}  // namespace

PYBIND11_MODULE(_detlogp, m) {
  m.doc() = "detlogp C++ bindings (private; use the `detlogp` package)";
  // The pybind11 this extension was built with: before 2.12 it cannot read NumPy 2's arrays
  // (detlogp/_native.py refuses that pairing at import).
  m.attr("pybind11_version") = py::make_tuple(PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR);

  static py::exception<ContractError> contract_error(m, "LogprobContractError", PyExc_ValueError);
  contract_error.attr("__doc__") =
      "A contract or input violation (detlogp::ContractError). Subclass of ValueError. "
      "code: the kind of rule broken (e.g. 'out_of_range'), field: the field it is about.";
  contract_error.attr("__module__") = "detlogp";
  // The C++ error's code and field as attributes (class defaults for errors raised in Python).
  contract_error.attr("code") = "unspecified";
  contract_error.attr("field") = "";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ContractError& e) {
      py::object error = py::handle(contract_error.ptr())(e.what());  // an instance
      error.attr("code") = std::string(detlogp::to_string(e.code()));
      error.attr("field") = e.field();
      PyErr_SetObject(contract_error.ptr(), error.ptr());
    }
  });

  m.def("version", [] { return std::string(detlogp::version()); });
  m.attr("NUMERICS_VERSION") = std::string(detlogp::kNumericsVersion);
  m.attr("DEFAULT_TILE_WIDTH") = detlogp::kDefaultTileWidth;
  m.attr("DEFAULT_COLLECTIVE_TIMEOUT") = detlogp::kDefaultCollectiveTimeoutSeconds;
  m.attr("CPU_CANONICAL_BACKEND_ID") = std::string(detlogp::kCpuCanonicalBackendId);
  m.attr("CPU_REFERENCE_BACKEND_ID") = std::string(detlogp::kCpuReferenceBackendId);
  m.attr("CPU_BATCH_INVARIANT_BACKEND_ID") = std::string(detlogp::kCpuBatchInvariantBackendId);
  m.def("enum_values", [](const std::string& name) -> std::vector<std::string> {
    auto list = [](auto span) { return std::vector<std::string>(span.begin(), span.end()); };
    using namespace detlogp;
    if (name == "Role") return list(enum_values<Role>());
    if (name == "DType") return list(enum_values<DType>());
    if (name == "Merge") return list(enum_values<Merge>());
    if (name == "MergeAxis") return list(enum_values<MergeAxis>());
    if (name == "ReductionOrder") return list(enum_values<ReductionOrder>());
    if (name == "Transport") return list(enum_values<Transport>());
    if (name == "DowncastPoint") return list(enum_values<DowncastPoint>());
    if (name == "Engine") return list(enum_values<Engine>());
    if (name == "TPPlacement") return list(enum_values<TPPlacement>());
    if (name == "DeterminismScope") return list(enum_values<DeterminismScope>());
    if (name == "MaskMode") return list(enum_values<MaskMode>());
    if (name == "ImplementationKind") return list(enum_values<ImplementationKind>());
    throw ContractError("unknown enum " + name);
  });
  m.def("simd_targets", &detlogp::simd_targets);

  // --- contract ------------------------------------------------------------------------------
  py::class_<ShardingSpec>(m, "ShardingSpec")
      .def(py::init([](int64_t tp_rank, int64_t tp_world_size, const Bounds& bounds,
                       int64_t real_vocab_size, int64_t padded_vocab_size, int64_t cp_rank,
                       int64_t cp_world_size) {
             return ShardingSpec({.tp_rank = tp_rank,
                                  .tp_world_size = tp_world_size,
                                  .vocab_shard_bounds = ranges_of(bounds),
                                  .real_vocab_size = real_vocab_size,
                                  .padded_vocab_size = padded_vocab_size,
                                  .cp_rank = cp_rank,
                                  .cp_world_size = cp_world_size});
           }),
           py::kw_only(), py::arg("tp_rank"), py::arg("tp_world_size"),
           py::arg("vocab_shard_bounds"), py::arg("real_vocab_size"), py::arg("padded_vocab_size"),
           py::arg("cp_rank"), py::arg("cp_world_size"))
      .def_property_readonly("tp_rank", &ShardingSpec::tp_rank)
      .def_property_readonly("tp_world_size", &ShardingSpec::tp_world_size)
      .def_property_readonly("cp_rank", &ShardingSpec::cp_rank)
      .def_property_readonly("cp_world_size", &ShardingSpec::cp_world_size)
      .def_property_readonly("vocab_shard_bounds", &bounds_of)
      .def_property_readonly("real_vocab_size", &ShardingSpec::real_vocab_size)
      .def_property_readonly("padded_vocab_size", &ShardingSpec::padded_vocab_size)
      .def_property_readonly("local_vocab_start", &ShardingSpec::local_vocab_start)
      .def_property_readonly("local_vocab_end", &ShardingSpec::local_vocab_end)
      .def_property_readonly("local_vocab_size", &ShardingSpec::local_vocab_size)
      .def("owner_rank", &ShardingSpec::owner_rank, py::arg("token_id"))
      .def("__eq__", [](const ShardingSpec& a, const ShardingSpec& b) { return a == b; });

  py::class_<MaskSpec>(m, "MaskSpec")
      .def(py::init(
               [](int64_t num_tokens, const std::vector<bool>& active_mask, int64_t ignore_index) {
                 return MaskSpec({.num_tokens = num_tokens,
                                  .active_mask = active_mask,
                                  .ignore_index = ignore_index});
               }),
           py::kw_only(), py::arg("num_tokens"), py::arg("active_mask"), py::arg("ignore_index"))
      .def_static("all_active", &MaskSpec::all_active, py::arg("num_tokens"),
                  py::arg("ignore_index") = -100)
      .def_property_readonly("num_tokens", &MaskSpec::num_tokens)
      .def_property_readonly("active_mask", &MaskSpec::active_mask)
      .def_property_readonly("ignore_index", &MaskSpec::ignore_index)
      .def_property_readonly("active_token_count", &MaskSpec::active_token_count)
      .def_property_readonly("active_mask_sha256", &MaskSpec::active_mask_sha256)
      .def("__eq__", [](const MaskSpec& a, const MaskSpec& b) { return a == b; });

  py::class_<ReductionSpec>(m, "ReductionSpec")
      .def(py::init([](const std::string& merge, const std::string& merge_axis,
                       const std::string& acc_dtype, const std::string& order,
                       const std::string& transport, const std::string& downcast_at,
                       const std::string& engine, const std::string& determinism_scope) {
             using namespace detlogp;
             return ReductionSpec({
                 .merge = parse_merge(merge),
                 .merge_axis = parse_merge_axis(merge_axis),
                 .acc_dtype = detlogp::parse_dtype(acc_dtype, "acc_dtype"),
                 .order = parse_reduction_order(order),
                 .transport = parse_transport(transport),
                 .downcast_at = parse_downcast_point(downcast_at),
                 .engine = parse_engine(engine),
                 .determinism_scope = parse_determinism_scope(determinism_scope),
             });
           }),
           py::kw_only(), py::arg("merge"), py::arg("merge_axis"), py::arg("acc_dtype"),
           py::arg("order"), py::arg("transport"), py::arg("downcast_at"), py::arg("engine"),
           py::arg("determinism_scope"))
      .def(py::init<>())
      .def_property_readonly("merge", [](const ReductionSpec& r) { return str(r.merge()); })
      .def_property_readonly("merge_axis",
                             [](const ReductionSpec& r) { return str(r.merge_axis()); })
      .def_property_readonly("acc_dtype", [](const ReductionSpec& r) { return str(r.acc_dtype()); })
      .def_property_readonly("order", [](const ReductionSpec& r) { return str(r.order()); })
      .def_property_readonly("transport", [](const ReductionSpec& r) { return str(r.transport()); })
      .def_property_readonly("downcast_at",
                             [](const ReductionSpec& r) { return str(r.downcast_at()); })
      .def_property_readonly("engine", [](const ReductionSpec& r) { return str(r.engine()); })
      .def_property_readonly("determinism_scope",
                             [](const ReductionSpec& r) { return str(r.determinism_scope()); })
      .def("__eq__", [](const ReductionSpec& a, const ReductionSpec& b) { return a == b; });

  py::class_<OutputSpec>(m, "OutputSpec")
      .def(py::init([](const std::string& selected, const std::string& lse,
                       const std::string& placement) {
             return OutputSpec(
                 {.selected_logp_dtype = detlogp::parse_dtype(selected, "selected_logp_dtype"),
                  .lse_dtype = detlogp::parse_dtype(lse, "lse_dtype"),
                  .tp_placement = detlogp::parse_tp_placement(placement)});
           }),
           py::kw_only(), py::arg("selected_logp_dtype"), py::arg("lse_dtype"),
           py::arg("tp_placement"))
      .def(py::init<>())
      .def_property_readonly("selected_logp_dtype",
                             [](const OutputSpec& o) { return str(o.selected_logp_dtype()); })
      .def_property_readonly("lse_dtype", [](const OutputSpec& o) { return str(o.lse_dtype()); })
      .def_property_readonly("tp_placement",
                             [](const OutputSpec& o) { return str(o.tp_placement()); })
      .def("__eq__", [](const OutputSpec& a, const OutputSpec& b) { return a == b; });

  py::class_<LogprobContract>(m, "LogprobContract")
      .def(py::init([](const std::string& role, const std::string& dtype, const MaskSpec& mask,
                       const ShardingSpec& sharding, const ReductionSpec& reduction,
                       const OutputSpec& output, bool export_lse, float temperature,
                       std::optional<int64_t> tile_width, std::optional<int64_t> num_vocab_tiles) {
             return LogprobContract({.role = detlogp::parse_role(role),
                                     .dtype = detlogp::parse_dtype(dtype),
                                     .mask = mask,
                                     .sharding = sharding,
                                     .reduction = reduction,
                                     .output = output,
                                     .export_lse = export_lse,
                                     .temperature = temperature,
                                     .tile_width = tile_width,
                                     .num_vocab_tiles = num_vocab_tiles});
           }),
           py::kw_only(), py::arg("role"), py::arg("dtype"), py::arg("mask"), py::arg("sharding"),
           py::arg("reduction"), py::arg("output"), py::arg("export_lse"), py::arg("temperature"),
           py::arg("tile_width"), py::arg("num_vocab_tiles"))
      .def_property_readonly("role", [](const LogprobContract& c) { return str(c.role()); })
      .def_property_readonly("dtype", [](const LogprobContract& c) { return str(c.dtype()); })
      .def_property_readonly("mask", &LogprobContract::mask)
      .def_property_readonly("sharding", &LogprobContract::sharding)
      .def_property_readonly("reduction", &LogprobContract::reduction)
      .def_property_readonly("output", &LogprobContract::output)
      .def_property_readonly("export_lse", &LogprobContract::export_lse)
      .def_property_readonly("temperature", &LogprobContract::temperature)
      .def_property_readonly("tile_width", &LogprobContract::tile_width)
      .def_property_readonly(
          "numerics_version",
          [](const LogprobContract& c) { return std::string(c.numerics_version()); })
      .def("check_tile_alignment", &LogprobContract::check_tile_alignment)
      .def("tile_alignment_problem",
           [](const LogprobContract& c) { return detlogp::tile_alignment_problem(c); })
      .def("to_json", &LogprobContract::to_json)
      .def("cross_rank_fingerprint", &LogprobContract::cross_rank_fingerprint)
      .def("__eq__", [](const LogprobContract& a, const LogprobContract& b) { return a == b; });

  m.def("even_bounds", [](int64_t padded, int64_t tp) {
    Bounds out;
    for (const auto& r : detlogp::even_bounds(padded, tp)) out.emplace_back(r.start, r.end);
    return out;
  });
  m.def("even_tile_aligned_bounds", [](int64_t padded, int64_t tp, int64_t w) {
    Bounds out;
    for (const auto& r : detlogp::even_tile_aligned_bounds(padded, tp, w)) {
      out.emplace_back(r.start, r.end);
    }
    return out;
  });
  m.def("megatron_padded_vocab", &detlogp::megatron_padded_vocab);
  m.def("megatron_bounds", [](int64_t real, int64_t tp, int64_t multiple) {
    const detlogp::VocabLayout l = detlogp::megatron_bounds(real, tp, multiple);
    Bounds out;
    for (const auto& r : l.vocab_shard_bounds) out.emplace_back(r.start, r.end);
    return py::make_tuple(l.padded_vocab_size, out);
  });

  // --- capability ----------------------------------------------------------------------------
  py::class_<BackendCapability>(m, "BackendCapability")
      .def(py::init([](const std::string& backend_id, const std::vector<std::string>& roles,
                       const std::vector<std::string>& dtypes,
                       std::optional<std::vector<int64_t>> tp_world_sizes,
                       std::optional<std::vector<int64_t>> cp_world_sizes,
                       bool supports_vocab_padding, const std::vector<std::string>& mask_modes,
                       bool exports_vocab_lse, const std::vector<std::string>& determinism_scopes,
                       const std::string& implementation_kind,
                       std::optional<std::vector<int64_t>> tile_widths, bool supports_temperature,
                       const std::vector<std::string>& reduction_orders) {
             using namespace detlogp;
             return BackendCapability(
                 {.backend_id = backend_id,
                  .roles = parse_set<Role>(roles, "roles"),
                  .dtypes = parse_set<DType>(dtypes, "dtypes"),
                  .tp_world_sizes = std::move(tp_world_sizes),
                  .cp_world_sizes = std::move(cp_world_sizes),
                  .supports_vocab_padding = supports_vocab_padding,
                  .mask_modes = parse_set<MaskMode>(mask_modes, "mask_modes"),
                  .exports_vocab_lse = exports_vocab_lse,
                  .determinism_scopes =
                      parse_set<DeterminismScope>(determinism_scopes, "determinism_scopes"),
                  .implementation_kind = parse_implementation_kind(implementation_kind),
                  .tile_widths = std::move(tile_widths),
                  .supports_temperature = supports_temperature,
                  .reduction_orders =
                      parse_set<ReductionOrder>(reduction_orders, "reduction_orders")});
           }),
           py::kw_only(), py::arg("backend_id"), py::arg("roles"), py::arg("dtypes"),
           py::arg("tp_world_sizes"), py::arg("cp_world_sizes"), py::arg("supports_vocab_padding"),
           py::arg("mask_modes"), py::arg("exports_vocab_lse"), py::arg("determinism_scopes"),
           py::arg("implementation_kind"), py::arg("tile_widths"), py::arg("supports_temperature"),
           py::arg("reduction_orders"))
      .def_property_readonly("backend_id", &BackendCapability::backend_id)
      .def("incompatibilities", &BackendCapability::incompatibilities, py::arg("contract"))
      .def("supports", &BackendCapability::supports, py::arg("contract"))
      .def("to_json", &BackendCapability::to_json);

  // --- communicators -------------------------------------------------------------------------
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("name", &Communicator::name)
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      // bytes in, every rank's bytes out (for tests of a communicator on its own).
      .def("all_gather", [](Communicator& c, const py::bytes& send) {
        const std::string s = send;
        std::string recv(s.size() * static_cast<std::size_t>(c.size()), '\0');
        {
          py::gil_scoped_release nogil;
          c.all_gather(std::as_bytes(std::span<const char>(s.data(), s.size())),
                       std::as_writable_bytes(std::span<char>(recv.data(), recv.size())));
        }
        return py::bytes(recv);
      });
  // A rank whose inputs failed its own checks joins the others' preflight so all of them raise.
  m.def(
      "fail_preflight",
      [](const std::shared_ptr<Communicator>& comm, const std::string& message) {
        if (!comm) throw ContractError(message);
        py::gil_scoped_release nogil;
        detlogp::fail_preflight(*comm, message);
      },
      py::arg("comm"), py::arg("message"));
  // A rank with no tokens joins the others' preflight with zero rows (an empty micro-batch).
  m.def(
      "preflight_no_tokens",
      [](const std::shared_ptr<Communicator>& comm) {
        if (!comm) return;
        py::gil_scoped_release nogil;
        detlogp::preflight_no_tokens(*comm);
      },
      py::arg("comm"));
  py::class_<detlogp::SelfComm, Communicator, std::shared_ptr<detlogp::SelfComm>>(m, "SelfComm")
      .def(py::init<>());
  py::class_<PyCallbackComm, Communicator, std::shared_ptr<PyCallbackComm>>(m, "CallbackComm")
      .def(py::init<int, int, std::string, py::function, py::function>(), py::arg("rank"),
           py::arg("size"), py::arg("name"), py::arg("all_gather"), py::arg("barrier"));

  // --- operator ------------------------------------------------------------------------------
  py::class_<ForwardHandle, std::shared_ptr<ForwardHandle>>(m, "ForwardHandle")
      .def_property_readonly("logp", [](const ForwardHandle& h) { return to_numpy(h.result.logp); })
      .def_property_readonly("lse", [](const ForwardHandle& h) { return to_numpy(h.result.lse); })
      .def_property_readonly("entropy",
                             [](const ForwardHandle& h) -> py::object {
                               if (!h.entropy) return py::none();
                               return to_numpy(h.result.entropy);
                             })
      .def_property_readonly("logits_owner", [](const ForwardHandle& h) { return h.logits_owner; })
      // The address of the logits buffer backward will read (the caller's, never a copy).
      .def_property_readonly(
          "saved_logits_data_ptr",
          [](const ForwardHandle& h) -> uintptr_t {
            return reinterpret_cast<uintptr_t>(detlogp::saved_logits(h.result).data);
          })
      .def_property_readonly("saved_logits_row_stride",
                             [](const ForwardHandle& h) -> int64_t {
                               return detlogp::saved_logits(h.result).row_stride;
                             })
      .def("backward", &run_backward, py::kw_only(), py::arg("grad_logp"), py::arg("grad_lse"),
           py::arg("grad_entropy"), py::arg("out_ptr"), py::arg("out_dtype"), py::arg("out_rows"),
           py::arg("out_cols"), py::arg("out_row_stride"));

  py::class_<LogprobOp, std::shared_ptr<LogprobOp>>(m, "LogprobOp")
      .def_property_readonly("backend_id", &LogprobOp::backend_id)
      .def_property_readonly("kernel_name", &LogprobOp::kernel_name)
      .def("forward", &run_forward, py::kw_only(), py::arg("ptr"), py::arg("dtype"),
           py::arg("rows"), py::arg("cols"), py::arg("row_stride"), py::arg("owner"),
           py::arg("targets"), py::arg("contract"), py::arg("comm"), py::arg("deterministic"),
           py::arg("validate"), py::arg("entropy"), py::arg("threads"),
           py::arg("entropy_grad") = true, py::arg("rows_layout") = "");

  m.def("in_process_forward", &in_process_forward, py::kw_only(), py::arg("op"), py::arg("dtype"),
        py::arg("shards"), py::arg("contracts"), py::arg("targets"), py::arg("deterministic"),
        py::arg("entropy"));

  // --- registry ------------------------------------------------------------------------------
  py::class_<detlogp::DispatchResult>(m, "DispatchResult")
      .def_readonly("op", &detlogp::DispatchResult::op)
      .def_readonly("capability", &detlogp::DispatchResult::capability)
      .def_readonly("requested_backend", &detlogp::DispatchResult::requested_backend)
      .def_readonly("actual_backend", &detlogp::DispatchResult::actual_backend)
      .def_readonly("backend_name", &detlogp::DispatchResult::backend_name)
      .def_readonly("platform", &detlogp::DispatchResult::platform)
      .def_readonly("fallback", &detlogp::DispatchResult::fallback)
      .def_readonly("prior_rejections", &detlogp::DispatchResult::prior_rejections)
      .def_readonly("provenance_json", &detlogp::DispatchResult::provenance_json);
  m.def(
      "get_logprob_op",
      [](const LogprobContract& contract, const std::string& requested_backend,
         const std::string& platform) {
        if (platform == "cuda") ensure_cuda_backend();
        return detlogp::Registry::global().get_logprob_op(contract, requested_backend, platform);
      },
      py::arg("contract"), py::arg("requested_backend"), py::arg("platform") = "cpu",
      // Without the GIL while it waits for the registry's lock: a Python backend's factory
      // (run under that lock) takes the GIL itself.
      py::call_guard<py::gil_scoped_release>());
#ifdef DETLOGP_HAVE_CUDA
  m.attr("CUDA_BUILT") = true;
  m.attr("CUDA_CANONICAL_BACKEND_ID") = std::string(detlogp::kCudaCanonicalBackendId);
#else
  m.attr("CUDA_BUILT") = false;
  m.attr("CUDA_CANONICAL_BACKEND_ID") = py::none();
#endif
  m.def("cuda_backend_status", &cuda_backend_status);
  detlogp::python::bind_functional(m);

  detlogp_python::bind_registry(m);
  detlogp_python::bind_drift(m);
  detlogp_python::bind_validation(m);
  detlogp_python::bind_fused(m);
  detlogp_python::bind_memory(m);
}

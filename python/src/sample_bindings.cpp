// The sampler (include/detlogp/sampler.hpp) for python/detlogp/_sample.py: detlogp::sample on a
// raw view of the caller's logits shard (never copied), without the GIL; a torch.distributed
// communicator takes it back only inside its collectives. The Python package has checked and
// converted every input before it gets here (per-row values as contiguous NumPy arrays).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/sampler.hpp"
#include "python_bindings.hpp"
#include "raw_views.hpp"

namespace py = pybind11;

namespace {

using detlogp_python::F32Array;
using detlogp_python::I32Array;
using detlogp_python::I64Array;
using detlogp_python::RawView;

template <class T, class A>
std::span<const T> optional_span(const std::optional<A>& a, const char* field) {
  if (!a) return {};
  if (a->ndim() != 1) {
    throw detlogp::ContractError(detlogp::ErrorCode::wrong_shape, field,
                                 std::string(field) + " must be 1-D [rows]");
  }
  return {a->data(), static_cast<std::size_t>(a->size())};
}

// A [rows, width] int64 or fp32 NumPy array of a result's row-major values.
template <class T>
py::array_t<T> matrix(const std::vector<T>& v, int64_t rows, int64_t width) {
  py::array_t<T> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)});
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(T));
  return out;
}

py::tuple run_sample(const std::shared_ptr<detlogp::LogprobOp>& op, const RawView& logits,
                     const detlogp::LogprobContract& contract,
                     const std::shared_ptr<detlogp::Communicator>& comm, const I64Array& seeds,
                     const I64Array& positions, const std::optional<F32Array>& temperature,
                     const std::optional<I32Array>& top_k, const std::optional<F32Array>& top_p,
                     int64_t num_logprobs, int threads) {
  if (!op) throw detlogp::ContractError("op must be a LogprobOp");
  const detlogp::LogitsView view = detlogp_python::view_of(logits, "logits dtype");
  if (seeds.ndim() != 1 || positions.ndim() != 1) {
    throw detlogp::ContractError(detlogp::ErrorCode::wrong_shape,
                                 seeds.ndim() != 1 ? "seeds" : "positions",
                                 "seeds and positions must be 1-D [rows]");
  }
  const detlogp::SampleOptions options{
      .seeds = detlogp_python::span_of(seeds),
      .positions = detlogp_python::span_of(positions),
      .temperature = optional_span<float>(temperature, "temperature"),
      .top_k = optional_span<int32_t>(top_k, "top_k"),
      .top_p = optional_span<float>(top_p, "top_p"),
      .num_logprobs = num_logprobs,
      .exec = {.threads = threads}};
  detlogp::SampleResult r;
  {
    py::gil_scoped_release nogil;
    detlogp::SelfComm self;
    detlogp::Communicator& c = comm ? *comm : static_cast<detlogp::Communicator&>(self);
    r = detlogp::sample(*op, view, contract, c, options);
  }
  const auto rows = static_cast<int64_t>(r.tokens.size());
  py::array_t<int64_t> tokens(static_cast<py::ssize_t>(rows));
  if (rows > 0) std::memcpy(tokens.mutable_data(), r.tokens.data(), r.tokens.size() * 8);
  return py::make_tuple(
      tokens, detlogp_python::to_numpy(r.logp), detlogp_python::to_numpy(r.full_logp),
      matrix(r.kept_ids, rows, r.kept_width), matrix(r.top_ids, rows, r.num_logprobs),
      matrix(r.top_logp, rows, r.num_logprobs));
}

}  // namespace

namespace detlogp_python {

void bind_sample(py::module_& m) {
  m.def("sample", &run_sample, py::kw_only(), py::arg("op"), py::arg("logits"), py::arg("contract"),
        py::arg("comm"), py::arg("seeds"), py::arg("positions"),
        py::arg("temperature") = py::none(), py::arg("top_k") = py::none(),
        py::arg("top_p") = py::none(), py::arg("num_logprobs") = 0, py::arg("threads") = 0);
}

}  // namespace detlogp_python

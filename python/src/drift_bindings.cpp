// detlogp.drift(): the library's drift statistics (include/detlogp/drift.hpp) on NumPy arrays,
// returned as a dict with the keys of `detlogp drift --json` (without the file names).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "detlogp/drift.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::object optional_index(const std::optional<int64_t>& v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}

// Non-finite statistics (an overflowing exp in approx_kl0) stay floats here: the caller decides
// how to serialize them (the drift report's JSON refuses them).
py::dict to_dict(const detlogp::DriftReport& r) {
  py::dict d;
  d["dtype"] = std::string(detlogp::to_string(r.dtype));
  d["tokens"] = r.tokens;
  d["count"] = r.count;
  d["max_abs"] = r.max_abs;
  d["mean_abs"] = r.mean_abs;
  d["p95_abs"] = r.p95_abs;
  d["p99_abs"] = r.p99_abs;
  d["max_rel"] = r.max_rel;
  if (r.worst_index) {
    py::dict w;
    w["index"] = *r.worst_index;
    w["candidate"] = r.worst_candidate;
    w["reference"] = r.worst_reference;
    w["abs_diff"] = r.max_abs;
    d["worst"] = w;
  } else {
    d["worst"] = py::none();
  }
  d["approx_kl0"] = r.approx_kl0;
  d["clipfrac0"] = r.clipfrac0;
  d["non_finite"] = r.non_finite;
  d["first_non_finite"] = optional_index(r.first_non_finite);
  py::dict t;
  t["max_abs"] = r.thresholds.max_abs;
  t["approx_kl0"] = r.thresholds.approx_kl0;
  t["clipfrac0"] = r.thresholds.clipfrac0;
  t["clip"] = std::vector<double>{r.thresholds.clip_low, r.thresholds.clip_high};
  d["thresholds"] = t;
  d["failures"] = r.failures;
  d["passed"] = r.passed();
  return d;
}

py::dict drift(const F32Array& candidate, const F32Array& reference,
               const std::optional<U8Array>& mask, const std::string& dtype) {
  if (candidate.ndim() != 1 || reference.ndim() != 1 || (mask && mask->ndim() != 1)) {
    throw detlogp::ContractError(
        "drift: candidate_logp, reference_logp and mask must be 1-D [tokens]");
  }
  const detlogp::DType dt = detlogp::parse_dtype(dtype, "dtype");
  const std::span<const float> c(candidate.data(), static_cast<std::size_t>(candidate.size()));
  const std::span<const float> ref(reference.data(), static_cast<std::size_t>(reference.size()));
  std::span<const uint8_t> active;
  if (mask) {
    if (mask->size() != candidate.size()) {
      throw detlogp::ContractError("drift: mask has " + std::to_string(mask->size()) +
                                   " entries for " + std::to_string(candidate.size()) +
                                   " tokens; give one entry per token");
    }
    active = {mask->data(), static_cast<std::size_t>(mask->size())};
  }
  detlogp::DriftReport r;
  {
    py::gil_scoped_release nogil;
    r = detlogp::drift_report(c, ref, active, dt);
  }
  return to_dict(r);
}

}  // namespace

namespace detlogp_python {

void bind_drift(py::module_& m) {
  m.def("drift", &drift, py::kw_only(), py::arg("candidate"), py::arg("reference"), py::arg("mask"),
        py::arg("dtype"));
  m.def("drift_thresholds", [](const std::string& dtype) {
    const detlogp::DriftThresholds t =
        detlogp::drift_thresholds(detlogp::parse_dtype(dtype, "dtype"));
    py::dict d;
    d["max_abs"] = t.max_abs;
    d["approx_kl0"] = t.approx_kl0;
    d["clipfrac0"] = t.clipfrac0;
    d["clip"] = std::vector<double>{t.clip_low, t.clip_high};
    return d;
  });
}

}  // namespace detlogp_python

#pragma once
// Caller memory as it crosses from the Python package: a 2-D buffer is a raw view tuple
// (address, dtype name, rows, cols, row_stride in elements) built by python/detlogp/_buffers.py
// from a torch tensor or NumPy array, never a copy; per-token vectors are NumPy arrays. Every
// binding file reads and writes them through these helpers.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/operator.hpp"

namespace detlogp_python {

using RawView = std::tuple<uintptr_t, std::string, int64_t, int64_t, int64_t>;
using F32Array = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;
using I64Array = pybind11::array_t<int64_t, pybind11::array::c_style | pybind11::array::forcecast>;
using I32Array = pybind11::array_t<int32_t, pybind11::array::c_style | pybind11::array::forcecast>;

// `dtype_field` names the buffer in a bad dtype's message ("hidden dtype").
inline detlogp::LogitsView view_of(const RawView& v, const char* dtype_field) {
  const auto& [ptr, dtype, rows, cols, stride] = v;
  return detlogp::LogitsView{.data = reinterpret_cast<const void*>(ptr),
                             .dtype = detlogp::parse_dtype(dtype, dtype_field),
                             .rows = rows,
                             .cols = cols,
                             .row_stride = stride};
}

// A gradient buffer the caller owns; no view (nullopt) skips that gradient.
inline detlogp::MutableLogitsView mutable_view_of(const std::optional<RawView>& v,
                                                  const char* dtype_field) {
  if (!v) return {};
  const detlogp::LogitsView c = view_of(*v, dtype_field);
  return detlogp::MutableLogitsView{.data = const_cast<void*>(c.data),
                                    .dtype = c.dtype,
                                    .rows = c.rows,
                                    .cols = c.cols,
                                    .row_stride = c.row_stride};
}

inline std::span<const int64_t> span_of(const I64Array& a) {
  return {a.data(), static_cast<std::size_t>(a.size())};
}

// An incoming per-token gradient; none gives an empty span (not supplied).
inline std::span<const float> span_of(const std::optional<F32Array>& a) {
  if (!a) return {};
  return {a->data(), static_cast<std::size_t>(a->size())};
}

// The kept sets of a call (detlogp/kept_set.hpp): none, or [rows, width] ids, -1 padded (rows
// of only -1 scored over the full vocabulary with empty_kept_full), or the per-row top_k /
// top_p of recomputed kept sets ([rows] each; the arrays must outlive the call, as the
// caller's do).
inline detlogp::KeptSetOptions kept_options(const std::optional<I64Array>& ids,
                                            bool outside_neg_inf,
                                            const std::optional<I32Array>& top_k = std::nullopt,
                                            const std::optional<F32Array>& top_p = std::nullopt,
                                            bool empty_kept_full = false) {
  detlogp::KeptSetOptions kept{
      .outside = outside_neg_inf ? detlogp::OutsideKept::neg_inf : detlogp::OutsideKept::error,
      .empty_rows =
          empty_kept_full ? detlogp::EmptyKeptRow::full_vocabulary : detlogp::EmptyKeptRow::error};
  if (top_k) kept.top_k = {top_k->data(), static_cast<std::size_t>(top_k->size())};
  if (top_p) kept.top_p = {top_p->data(), static_cast<std::size_t>(top_p->size())};
  if (!ids) return kept;
  if (ids->ndim() != 2) {
    throw detlogp::ContractError(detlogp::ErrorCode::wrong_shape, "kept_ids",
                                 "kept_ids must be 2-D [rows, width] (-1 padded)");
  }
  kept.ids = span_of(*ids);
  kept.width = static_cast<int64_t>(ids->shape(1));
  return kept;
}

// A result's kept sets as a fresh int64 NumPy array [rows, width], or None without kept sets.
template <class Result>
pybind11::object kept_ids_of(const Result& r) {
  if (r.kept_width == 0) return pybind11::none();
  const auto rows = static_cast<pybind11::ssize_t>(r.kept_ids.size()) / r.kept_width;
  pybind11::array_t<int64_t> out({rows, static_cast<pybind11::ssize_t>(r.kept_width)});
  if (!r.kept_ids.empty()) {
    std::memcpy(out.mutable_data(), r.kept_ids.data(), r.kept_ids.size() * sizeof(int64_t));
  }
  return out;
}

// An fp32 per-token output as a fresh NumPy array (outputs are [tokens], never [tokens, V]).
inline pybind11::array_t<float> to_numpy(const std::vector<float>& v) {
  pybind11::array_t<float> out(static_cast<pybind11::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(float));
  return out;
}

// The outputs of a forward handle as read-only properties: logp, lse and entropy (None unless
// forward computed it). `Handle` has `result.logp/lse/entropy` and `entropy`.
template <class Handle, class Class>
void def_token_outputs(Class& cls) {
  cls.def_property_readonly("logp", [](const Handle& h) { return to_numpy(h.result.logp); })
      .def_property_readonly("lse", [](const Handle& h) { return to_numpy(h.result.lse); })
      .def_property_readonly("entropy",
                             [](const Handle& h) -> pybind11::object {
                               if (!h.entropy) return pybind11::none();
                               return to_numpy(h.result.entropy);
                             })
      .def_property_readonly("kept_ids", [](const Handle& h) { return kept_ids_of(h.result); });
}

}  // namespace detlogp_python

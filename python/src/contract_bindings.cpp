// The contract types of include/detlogp/contract.hpp (ShardingSpec, MaskSpec, ReductionSpec,
// OutputSpec, LogprobContract), the vocabulary layouts (even, tile-aligned and Megatron
// bounds) and BackendCapability, for python/detlogp/_contract.py. Enums cross as their value
// strings and are parsed by the library, which validates every field with its own messages.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

using detlogp::BackendCapability;
using detlogp::LogprobContract;
using detlogp::MaskSpec;
using detlogp::OutputSpec;
using detlogp::ReductionSpec;
using detlogp::ShardingSpec;

using Bounds = std::vector<std::pair<int64_t, int64_t>>;

// A read-only property of an enum field, as its value string.
template <class T, detlogp::ContractEnum E>
auto value_string(E (T::*getter)() const) {
  return [getter](const T& t) { return std::string(detlogp::to_string((t.*getter)())); };
}

template <detlogp::ContractEnum E>
std::set<E> parse_set(const std::vector<std::string>& values, std::string_view field) {
  std::set<E> out;
  for (const std::string& v : values) out.insert(detlogp::parse_enum<E>(v, field));
  return out;
}

Bounds bounds_of(std::span<const detlogp::VocabRange> ranges) {
  Bounds out;
  for (const detlogp::VocabRange& r : ranges) out.emplace_back(r.start, r.end);
  return out;
}

std::vector<detlogp::VocabRange> ranges_of(const Bounds& b) {
  std::vector<detlogp::VocabRange> out;
  for (const auto& [s, e] : b) out.push_back({s, e});
  return out;
}

// MaskSpec(num_tokens=len(active), active_mask=active != 0, ignore_index) straight from a
// contiguous uint8 array, so that a trainer's [tokens] mask tensor becomes a contract without
// a Python list of bools on the way (the list path costs ~100 ms at 262k tokens).
MaskSpec mask_spec_from_bytes(const py::array_t<uint8_t, py::array::c_style>& active,
                              int64_t ignore_index) {
  if (active.ndim() != 1) {
    throw detlogp::ContractError("active_mask must be 1-D with one entry per token; got " +
                                 std::to_string(active.ndim()) + " dimensions");
  }
  const uint8_t* p = active.data();
  std::vector<bool> mask(static_cast<std::size_t>(active.size()));
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = p[i] != 0;
  return MaskSpec({.num_tokens = static_cast<int64_t>(mask.size()),
                   .active_mask = std::move(mask),
                   .ignore_index = ignore_index});
}

}  // namespace

namespace detlogp_python {

void bind_contract(py::module_& m) {
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
      .def_property_readonly(
          "vocab_shard_bounds",
          [](const ShardingSpec& s) { return bounds_of(s.vocab_shard_bounds()); })
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
      .def_property_readonly("merge", value_string(&ReductionSpec::merge))
      .def_property_readonly("merge_axis", value_string(&ReductionSpec::merge_axis))
      .def_property_readonly("acc_dtype", value_string(&ReductionSpec::acc_dtype))
      .def_property_readonly("order", value_string(&ReductionSpec::order))
      .def_property_readonly("transport", value_string(&ReductionSpec::transport))
      .def_property_readonly("downcast_at", value_string(&ReductionSpec::downcast_at))
      .def_property_readonly("engine", value_string(&ReductionSpec::engine))
      .def_property_readonly("determinism_scope", value_string(&ReductionSpec::determinism_scope))
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
      .def_property_readonly("selected_logp_dtype", value_string(&OutputSpec::selected_logp_dtype))
      .def_property_readonly("lse_dtype", value_string(&OutputSpec::lse_dtype))
      .def_property_readonly("tp_placement", value_string(&OutputSpec::tp_placement))
      .def("__eq__", [](const OutputSpec& a, const OutputSpec& b) { return a == b; });

  py::class_<LogprobContract>(m, "LogprobContract")
      .def(py::init([](const std::string& role, const std::string& dtype, const MaskSpec& mask,
                       const ShardingSpec& sharding, const ReductionSpec& reduction,
                       const OutputSpec& output, bool export_lse, float temperature,
                       std::optional<int64_t> tile_width, std::optional<int64_t> num_vocab_tiles,
                       std::optional<float> softcap) {
             return LogprobContract({.role = detlogp::parse_role(role),
                                     .dtype = detlogp::parse_dtype(dtype),
                                     .mask = mask,
                                     .sharding = sharding,
                                     .reduction = reduction,
                                     .output = output,
                                     .export_lse = export_lse,
                                     .temperature = temperature,
                                     .softcap = softcap,
                                     .tile_width = tile_width,
                                     .num_vocab_tiles = num_vocab_tiles});
           }),
           py::kw_only(), py::arg("role"), py::arg("dtype"), py::arg("mask"), py::arg("sharding"),
           py::arg("reduction"), py::arg("output"), py::arg("export_lse"), py::arg("temperature"),
           py::arg("tile_width"), py::arg("num_vocab_tiles"), py::arg("softcap") = py::none())
      .def_property_readonly("role", value_string(&LogprobContract::role))
      .def_property_readonly("dtype", value_string(&LogprobContract::dtype))
      .def_property_readonly("mask", &LogprobContract::mask)
      .def_property_readonly("sharding", &LogprobContract::sharding)
      .def_property_readonly("reduction", &LogprobContract::reduction)
      .def_property_readonly("output", &LogprobContract::output)
      .def_property_readonly("export_lse", &LogprobContract::export_lse)
      .def_property_readonly("temperature", &LogprobContract::temperature)
      .def_property_readonly("softcap", &LogprobContract::softcap)
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

  m.def("mask_spec_from_bytes", &mask_spec_from_bytes, py::arg("active"), py::arg("ignore_index"),
        "MaskSpec(num_tokens=len(active), active_mask=active != 0, ignore_index) from a "
        "contiguous uint8 array.");
  m.def("even_bounds",
        [](int64_t padded, int64_t tp) { return bounds_of(detlogp::even_bounds(padded, tp)); });
  m.def("even_tile_aligned_bounds", [](int64_t padded, int64_t tp, int64_t w) {
    return bounds_of(detlogp::even_tile_aligned_bounds(padded, tp, w));
  });
  m.def("megatron_padded_vocab", &detlogp::megatron_padded_vocab);
  m.def("megatron_bounds", [](int64_t real, int64_t tp, int64_t multiple) {
    const detlogp::VocabLayout l = detlogp::megatron_bounds(real, tp, multiple);
    return py::make_tuple(l.padded_vocab_size, bounds_of(l.vocab_shard_bounds));
  });
}

void bind_capability(py::module_& m) {
  py::class_<BackendCapability>(m, "BackendCapability")
      .def(py::init([](const std::string& backend_id, const std::vector<std::string>& roles,
                       const std::vector<std::string>& dtypes,
                       std::optional<std::vector<int64_t>> tp_world_sizes,
                       std::optional<std::vector<int64_t>> cp_world_sizes,
                       bool supports_vocab_padding, const std::vector<std::string>& mask_modes,
                       bool exports_vocab_lse, const std::vector<std::string>& determinism_scopes,
                       const std::string& implementation_kind,
                       std::optional<std::vector<int64_t>> tile_widths, bool supports_temperature,
                       const std::vector<std::string>& reduction_orders, bool supports_softcap,
                       bool supports_kept_sets, bool supports_unaligned_bounds) {
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
                  .supports_softcap = supports_softcap,
                  .supports_kept_sets = supports_kept_sets,
                  .supports_unaligned_bounds = supports_unaligned_bounds,
                  .reduction_orders =
                      parse_set<ReductionOrder>(reduction_orders, "reduction_orders")});
           }),
           py::kw_only(), py::arg("backend_id"), py::arg("roles"), py::arg("dtypes"),
           py::arg("tp_world_sizes"), py::arg("cp_world_sizes"), py::arg("supports_vocab_padding"),
           py::arg("mask_modes"), py::arg("exports_vocab_lse"), py::arg("determinism_scopes"),
           py::arg("implementation_kind"), py::arg("tile_widths"), py::arg("supports_temperature"),
           py::arg("reduction_orders"), py::arg("supports_softcap") = false,
           py::arg("supports_kept_sets") = false, py::arg("supports_unaligned_bounds") = false)
      .def_property_readonly("backend_id", &BackendCapability::backend_id)
      .def("incompatibilities", &BackendCapability::incompatibilities, py::arg("contract"))
      .def("supports", &BackendCapability::supports, py::arg("contract"))
      .def("to_json", &BackendCapability::to_json);
}

}  // namespace detlogp_python

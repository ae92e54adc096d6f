#pragma once
// Library and numerics versions. The numerics version names the canon
// (docs/numerics.md): it changes only when the bits detlogp computes change, and it
// travels in provenance and in the cross-rank preflight so ranks running different canons
// refuse to merge.

#include <string_view>

namespace detlogp {

// The library's release version ("MAJOR.MINOR.PATCH").
std::string_view version() noexcept;

// The numerics canon implemented by every backend of this build.
inline constexpr std::string_view kNumericsVersion = "detlogp-canon-v1";

}  // namespace detlogp

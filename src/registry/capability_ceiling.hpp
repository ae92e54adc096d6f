#pragma once
// A declared capability against what the backend's kernels provide: a backend built from one of
// detlogp's own operators (Backend::provides) may declare less than its kernels serve, never more.

#include <string_view>

#include "detlogp/capability.hpp"

namespace detlogp {

// Throws ContractError(not_supported, "capability.<field>") for the first field of `claimed`
// that goes beyond `provided`, naming the backend, the claimed value, what the kernels provide
// and the fix. Checked fields: roles, dtypes, tp/cp world sizes, vocab padding, mask modes, LSE
// export, determinism scopes, reduction orders, tile widths, temperature.
void check_within_provided(std::string_view backend_name, const BackendCapability& claimed,
                           const BackendCapability& provided);

}  // namespace detlogp

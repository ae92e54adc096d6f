#include "detlogp/version.hpp"

namespace detlogp {

std::string_view version() noexcept { return DETLOGP_VERSION_STRING; }

}  // namespace detlogp

# Compiler flags shared by every detlogp target, carried by the interface target
# detlogp_flags (never exported: consumers of the installed library keep their own flags).
#
# -ffp-contract=off: the numerics canon (shared/design/numerics.md) fixes every rounding; the
# compiler must not fuse a multiply and an add on its own. Fast-math is never used.
add_library(detlogp_flags INTERFACE)
target_compile_options(detlogp_flags INTERFACE
  -Wall -Wextra -ffp-contract=off -fno-fast-math
  $<$<BOOL:${DETLOGP_WERROR}>:-Werror>)
if(DETLOGP_SANITIZE)
  target_compile_options(detlogp_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(detlogp_flags INTERFACE -fsanitize=address,undefined)
endif()

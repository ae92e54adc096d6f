# The compiler flags of every detlogp target, written once.
#
# Numerics: the canon (docs/numerics.md) fixes every rounding, so no compiler may fuse a multiply
# and an add on its own, flush subnormals or use approximate division: -ffp-contract=off and no
# fast-math for C++ (and the host side of .cu files), and for device code -fmad=false -ftz=false
# -prec-div=true -prec-sqrt=true. fmas happen only where the canon writes one.
set(DETLOGP_CXX_NUMERICS_FLAGS -ffp-contract=off -fno-fast-math)
set(DETLOGP_CXX_WARNING_FLAGS -Wall -Wextra)
if(DETLOGP_WERROR)
  list(APPEND DETLOGP_CXX_WARNING_FLAGS -Werror)
endif()
set(DETLOGP_CUDA_NUMERICS_FLAGS -fmad=false -ftz=false -prec-div=true -prec-sqrt=true)
set(DETLOGP_CUDA_WARNING_FLAGS)
if(DETLOGP_WERROR)
  list(APPEND DETLOGP_CUDA_WARNING_FLAGS --Werror=all-warnings)
endif()

# detlogp_compile_flags: numerics and warnings, for C++ and CUDA sources alike (nvcc passes the
# C++ flags to the host compiler). Targets that must not get the sanitizers (the Python
# extension, loaded into a plain interpreter) link this one.
set(_detlogp_host_flags ${DETLOGP_CXX_NUMERICS_FLAGS} ${DETLOGP_CXX_WARNING_FLAGS})
list(JOIN _detlogp_host_flags "," _detlogp_host_flags_joined)
add_library(detlogp_compile_flags INTERFACE)
target_compile_options(detlogp_compile_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${DETLOGP_CXX_NUMERICS_FLAGS} ${DETLOGP_CXX_WARNING_FLAGS}>
  $<$<COMPILE_LANGUAGE:CUDA>:${DETLOGP_CUDA_NUMERICS_FLAGS} ${DETLOGP_CUDA_WARNING_FLAGS}
                             -Xcompiler=${_detlogp_host_flags_joined}>)

# detlogp_flags: the above plus the sanitizers of DETLOGP_SANITIZE; carried by every library,
# tool, test and benchmark target (never exported: consumers of the installed library keep their
# own flags).
add_library(detlogp_flags INTERFACE)
target_link_libraries(detlogp_flags INTERFACE detlogp_compile_flags)
if(DETLOGP_SANITIZE)
  target_compile_options(detlogp_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all
                              -fno-omit-frame-pointer>)
  target_link_options(detlogp_flags INTERFACE -fsanitize=address,undefined)
endif()

# `cmake --install` (docs/install.md): the library, its public headers and a CMake package
#   find_package(detlogp REQUIRED)                        # detlogp::detlogp, nothing else
#   find_package(detlogp REQUIRED COMPONENTS mpi cuda)    # + detlogp::mpi, detlogp::cuda
# plus the command line tool (bin/detlogp) and the Python package (see python/CMakeLists.txt).
# Install components, for `cmake --install <build> --component <name>`:
#   core    libdetlogp, include/detlogp/*.hpp but mpi_comm.hpp, lib/cmake/detlogp/
#   mpi     libdetlogp_mpi and its header, include/detlogp/mpi_comm.hpp
#   cuda    libdetlogp_cuda, include/detlogp/cuda.hpp and cuda_registry.hpp
#   cli     bin/detlogp
#   python  the detlogp Python package
# Each library has its own export file, so that the core package never needs MPI or CUDA.
include(CMakePackageConfigHelpers)

set(DETLOGP_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/detlogp)
if(BUILD_SHARED_LIBS)
  # Pre-1.0: every minor version may break the ABI.
  set_target_properties(detlogp PROPERTIES VERSION ${PROJECT_VERSION}
                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
endif()

install(TARGETS detlogp EXPORT detlogpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT core
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT core
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT core
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/detlogp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT core PATTERN mpi_comm.hpp EXCLUDE)
install(EXPORT detlogpTargets NAMESPACE detlogp:: FILE detlogpTargets.cmake
        DESTINATION ${DETLOGP_CMAKE_INSTALL_DIR} COMPONENT core)

# detlogp_add_component(<target> <component> <ExportName>): installs one optional library in
# its own export set (detlogp-<component>-targets.cmake).
function(detlogp_add_component target component)
  if(NOT TARGET ${target})
    return()
  endif()
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${component})
  target_include_directories(${target} PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(BUILD_SHARED_LIBS)
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "SHARED_LIBRARY")
      set_target_properties(${target} PROPERTIES VERSION ${PROJECT_VERSION}
                            SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
                            INSTALL_RPATH "$ORIGIN")
    endif()
  endif()
  install(TARGETS ${target} EXPORT detlogp-${component}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component})
  install(EXPORT detlogp-${component}-targets NAMESPACE detlogp::
          FILE detlogp-${component}-targets.cmake
          DESTINATION ${DETLOGP_CMAKE_INSTALL_DIR} COMPONENT ${component})
endfunction()

detlogp_add_component(detlogp_mpi mpi)
if(TARGET detlogp_mpi)
  # MpiComm's header needs mpi.h: installed only with the library that implements it.
  install(FILES ${PROJECT_SOURCE_DIR}/include/detlogp/mpi_comm.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/detlogp COMPONENT mpi)
endif()
detlogp_add_component(detlogp_cuda cuda)
if(TARGET detlogp_cuda)
  # The CUDA kernels' header and the CUDA backend's registration header.
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/kernels/cuda/include/detlogp
                    ${PROJECT_SOURCE_DIR}/src/registry/cuda/include/detlogp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT cuda)
endif()

# The command line tool. Shared builds find libdetlogp next door, in ../lib.
if(TARGET detlogp_cli)
  file(RELATIVE_PATH _detlogp_bin_to_lib ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}
       ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR})
  set_target_properties(detlogp_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_detlogp_bin_to_lib}")
  install(TARGETS detlogp_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()

# The package config records what was built, so that it asks for exactly what the installed
# libraries need: a static libdetlogp.a brings Highway and OpenSSL onto the consumer's link
# line (find_dependency), a shared libdetlogp.so does not.
set(DETLOGP_CONFIG_SHARED ${BUILD_SHARED_LIBS})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/detlogpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/detlogpConfig.cmake
  INSTALL_DESTINATION ${DETLOGP_CMAKE_INSTALL_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/detlogpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/detlogpConfig.cmake
              ${PROJECT_BINARY_DIR}/detlogpConfigVersion.cmake
        DESTINATION ${DETLOGP_CMAKE_INSTALL_DIR} COMPONENT core)

# Installs the library, its public headers and a CMake package so that a C++ user can
#   find_package(detlogp REQUIRED)
#   target_link_libraries(app PRIVATE detlogp::detlogp)   # and detlogp::mpi for MpiComm
include(CMakePackageConfigHelpers)

set(DETLOGP_INSTALL_TARGETS detlogp)
if(TARGET detlogp_mpi)
  list(APPEND DETLOGP_INSTALL_TARGETS detlogp_mpi)
endif()
install(TARGETS ${DETLOGP_INSTALL_TARGETS} EXPORT detlogpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/detlogp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT detlogpTargets NAMESPACE detlogp:: FILE detlogpTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/detlogp)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/detlogpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/detlogpConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/detlogp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/detlogpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/detlogpConfig.cmake
              ${PROJECT_BINARY_DIR}/detlogpConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/detlogp)

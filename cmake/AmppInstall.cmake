# `cmake --install` gives an outside project find_package(ampp) + target ampp::ampp.
include(CMakePackageConfigHelpers)
install(TARGETS ampp ${AMPP_LAYER_TARGETS} EXPORT amppTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ampp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT amppTargets NAMESPACE ampp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ampp)
configure_package_config_file(cmake/amppConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/amppConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ampp)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/amppConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/amppConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/amppConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ampp)
if(TARGET ampp_cli)
  install(TARGETS ampp_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# `cmake --install` gives an outside project find_package(ampp) + target ampp::ampp.
include(CMakePackageConfigHelpers)
install(TARGETS ampp ${AMPP_LAYER_TARGETS} EXPORT amppTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Only the public API is installed: the headers that say "Internal to ampp" (shared by ampp's layers, CLI
# and tests; scripts/check-layers.py keeps them out of ampp.h's reach) stay in the source tree.
file(GLOB_RECURSE AMPP_HEADERS RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/ampp/*.h)
foreach(header IN LISTS AMPP_HEADERS)
  file(STRINGS ${PROJECT_SOURCE_DIR}/include/${header} internal REGEX "^// Internal to ampp" LIMIT_COUNT 1)
  if(NOT internal)
    get_filename_component(folder ${header} DIRECTORY)
    install(FILES include/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${folder})
  endif()
endforeach()
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

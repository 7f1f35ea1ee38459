# `cmake --install build --prefix P`: Ferry's libraries, public headers, binaries and a CMake
# package, so that another project's `find_package(Ferry)` gives
#   Ferry::ferry                 every layer (core, rpc, remote_module, dist_autograd, pipeline,
#                                models, data, trainer)
#   Ferry::rpc, Ferry::models... one layer and the layers below it
#   Ferry::core_base             core without LibTorch: logging, settings, local processes
#   Ferry::plugin                Ferry's headers and LibTorch, for a stage plugin that ferry-worker
#                                loads (ferry/remote_module/stage_plugin.h): no Ferry library
# and FERRY_WORKER, FERRY_MASTER and FERRY_LAUNCH, the installed binaries.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FERRY_LAYERS core rpc remote_module dist_autograd pipeline models data trainer)
set(FERRY_LAYER_TARGETS)
foreach(layer ${FERRY_LAYERS})
  set_target_properties(ferry_${layer} PROPERTIES EXPORT_NAME ${layer})
  list(APPEND FERRY_LAYER_TARGETS ferry_${layer})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()

# core's part without LibTorch, which ferry_core links.
set_target_properties(ferry_core_base PROPERTIES EXPORT_NAME core_base)
list(APPEND FERRY_LAYER_TARGETS ferry_core_base)

add_library(ferry_all INTERFACE)
target_link_libraries(ferry_all INTERFACE ${FERRY_LAYER_TARGETS})
set_target_properties(ferry_all PROPERTIES EXPORT_NAME ferry)

add_library(ferry_plugin INTERFACE)
target_include_directories(ferry_plugin INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/core/include>
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/rpc/include>
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/remote_module/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(ferry_plugin INTERFACE ${TORCH_LIBRARIES})
set_target_properties(ferry_plugin PROPERTIES EXPORT_NAME plugin)

install(TARGETS ${FERRY_LAYER_TARGETS} ferry_all ferry_plugin EXPORT FerryTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ferry-worker ferry-master ferry-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT FerryTargets NAMESPACE Ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ferry)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/FerryConfig.cmake.in
  ${PROJECT_BINARY_DIR}/FerryConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ferry
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/FerryConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/FerryConfig.cmake ${PROJECT_BINARY_DIR}/FerryConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ferry)

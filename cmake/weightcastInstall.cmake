# `cmake --install`: headers, the static library, the `weightcast` launcher, the default
# config, and an exported CMake package so trainers can
#
#   find_package(weightcast CONFIG REQUIRED)
#   target_link_libraries(trainer PRIVATE weightcast::weightcast)
#
# libweightcast.a is static, so a consumer links its private dependencies too (fmt,
# yaml-cpp, liburing, xxhash, ...): weightcastConfig.cmake must find every target that the
# library links, public or private. Rather than a hand-kept list that drifts as others add
# dependencies (MPI, CUDA, NCCL), the list is read from the target's LINK_LIBRARIES once the
# whole project has been configured (cmake_language(DEFER)).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The name consumers use, also in this build tree (examples, subprojects).
add_library(weightcast::weightcast ALIAS weightcast)
set_target_properties(weightcast PROPERTIES EXPORT_NAME weightcast)

# Only the public headers: a `detail/` folder (at any depth) holds internals that no public
# header includes (tests/package/install_example.sh checks both). The headers that hand weightcast a
# caller's communicator include mpi.h or nccl.h: installed only where the build has that
# transport, so that every installed header compiles against the installed package.
set(_weightcast_header_excludes PATTERN "detail" EXCLUDE)
if(NOT MPI_CXX_FOUND)
  list(APPEND _weightcast_header_excludes PATTERN "mpi.hpp" EXCLUDE)
endif()
if(NOT WEIGHTCAST_CUDA_ENABLED)
  list(APPEND _weightcast_header_excludes PATTERN "nccl.hpp" EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/weightcast
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" ${_weightcast_header_excludes})
install(TARGETS weightcast EXPORT weightcastTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The CLI without test hooks (CMakeLists.txt: weightcast_cli_installed when the suite is on).
install(TARGETS ${WEIGHTCAST_INSTALLED_CLI} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/configs/default.yaml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/weightcast)

set(WEIGHTCAST_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/weightcast)
install(EXPORT weightcastTargets NAMESPACE weightcast:: DESTINATION ${WEIGHTCAST_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/weightcastConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  # 0.x: a minor release may change the API.
  COMPATIBILITY SameMinorVersion)

# Turns weightcast's link libraries into the find_dependency() calls of the package config.
function(weightcast_write_package_config)
  get_target_property(_libs weightcast LINK_LIBRARIES)
  get_target_property(_iface weightcast INTERFACE_LINK_LIBRARIES)
  set(_deps "")
  set(_done "")
  foreach(_lib IN LISTS _libs _iface)
    # Strip generator expressions such as $<LINK_ONLY:fmt::fmt>.
    string(REGEX REPLACE "^\\$<[A-Z_]+:(.*)>$" "\\1" _lib "${_lib}")
    if(_lib IN_LIST _done)
      continue()
    endif()
    list(APPEND _done "${_lib}")
    set(_code "")
    if(_lib MATCHES "^Boost::")
      set(_code "find_dependency(Boost ${Boost_MAJOR_VERSION}.${Boost_MINOR_VERSION})")
    elseif(_lib STREQUAL "Threads::Threads")
      set(_code "find_dependency(Threads)")
    elseif(_lib MATCHES "^spdlog::")
      set(_code "find_dependency(spdlog)")
    elseif(_lib MATCHES "^fmt::")
      set(_code "find_dependency(fmt)")
    elseif(_lib MATCHES "^yaml-cpp")
      set(_code "find_dependency(yaml-cpp)")
    elseif(_lib MATCHES "^nlohmann_json::")
      set(_code "find_dependency(nlohmann_json)")
    elseif(_lib MATCHES "^MPI::MPI_(.+)$")
      # The consumer's own MPI installation, found as CMake finds it (mpicxx on PATH,
      # MPI_HOME, MPI_CXX_COMPILER): the same FindMPI component this build linked.
      set(_code "find_dependency(MPI COMPONENTS ${CMAKE_MATCH_1})")
    elseif(_lib MATCHES "^CUDA::")
      set(_code "find_dependency(CUDAToolkit)")
    elseif(_lib MATCHES "^PkgConfig::(.+)$")
      # pkg-config targets are named after the prefix given to pkg_check_modules; the
      # consumer must create the same name. The module is the one this build found.
      set(_prefix ${CMAKE_MATCH_1})
      set(_module_name "${${_prefix}_MODULE_NAME}")
      if(NOT _module_name)
        string(TOLOWER "${_prefix}" _module_name)
        if(_prefix STREQUAL "URING")
          set(_module_name liburing)
        elseif(_prefix STREQUAL "XXHASH")
          set(_module_name libxxhash)
        endif()
      endif()
      set(_code "weightcast_pkg_target(${_prefix} ${_module_name})")
    elseif(_lib STREQUAL "weightcast_nccl")
      get_target_property(_nccl_inc weightcast_nccl INTERFACE_INCLUDE_DIRECTORIES)
      set(_code "weightcast_find_nccl(\"${_nccl_inc}\")")
    elseif(_lib MATCHES "^weightcast_static::")
      # The self-contained build's archives (cmake/weightcastSelfContained.cmake): that build
      # makes the wheel, which installs no C++ package; nothing to find.
    elseif(TARGET ${_lib})
      get_target_property(_imported ${_lib} IMPORTED)
      if(_imported)
        message(WARNING "weightcast: the installed package does not know how to find "
          "'${_lib}', which libweightcast links; add it to cmake/weightcastInstall.cmake")
      endif()
    endif()
    # Several targets may need the same package (CUDA::cudart, CUDA::cuda_driver).
    string(FIND "${_deps}" "${_code}\n" _already)
    if(_code AND _already EQUAL -1)
      string(APPEND _deps "${_code}\n")
    endif()
  endforeach()
  set(WEIGHTCAST_FIND_DEPENDENCIES "${_deps}")
  # The optional parts this build has: find_package(weightcast COMPONENTS mpi cuda).
  set(WEIGHTCAST_COMPONENT_MPI OFF)
  if(MPI_CXX_FOUND)
    set(WEIGHTCAST_COMPONENT_MPI ON)
  endif()
  set(WEIGHTCAST_COMPONENT_CUDA ${WEIGHTCAST_CUDA_ENABLED})
  configure_package_config_file(
    ${PROJECT_SOURCE_DIR}/cmake/weightcastConfig.cmake.in
    ${PROJECT_BINARY_DIR}/weightcastConfig.cmake
    INSTALL_DESTINATION ${WEIGHTCAST_CMAKE_DIR})
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL weightcast_write_package_config)

install(FILES ${PROJECT_BINARY_DIR}/weightcastConfig.cmake
              ${PROJECT_BINARY_DIR}/weightcastConfigVersion.cmake
        DESTINATION ${WEIGHTCAST_CMAKE_DIR})

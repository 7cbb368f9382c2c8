# WEIGHTCAST_SELF_CONTAINED: the build of the wheel (pyproject.toml, docs/python.md § Install).
# The extension and the CLI it ships must load on a Linux host that has only glibc: no -dev
# package, no compiler, no root. So:
#   - liburing, yaml-cpp, xxhash and utf8proc are linked from their static archives (Debian
#     ships the .a beside the .so);
#   - fmt and spdlog have no static archive in Debian: both are used header-only, from the same
#     headers (FMT_HEADER_ONLY; spdlog is header-only where SPDLOG_COMPILED_LIB is not defined);
#   - libstdc++ and libgcc are linked statically: the wheel must not need the build host's
#     libstdc++ (a host with an older one fails with "GLIBCXX_3.4.30 not found");
#   - no MPI and no PMIx (`transport: mpi` is then an error, 69, saying the build has none);
#     CUDA is compiled in from headers alone (below), nothing of it linked;
#   - only the module's own entry point is exported: -fvisibility=hidden for this project's
#     code and --exclude-libs,ALL for the archives, so that the static fmt, spdlog and
#     libstdc++ copies never bind to, or get bound by, torch's own copies in the same process.
# Included from the top-level CMakeLists.txt after the find_package calls, which stay (the
# build host has the -dev packages; the headers come from there): it only changes what
# WEIGHTCAST_LINK_* name.

# CUDA as in every build (WEIGHTCAST_CUDA, default AUTO): only the toolkit's headers are
# compiled against; the CUDA runtime and NCCL are loaded at run time (from torch's nvidia-*
# wheels or the system, device/detail/cuda_api.hpp), so the wheel carries and links neither.

# A static archive as an imported target, with the include directories of the target that
# found its headers (empty where they are in /usr/include); fails at configure time where the
# archive is missing, naming the package that ships it.
function(weightcast_static_dependency name archive package includes)
  find_library(WEIGHTCAST_STATIC_${name} NAMES ${archive} NO_CACHE)
  if(NOT WEIGHTCAST_STATIC_${name})
    message(FATAL_ERROR "WEIGHTCAST_SELF_CONTAINED: ${archive} not found (Debian: ${package})")
  endif()
  add_library(weightcast_static::${name} STATIC IMPORTED GLOBAL)
  set_target_properties(weightcast_static::${name} PROPERTIES
    IMPORTED_LOCATION ${WEIGHTCAST_STATIC_${name}})
  if(includes)
    set_target_properties(weightcast_static::${name} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${includes}")
  endif()
  message(STATUS "weightcast: self-contained: ${WEIGHTCAST_STATIC_${name}}")
endfunction()

weightcast_static_dependency(uring liburing.a liburing-dev "${URING_INCLUDE_DIRS}")
weightcast_static_dependency(xxhash libxxhash.a libxxhash-dev "${XXHASH_INCLUDE_DIRS}")
weightcast_static_dependency(utf8proc libutf8proc.a libutf8proc-dev "${UTF8PROC_INCLUDE_DIRS}")
# Debian's libxxhash.a lacks the runtime-dispatched XXH3 (xxh_x86dispatch.c is built into the
# .so only): digest.cpp calls the plain entry points (SSE2), same digests, slower hashing
# for `verify: digest` than the AVX2 dispatch of the normal build. One file's definition, so
# the rest of the library compiles as before.
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/pipeline/digest.cpp PROPERTIES
  COMPILE_DEFINITIONS WEIGHTCAST_XXHASH_NO_DISPATCH)
# utf8proc.h: the static library's declarations (no export attribute on them).
set_target_properties(weightcast_static::utf8proc PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS UTF8PROC_STATIC)
get_target_property(_yaml_includes yaml-cpp INTERFACE_INCLUDE_DIRECTORIES)
weightcast_static_dependency(yaml libyaml-cpp.a libyaml-cpp-dev "${_yaml_includes}")

# fmt: its own header-only target (fmt-targets.cmake: FMT_HEADER_ONLY=1).
set(WEIGHTCAST_LINK_FMT fmt::fmt-header-only)
# spdlog: Debian's spdlog::spdlog_header_only links the shared fmt::fmt; this one uses fmt's
# header-only target and spdlog's headers only (SPDLOG_FMT_EXTERNAL: Debian's spdlog has no
# bundled fmt).
get_target_property(_spdlog_includes spdlog::spdlog_header_only INTERFACE_INCLUDE_DIRECTORIES)
add_library(weightcast_static::spdlog INTERFACE IMPORTED GLOBAL)
set_target_properties(weightcast_static::spdlog PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_spdlog_includes}"
  INTERFACE_COMPILE_DEFINITIONS SPDLOG_FMT_EXTERNAL
  INTERFACE_LINK_LIBRARIES "Threads::Threads;fmt::fmt-header-only")

set(WEIGHTCAST_LINK_SPDLOG weightcast_static::spdlog)
set(WEIGHTCAST_LINK_YAML weightcast_static::yaml)
set(WEIGHTCAST_LINK_URING weightcast_static::uring)
set(WEIGHTCAST_LINK_XXHASH weightcast_static::xxhash)
set(WEIGHTCAST_LINK_UTF8PROC weightcast_static::utf8proc)

# Every target of this build from here on: the library, the CLI and the extension.
set(CMAKE_CXX_VISIBILITY_PRESET hidden)
set(CMAKE_VISIBILITY_INLINES_HIDDEN ON)
# The archives above go into a shared module: position-independent code throughout (the
# CLI's objects too, harmless in an executable).
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
add_link_options(-static-libstdc++ -static-libgcc LINKER:--exclude-libs,ALL)
message(STATUS "weightcast: self-contained: no MPI, CUDA from headers only, "
  "static libstdc++/libgcc, hidden symbols")

# The oldest glibc the CLI and the extension load on: the build host's, or the one
# WEIGHTCAST_GLIBC_FLOOR names (scripts/wheel.sh: 2.28, manylinux_2_28).
include(${CMAKE_CURRENT_LIST_DIR}/weightcastGlibcFloor.cmake)

# The glibc floor of the self-contained build (the wheel's manylinux tag; docs/python.md
# § Install). A binary needs the newest glibc symbol version it references, and the linker
# binds each reference to the version that the build host's libc.so has as the default: on
# Debian 12 (glibc 2.36) pthread_create@GLIBC_2.34, _dl_find_object@GLIBC_2.35 (libgcc's
# unwinder), arc4random@GLIBC_2.36 (libstdc++'s std::random_device). So the wheel, built there
# as is, loads only on glibc >= 2.36 (manylinux_2_36).
#
# WEIGHTCAST_GLIBC_FLOOR=2.28 links the CLI and the extension against stub libraries of that
# glibc instead of the host's: libc.so.6, libm, libpthread, libdl, librt, ld.so with only the
# symbol versions that 2.28 exports (pthread_create@GLIBC_2.2.5 in libpthread.so.0, as 2.28
# has it), with 2.28's libc_nonshared.a (stat, atexit, ... which became libc.so.6 functions
# later) and 2.28's Scrt1.o (whose __libc_start_main call runs the executable's constructors,
# as glibc < 2.34 requires; the host's passes them to the 2.34 entry point instead). zig
# generates them from its glibc ABI lists for any version (`zig cc -target
# x86_64-linux-gnu.2.28`; the `ziglang` package on PyPI, WEIGHTCAST_ZIG). g++ still compiles
# and links everything else, with the host's headers, libstdc++.a and libgcc: the few functions
# those reference that 2.28 lacks come from weightcastGlibcFloor.cpp. A reference to anything
# else newer than the floor fails the CLI's link ("undefined reference"); scripts/wheel.sh
# checks every versioned reference of both files and auditwheel's policy.
#
# Included from weightcastSelfContained.cmake; empty WEIGHTCAST_GLIBC_FLOOR (the default, and
# `pip install .`) keeps the build host's glibc as the floor.

set(WEIGHTCAST_GLIBC_FLOOR "" CACHE STRING
  "Self-contained build: the oldest glibc the CLI and extension load on, e.g. 2.28 (needs zig)")
set(WEIGHTCAST_ZIG "" CACHE FILEPATH
  "zig, which generates the glibc stubs for WEIGHTCAST_GLIBC_FLOOR (the ziglang package's zig)")
if(NOT WEIGHTCAST_GLIBC_FLOOR)
  return()
endif()
if(NOT WEIGHTCAST_GLIBC_FLOOR MATCHES "^2\\.[0-9]+$")
  message(FATAL_ERROR "WEIGHTCAST_GLIBC_FLOOR=${WEIGHTCAST_GLIBC_FLOOR}: not a glibc version "
    "such as 2.28")
endif()
if(NOT WEIGHTCAST_ZIG)
  find_program(WEIGHTCAST_ZIG_FOUND zig)
  set(WEIGHTCAST_ZIG ${WEIGHTCAST_ZIG_FOUND})
endif()
if(NOT WEIGHTCAST_ZIG OR NOT EXISTS "${WEIGHTCAST_ZIG}")
  message(FATAL_ERROR "WEIGHTCAST_GLIBC_FLOOR=${WEIGHTCAST_GLIBC_FLOOR} needs zig to generate "
    "that glibc's stub libraries: pip install ziglang, and pass "
    "-DWEIGHTCAST_ZIG=<site-packages>/ziglang/zig (scripts/wheel.sh does)")
endif()

# The stubs, once per build folder and floor: zig builds them into its cache (seconds; the
# cache is $ZIG_GLOBAL_CACHE_DIR, else one in the build folder) while linking an empty
# program, and its verbose link line names them. Its -target names no CPU: the start files
# and libc_nonshared.a are for the baseline x86-64.
set(_floor_dir ${CMAKE_BINARY_DIR}/glibc-${WEIGHTCAST_GLIBC_FLOOR})
set(_floor_stamp "${WEIGHTCAST_ZIG} ${CMAKE_SYSTEM_PROCESSOR}")
set(_floor_have "")
if(EXISTS ${_floor_dir}/stamp)
  file(READ ${_floor_dir}/stamp _floor_have)
endif()
if(NOT _floor_have STREQUAL _floor_stamp)
  file(REMOVE_RECURSE ${_floor_dir})
  file(MAKE_DIRECTORY ${_floor_dir}/probe)
  file(WRITE ${_floor_dir}/probe/probe.c "int main(void) { return 0; }\n")
  if(DEFINED ENV{ZIG_GLOBAL_CACHE_DIR})
    set(_zig_cache $ENV{ZIG_GLOBAL_CACHE_DIR})
  else()
    set(_zig_cache ${_floor_dir}/zig-cache)
  endif()
  get_filename_component(_zig_cache "${_zig_cache}" ABSOLUTE)
  message(STATUS "weightcast: glibc ${WEIGHTCAST_GLIBC_FLOOR} stubs from ${WEIGHTCAST_ZIG}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ZIG_GLOBAL_CACHE_DIR=${_zig_cache}
      ZIG_LOCAL_CACHE_DIR=${_zig_cache}
      ${WEIGHTCAST_ZIG} cc -target ${CMAKE_SYSTEM_PROCESSOR}-linux-gnu.${WEIGHTCAST_GLIBC_FLOOR}
      -fPIE -pie -O2 probe.c -o probe -v
    WORKING_DIRECTORY ${_floor_dir}/probe
    RESULT_VARIABLE _zig_result OUTPUT_VARIABLE _zig_out ERROR_VARIABLE _zig_out)
  if(NOT _zig_result EQUAL 0)
    message(FATAL_ERROR "WEIGHTCAST_GLIBC_FLOOR: zig cc failed (${_zig_result}):\n${_zig_out}")
  endif()
  set(_floor_files "")
  foreach(_name Scrt1.o libc_nonshared.a libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2
                librt.so.1 libutil.so.1 libresolv.so.2 libld.so.2)
    string(REPLACE "." "\\." _pattern "${_name}")
    if(NOT _zig_out MATCHES "[ \n]([^ \n]*/${_pattern})[ \n]")
      message(FATAL_ERROR "WEIGHTCAST_GLIBC_FLOOR: zig's link line names no ${_name}:\n"
        "${_zig_out}")
    endif()
    set(_path ${CMAKE_MATCH_1})
    if(NOT IS_ABSOLUTE "${_path}")
      set(_path ${_floor_dir}/probe/${_path})
    endif()
    file(COPY_FILE ${_path} ${_floor_dir}/${_name})
  endforeach()
  # The names the linker looks for (-lc, -lpthread, ...). libc.so is a script, as glibc's
  # own: the shared libc, the floor's libc_nonshared.a, and ld.so (__tls_get_addr).
  file(WRITE ${_floor_dir}/libc.so
    "GROUP ( ${_floor_dir}/libc.so.6 ${_floor_dir}/libc_nonshared.a "
    "AS_NEEDED ( ${_floor_dir}/libld.so.2 ) )\n")
  foreach(_lib m pthread dl rt util resolv)
    file(GLOB _so ${_floor_dir}/lib${_lib}.so.*)
    file(CREATE_LINK ${_so} ${_floor_dir}/lib${_lib}.so SYMBOLIC)
  endforeach()
  file(WRITE ${_floor_dir}/stamp "${_floor_stamp}")
endif()

# Every link of this build from here on: the floor's folder first for startfiles (-B: Scrt1.o)
# and libraries (-L: -lc, -lm, ...); libpthread, libdl and librt named, since with glibc
# >= 2.34 nothing else names them (their functions moved into libc.so.6, which 2.28's lacks).
# Executables are PIE, the one start file the folder has.
add_link_options(-B${_floor_dir}/ -L${_floor_dir}
  $<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-pie>)
string(APPEND CMAKE_CXX_STANDARD_LIBRARIES " -lpthread -ldl -lrt")

# The functions newer than the floor that libstdc++.a, libgcc and the host's headers reference:
# linked as objects (not an archive) into every executable and module of this build, so they
# resolve references from the static libstdc++ and libgcc archives that come later on the
# link line too. Added once every target exists (a deferred call at the end of weightcast's
# top-level directory), to the linked targets only: on the static library it would enter its exported
# link interface.
add_library(weightcast_glibc_floor OBJECT ${CMAKE_CURRENT_LIST_DIR}/weightcastGlibcFloor.cpp)
set_target_properties(weightcast_glibc_floor PROPERTIES POSITION_INDEPENDENT_CODE ON
  CXX_VISIBILITY_PRESET hidden)
string(REGEX REPLACE "^2\\." "" _floor_minor "${WEIGHTCAST_GLIBC_FLOOR}")
target_compile_definitions(weightcast_glibc_floor PRIVATE
  WEIGHTCAST_GLIBC_FLOOR_MINOR=${_floor_minor})

function(_weightcast_glibc_floor_link dir)
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_target IN LISTS _targets)
    get_target_property(_type ${_target} TYPE)
    if(_type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY)$")
      set_property(TARGET ${_target} APPEND PROPERTY LINK_LIBRARIES weightcast_glibc_floor)
    endif()
  endforeach()
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(_subdir IN LISTS _subdirs)
    _weightcast_glibc_floor_link(${_subdir})
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} CALL
  _weightcast_glibc_floor_link ${CMAKE_CURRENT_SOURCE_DIR})
message(STATUS "weightcast: self-contained: glibc floor ${WEIGHTCAST_GLIBC_FLOOR} "
  "(stubs in ${_floor_dir})")

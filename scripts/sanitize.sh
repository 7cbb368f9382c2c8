#!/usr/bin/env bash
# Sanitizer stages (gcc), each in a build directory of its own: host only
# (-DWEIGHTCAST_CUDA=OFF), the test binary and the `weightcast` launcher it spawns, nothing
# else (no bench, no example, no install test).
# Usage: bash scripts/sanitize.sh [asan|tsan|all]        (default: all; CI runs all)
#
# asan: build-asan, -fsanitize=address,undefined with -D_GLIBCXX_ASSERTIONS. Runs the whole
#   ctest suite, [large] included (the three multi-GiB cases take under a minute here),
#   except install.example_trainer (label install): it installs the build and compiles
#   examples/trainer against the package, a packaging check that ./build already runs,
#   calling the same loader the other tests run here; and the one test that exhausts file
#   descriptors on purpose (UBSan's vptr check needs a free descriptor; see run_asan).
# tsan: build-tsan, -fsanitize=thread. Runs the tests that start weightcast's threads:
#   [reader]        the pread thread-pool reader, alone and under the loader;
#   [seccomp]       the launcher falling back to that reader where io_uring is refused;
#   [loader]        load_async's thread (the multi-GiB [large] case left out: no thread of
#                   its own, and minutes under TSan);
#   [control_plane] the control plane's io_context thread, three ranks in one process;
#   [multirank]     ranks under mpirun and the local spawner: MPI progress (MPI_Testall on
#                   the loader thread, Open MPI's own threads) beside the control plane's
#                   thread and the MPI_Init watchdog thread.
#   [log]           the logger, written from several threads at once.
#   Not covered: the CUDA path (cuda device, nccl transport, the driver's threads). It needs a
#   GPU, which this machine and CI lack, so both sanitizer builds are -DWEIGHTCAST_CUDA=OFF
#   (./build, scripts/test.sh's, compiles it in and runs its CPU-side tests, the run-time
#   loading of the CUDA runtime and NCCL included); note there
#   is no cudaLaunchHostFunc bridge to race on today (src/device/device_cuda.cpp polls CUDA events
#   from the loader's thread).
#
# A report fails the run: halt_on_error, and every runtime exits 86 (not a <sysexits.h>
# status a test expects; TSan's default, 66, is EX_NOINPUT). Children inherit the options
# (the launcher, mpirun's ranks), and the tests fail on any sanitizer report in a child's
# output whatever its exit status (tests/support/process.cpp). Suppressions name third-party
# libraries only: scripts/lsan.supp (Open MPI), scripts/tsan.supp.
#
# Each stage prints its build and test seconds. Configure with CMAKE_CXX_COMPILER_LAUNCHER=
# ccache in the environment to reuse objects across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage=${1:-all}
case "$stage" in
  asan | tsan | all) ;;
  *) echo "usage: bash scripts/sanitize.sh [asan|tsan|all]" >&2; exit 64 ;;
esac

# configure_and_build DIR SANITIZER-FLAGS: -O1 -g1, no NDEBUG, so asserts stay on.
configure_and_build() {
  local dir=$1 flags=$2 start=$SECONDS
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DWEIGHTCAST_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="${flags%% *}" >/dev/null || return
  cmake --build "$dir" -j "$(nproc)" --target weightcast_tests || return
  echo "sanitize: $dir built in $((SECONDS - start)) s"
}

run_asan() {
  configure_and_build build-asan \
    "-fsanitize=address,undefined -fno-sanitize-recover=all -D_GLIBCXX_ASSERTIONS" || return
  local start=$SECONDS
  # intercept_tls_get_addr=0: with it, LeakSanitizer's tracer crashes (SIGSEGV, "LeakSanitizer
  # has encountered a fatal error") in mpirun's ranks on a bogus dynamic-TLS range of an Open
  # MPI plugin; only those plugins' dynamic TLS goes unscanned.
  local asan="detect_leaks=1:halt_on_error=1:exitcode=86:check_initialization_order=1"
  asan+=":detect_stack_use_after_return=1:intercept_tls_get_addr=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=86${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  local status=0
  # Left out here: the test that holds every file descriptor on purpose. UBSan's vptr check
  # probes memory through a pipe, so with no descriptor free it reports every virtual call
  # as "invalid vptr" (seen on boost's error_category), and a suppression cannot match an
  # object whose type it could not read. The test runs in the plain build and under TSan.
  # Left out too: the namespace-cluster tests (label netns), which check what crosses a network,
  # not memory: they run the plain build's CLI in the test command.
  local out_of_fds='^control plane: rank 0 keeps accepting after running out of file descriptors$'
  ASAN_OPTIONS="$asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 900 -LE "install|netns" \
    -E "^(multirank|job|placement): |$out_of_fds" || status=1
  # The [multirank] tests (and the job and placement tests, which also run under mpirun) start
  # Open MPI, which unloads its plugins in MPI_Finalize: their
  # leaks at exit have no symbol. Unwinding each allocation fully (slower, so only here)
  # puts libmpi on the stack, which lsan.supp names.
  ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 900 -LE "install|netns" \
    -R '^(multirank|job|placement): ' || status=1
  echo "sanitize: asan tests ran in $((SECONDS - start)) s"
  return $status
}

run_tsan() {
  configure_and_build build-tsan "-fsanitize=thread" || return
  local start=$SECONDS
  local -a launch=()
  # GCC 12's TSan maps its shadow for at most 28 bits of mmap randomisation; a kernel with
  # more (vm.mmap_rnd_bits=32) makes it die with "unexpected memory mapping": run without
  # address randomisation there (setarch -R, inherited by the children).
  if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
    launch=(setarch "$(uname -m)" -R)
  fi
  local status=0
  TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp:halt_on_error=1:exitcode=86:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}" \
    "${launch[@]}" build-tsan/tests/weightcast_tests \
    "[reader],[seccomp],[loader]~[large],[control_plane],[multirank],[log]" || status=1
  echo "sanitize: tsan tests ran in $((SECONDS - start)) s"
  return $status
}

status=0
if [ "$stage" = asan ] || [ "$stage" = all ]; then run_asan || status=1; fi
if [ "$stage" = tsan ] || [ "$stage" = all ]; then run_tsan || status=1; fi
exit $status

#!/usr/bin/env bash
# CTest `install.example_trainer`: installs this build into a temporary prefix and builds
# against the installed package the way a trainer embeds weightcast (find_package(weightcast
# CONFIG), weightcast::weightcast), seeing only the prefix, never this source or build tree:
#   - what was installed: the public headers and no detail/ header, the library, the
#     launcher, the package; the exported target carries C++20 and none of this build's
#     compile definitions; a build without CUDA installs a package that never looks for it
#   - tests/package/install_consumer: sets no C++ standard, uses its own Boost.Asio (`io_service`),
#     compiles every installed header, loads a checkpoint; its digests are the launcher's
#   - examples/trainer: the blocking and the coroutine load, the exit status of a failed one
# The checkpoint is one this test writes (`weightcast synth`): no external corpus is needed.
#
# Usage: install_example.sh BUILD_DIR SOURCE_DIR CXX_COMPILER CXX_FLAGS GENERATOR
set -euo pipefail
build_dir=$1 source_dir=$2 cxx=$3 cxx_flags=$4 generator=$5

work=$(mktemp -d "${TMPDIR:-/tmp}/weightcast-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "install.example_trainer: $*" >&2; exit 1; }

prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"
package=$prefix/lib/cmake/weightcast
for f in include/weightcast/pipeline/loader.hpp include/weightcast/distributed/asio.hpp lib/libweightcast.a \
         lib/cmake/weightcast/weightcastConfig.cmake \
         lib/cmake/weightcast/weightcastConfigVersion.cmake \
         lib/cmake/weightcast/weightcastTargets.cmake bin/weightcast; do
  [ -e "$prefix/$f" ] || { cat "$work/install.log"; fail "not installed: $f"; }
done
# The CLI's test hooks (WEIGHTCAST_TEST_*, tools/test_hooks.cpp) are the build tree's only: the
# installed launcher must not read them, though this build has the test suite and its CLI does.
if grep -qa 'WEIGHTCAST_TEST_' "$prefix/bin/weightcast"; then
  fail "the installed bin/weightcast reads the test hooks (WEIGHTCAST_TEST_*)"
fi
if [ -x "$build_dir/weightcast" ] && ! grep -qa 'WEIGHTCAST_TEST_' "$build_dir/weightcast"; then
  fail "the build tree's weightcast has no test hooks: the check above proves nothing"
fi
# Internals stay in the source tree: tests/package/install_consumer compiles every installed header,
# so one that included a detail/ header would fail there.
internal=$(cd "$prefix" && find include -path '*/detail*')
[ -z "$internal" ] || fail "internal headers installed: $internal"
if grep -q 'INTERFACE_COMPILE_DEFINITIONS' "$package"/weightcastTargets*.cmake; then
  grep 'INTERFACE_COMPILE_DEFINITIONS' "$package"/weightcastTargets*.cmake >&2
  fail "the exported target passes on compile definitions of weightcast's own build"
fi
grep -q 'INTERFACE_COMPILE_FEATURES "cxx_std_20"' "$package/weightcastTargets.cmake" ||
  fail "the exported target does not carry cxx_std_20"
# A build without CUDA: its package must configure where no CUDA toolkit is (the consumer
# below is configured with find_package(CUDAToolkit) disabled).
consumer_flags=()
if grep -q 'set(weightcast_cuda_FOUND OFF)' "$package/weightcastConfig.cmake"; then
  if grep -qE '^(find_dependency\(CUDAToolkit|weightcast_find_nccl\()' \
       "$package/weightcastConfig.cmake" ||
     grep -qE 'CUDA::|weightcast_nccl' "$package"/weightcastTargets*.cmake; then
    fail "a build without CUDA installs a package that looks for CUDA or NCCL"
  fi
  consumer_flags+=(-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
fi
grep -q 'set(weightcast_mpi_FOUND ON)' "$package/weightcastConfig.cmake" &&
  consumer_flags+=(-DWEIGHTCAST_COMPONENTS=mpi)

# The checkpoint: a small sharded Llama-shaped one, and the launcher's digests of it.
checkpoint=$work/checkpoint
"$prefix/bin/weightcast" synth "$checkpoint" --params 1M --shard-size 512KiB --seed 7 \
  > "$work/synth.log"
[ -f "$checkpoint/model.safetensors.index.json" ] || fail "synth wrote no sharded checkpoint"
"$prefix/bin/weightcast" run --set checkpoint="$checkpoint" --set device=host \
  --set chunk_size=64KiB --report "$work/report.json" > "$work/run.log"
# "NAME XXH3" per tensor, in catalogue order, from the report (indented one space a level).
awk '/^ "tensors": \{/ { in_tensors = 1; next }
     in_tensors && /^  "/ { name = $0; sub(/^  "/, "", name); sub(/": \{$/, "", name) }
     in_tensors && /^   "xxh3": / { hash = $2; gsub(/"/, "", hash); print name, hash }' \
  "$work/report.json" > "$work/expected.digests"
tensors=$(wc -l < "$work/expected.digests")
[ "$tensors" -gt 10 ] || fail "the report lists $tensors tensor digests"

# Debug (-O0) compiles the consumers fastest; the compiler and flags are the build's (a
# sanitizer build's static library needs the sanitizer at link time too).
configure() {  # configure SOURCE BUILD ARGS...
  local src=$1 out=$2
  shift 2
  cmake -S "$src" -B "$out" -G "$generator" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@"
}

configure "$source_dir/tests/package/install_consumer" "$work/consumer" "${consumer_flags[@]}"
cmake --build "$work/consumer"
"$work/consumer/consumer" "$checkpoint" > "$work/consumer.out"
grep -qx "tensors: $tensors" "$work/consumer.out" || fail "consumer: $(head -1 "$work/consumer.out")"
if ! diff <(tail -n +2 "$work/consumer.out") "$work/expected.digests" >&2; then
  fail "the consumer's tensor digests differ from the launcher's report"
fi
echo "consumer: $tensors tensors, digests equal the launcher's"

configure "$source_dir/examples/trainer" "$work/trainer"
cmake --build "$work/trainer"
check() {  # check MODE_ARGS...: runs the trainer, checks what it printed
  "$work/trainer/trainer" "$@" > "$work/trainer.out"
  cat "$work/trainer.out"
  grep -qx "tensors: $tensors" "$work/trainer.out" || fail "trainer $*: wrong tensor count"
  grep -q '^bytes: [1-9][0-9]*$' "$work/trainer.out" || fail "trainer $*: no bytes loaded"
  grep -qE '^first tensor: .* first bytes:( [0-9a-f]{2})+$' "$work/trainer.out" ||
    fail "trainer $*: no first tensor bytes"
}
check "$checkpoint"
grep -q '^mode: blocking' "$work/trainer.out" || fail "trainer: not the blocking load"
check --coroutine "$checkpoint"
grep -q '^mode: coroutine' "$work/trainer.out" || fail "trainer --coroutine: not the coroutine load"
# A failed load ends the trainer with weightcast's <sysexits.h> status (66: no such file).
for mode in "" --coroutine; do
  status=0
  "$work/trainer/trainer" $mode "$work/no-such.safetensors" 2>/dev/null || status=$?
  [ "$status" -eq 66 ] || fail "trainer $mode on a missing file exited $status, not 66"
done
# examples/trainer/distributed.cpp, on 3 ranks under mpirun (a build with MPI): bit-exact on
# every rank, with weightcast's own MPI and with the trainer's communicator handed in.
if [ -e "$work/trainer/distributed_trainer" ]; then
  mpirun=$(command -v mpirun) || fail "weightcast has MPI but mpirun is not on PATH"
  mpirun_options=(--oversubscribe)
  [ "$(id -u)" -ne 0 ] || mpirun_options+=(--allow-run-as-root)
  # A rendezvous port of its own, free on every address, at random below Linux's ephemeral
  # range (ip_local_port_range): a port in that range, free a moment ago, may be another
  # process's connection by the time rank 0 binds it ("Address already in use"), as a random
  # one in 30000-49999 once was (tests/support/ports.cpp).
  free_port() {
    python3 -c '
import random, socket
highest = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0]) - 1
for _ in range(1000):
    port = random.randint(10000, highest)
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            continue
    print(port)
    break
'
  }
  for comm in world dup reversed; do
    digests=$work/digests-$comm
    mkdir -p "$digests"
    port=$(free_port)
    if ! timeout 300 "$mpirun" "${mpirun_options[@]}" -np 3 "$work/trainer/distributed_trainer" \
           --comm "$comm" --port "$port" --digests "$digests" "$checkpoint" \
           > "$work/mpi-$comm.out" 2>&1; then
      cat "$work/mpi-$comm.out" >&2
      fail "distributed_trainer --comm $comm on 3 ranks failed"
    fi
    cat "$work/mpi-$comm.out"
    for rank in 0 1 2; do
      grep -q "^rank $rank of 3: $tensors tensors, [1-9][0-9]* bytes; " \
        "$work/mpi-$comm.out" || fail "--comm $comm: rank $rank did not report its load"
      if ! diff "$digests/rank-$rank.digests" "$work/expected.digests" >&2; then
        fail "--comm $comm: rank $rank's tensor digests differ from the launcher's report"
      fi
    done
  done
  # The handed-in communicator is the one the job ran on: reversed, its rank 0 (the reader)
  # is the last process of MPI_COMM_WORLD.
  for rank in 0 1 2; do
    grep -q "^rank $rank of 3: .*(MPI_COMM_WORLD rank $rank)$" "$work/mpi-dup.out" ||
      fail "--comm dup: rank $rank is not MPI_COMM_WORLD's rank $rank"
    grep -q "^rank $rank of 3: .*(MPI_COMM_WORLD rank $((2 - rank)))$" "$work/mpi-reversed.out" ||
      fail "--comm reversed: rank $rank is not MPI_COMM_WORLD's rank $((2 - rank))"
  done
  # A failed job ends every rank with weightcast's <sysexits.h> status (66: no such file),
  # which mpirun passes on.
  status=0
  timeout 300 "$mpirun" "${mpirun_options[@]}" -np 3 "$work/trainer/distributed_trainer" \
    --port "$(free_port)" "$work/no-such.safetensors" > "$work/mpi-fail.out" 2>&1 ||
    status=$?
  if [ "$status" -ne 66 ]; then
    cat "$work/mpi-fail.out" >&2
    fail "distributed_trainer on a missing file exited $status, not 66"
  fi
  echo "distributed_trainer: 3 ranks bit-exact, with weightcast's MPI and the trainer's communicator"
fi
echo "install.example_trainer: passed"

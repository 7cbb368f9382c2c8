#!/usr/bin/env bash
# Installs every Debian package weightcast needs to build, test and benchmark.
# Idempotent: safe to run again; does nothing when everything is present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost1.81-dev liburing-dev libfmt-dev catch2 libyaml-cpp-dev
  libxxhash-dev libcli11-dev nlohmann-json3-dev libspdlog-dev
  libopenmpi-dev openmpi-bin libpmix-dev libseccomp-dev libutf8proc-dev
  fio time
  patchelf debootstrap
  clang libclang-rt-14-dev
  python3-dev python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all packages present"
fi

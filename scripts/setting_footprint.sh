#!/usr/bin/env bash
# A setting's footprint: the files that spell it, split into where it is defined (its
# registry entry in core/settings.hpp, its field and plain-key line in config/config.hpp, its
# row in docs/config.md, its line in configs/default.yaml) and everywhere else that names it
# (the code that uses it, other docs, the Python keywords). Adding a setting of a plain type
# (a size, count, duration, choice or text) touches the defining files only, plus its users:
# the key table, the registry's list and every surface's bounds follow from the registry
# (tests/python/test_surfaces.py and test_config.cpp's key-table case check that).
#
#   scripts/setting_footprint.sh [NAME...]   (default: io_depth)
#
# Prints, per NAME: "NAME: N files (D defining, U using)", then each file, marked.
set -euo pipefail
cd "$(dirname "$0")/.."

defining=(include/weightcast/core/settings.hpp include/weightcast/config/config.hpp
          docs/config.md configs/default.yaml)
(($#)) || set -- io_depth
# The files come from git (tracked and new ones); without it the count would silently be 0.
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
  echo "setting_footprint.sh: needs git and a git checkout of weightcast (here: $PWD)" >&2
  exit 69
}
for name in "$@"; do
  mapfile -t files < <(git ls-files -z --cached --others --exclude-standard -- \
                           . ':!tests' ':!bench' ':!scripts/setting_footprint.sh' |
                         xargs -0 grep -lw -- "$name" | sort)
  d=0 u=0 lines=()
  for f in "${files[@]}"; do
    if [[ " ${defining[*]} " == *" $f "* ]]; then
      d=$((d + 1)) lines+=("defines  $f")
    else
      u=$((u + 1)) lines+=("uses     $f")
    fi
  done
  printf '%s: %d files (%d defining, %d using)\n' "$name" "${#files[@]}" "$d" "$u"
  printf '  %s\n' "${lines[@]}"
done

#!/usr/bin/env bash
# How many files spell a setting: the files outside tests/ and bench/ that name it as a word
# (its config key, its Python keyword). A setting whose default, bounds and spellings live in
# the registry (core/settings.hpp) alone should be named only where it is defined, parsed,
# used and documented; every other surface reads the registry (tests/python/test_surfaces.py
# checks that the docs' and docstrings' bounds are the registry's).
#
#   scripts/setting_footprint.sh [NAME...]   (default: io_depth)
#
# Prints one line per NAME: the count, then the files.
set -euo pipefail
cd "$(dirname "$0")/.."

(($#)) || set -- io_depth
for name in "$@"; do
  mapfile -t files < <(git ls-files -z --cached --others --exclude-standard -- \
                           . ':!tests' ':!bench' ':!scripts/setting_footprint.sh' |
                         xargs -0 grep -lw -- "$name" | sort)
  printf '%s: %d files\n' "$name" "${#files[@]}"
  printf '  %s\n' "${files[@]}"
done

#!/usr/bin/env bash
# Fails when a header or source of the library includes a higher layer's header, in the
# layering of docs/DESIGN.md § Map of the code. A layer may include only its own headers and
# those of the layers before it in LAYERS. tools/ (the CLI) and python/ (the extension's C++
# sources) sit above them all: they may include any library header, but no library layer may
# include one of theirs, and neither may include the other's. Prints every violation as
# file:line, then exits 1.
# Usage: bash scripts/check_layers.sh [source root]   (default: this checkout)
set -euo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root"

LAYERS=(core format checkpoint plan device transport io control pipeline config distributed)

# Includes of a higher layer allowed for a while, each "file: included header", with the
# reason beside it. An entry no longer found is reported, so the list cannot outlive its reason.
ALLOWED=(
)

declare -A rank
for i in "${!LAYERS[@]}"; do rank[${LAYERS[$i]}]=$i; done
declare -A allowed_seen
for entry in "${ALLOWED[@]}"; do allowed_seen[$entry]=0; done

violations=0
for layer in "${LAYERS[@]}"; do
  for dir in "include/weightcast/$layer" "src/$layer"; do
    [ -d "$dir" ] || continue
    while IFS= read -r hit; do
      file=${hit%%:*}
      rest=${hit#*:}
      line=${rest%%:*}
      text=${rest#*:}
      # The header as included: "weightcast/<layer>/..." between quotes or angle brackets.
      header=$(sed -nE 's@^[[:space:]]*#[[:space:]]*include[[:space:]]*["<](weightcast/[^">]+)[">].*@\1@p' <<<"$text")
      [ -n "$header" ] || continue
      target=${header#weightcast/}
      target=${target%%/*}
      [ -n "${rank[$target]+x}" ] || continue  # weightcast/version.hpp and the like
      if (( rank[$target] > rank[$layer] )); then
        key="$file: $header"
        if [ -n "${allowed_seen[$key]+x}" ]; then
          allowed_seen[$key]=1
          continue
        fi
        echo "$file:$line: layer $layer includes $header of the higher layer $target"
        violations=$((violations + 1))
      fi
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]weightcast/' "$dir" \
               --include='*.hpp' --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
  done
done

# The two folders above the library: their own headers, included by a bare name ("loads.hpp")
# or a path through the folder ("tools/progress.hpp", "../python/loads.hpp").
TOPS=(tools python)
declare -A top_headers
for top in "${TOPS[@]}"; do
  for h in "$top"/*.hpp "$top"/*.h; do
    [ -f "$h" ] && top_headers[$top]+=" ${h##*/} "
  done
done

# Prints the folder of TOPS whose header @2 names, as a file of @1's directory includes it; none
# when it is a header beside @1 (its own folder's) or of neither folder.
top_of_include() {
  local file=$1 header=$2 top
  for top in "${TOPS[@]}"; do
    if [[ "$header" == "$top/"* || "$header" == */"$top/"* ]]; then echo "$top"; return 0; fi
    if [[ "$header" != */* && "${top_headers[$top]:-}" == *" $header "* ]]; then
      [ -f "$(dirname "$file")/$header" ] && return 0  # A header of the file's own folder.
      echo "$top"; return 0
    fi
  done
}

# @1: the folders to read; @2: what they are called in messages; @3: the folders of TOPS they
# may include ("" for none).
check_tops() {
  local dirs=$1 what=$2 may=$3 hit file rest line text header top
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    text=${rest#*:}
    header=$(sed -nE 's@^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*@\1@p' <<<"$text")
    [ -n "$header" ] || continue
    [[ "$header" == weightcast/* ]] && continue
    top=$(top_of_include "$file" "$header")
    [ -n "$top" ] || continue
    [[ " $may " == *" $top "* ]] && continue
    echo "$file:$line: $what includes $header of $top/"
    violations=$((violations + 1))
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' $dirs \
             --include='*.hpp' --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
}

library_dirs=()
for layer in "${LAYERS[@]}"; do
  for dir in "include/weightcast/$layer" "src/$layer"; do
    [ -d "$dir" ] && library_dirs+=("$dir")
  done
done
check_tops "${library_dirs[*]}" "the library" ""
check_tops "tools" "tools/ (the CLI)" "tools"
check_tops "python" "python/ (the extension)" "python"

stale=0
for entry in "${ALLOWED[@]}"; do
  if [ "${allowed_seen[$entry]}" = 0 ]; then
    echo "check_layers: allowed violation no longer found, remove it from ALLOWED: $entry"
    stale=$((stale + 1))
  fi
done

if (( violations > 0 )); then
  echo "check_layers: $violations include(s) of a higher layer's header (layer order:" \
       "${LAYERS[*]}; tools/ and python/ above all, and apart)"
  exit 1
fi
# A stale entry fails too: each branch that removes a violation removes its entry as well.
if (( stale > 0 )); then exit 1; fi
echo "check_layers: no layer includes a higher layer's header, none includes tools/ or python/," \
     "and neither includes the other's (${#ALLOWED[@]} known, allowed)"

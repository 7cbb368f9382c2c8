#!/usr/bin/env bash
# Fails when a header or source of the library includes a higher layer's header, in the
# layering of docs/DESIGN.md § Map of the code. A layer may include only its own headers and
# those of the layers before it in LAYERS; tools/ and python/ sit above them all and are not
# checked. Prints every violation as file:line, then exits 1.
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

stale=0
for entry in "${ALLOWED[@]}"; do
  if [ "${allowed_seen[$entry]}" = 0 ]; then
    echo "check_layers: allowed violation no longer found, remove it from ALLOWED: $entry"
    stale=$((stale + 1))
  fi
done

if (( violations > 0 )); then
  echo "check_layers: $violations include(s) of a higher layer's header (layer order:" \
       "${LAYERS[*]}; tools/ and python/ above all)"
  exit 1
fi
# A stale entry fails too: each branch that removes a violation removes its entry as well.
if (( stale > 0 )); then exit 1; fi
echo "check_layers: no layer includes a higher layer's header (${#ALLOWED[@]} known, allowed)"

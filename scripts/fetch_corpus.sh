#!/usr/bin/env bash
# Fetches weightcast's external test corpus and checks every file against its SHA-256.
#
# Usage: scripts/fetch_corpus.sh [--from MIRROR] [--github URL] [--lfs URL] [--verify] DEST
#
#   DEST           where the corpus goes (created). The tests look in $WEIGHTCAST_CORPUS, else
#                  in ../shared/corpus beside the source tree (docs/install.md).
#   --from MIRROR  take every file from a copy of the corpus: a directory, or a URL (file://,
#                  https://) of one laid out as the corpus is (real/, malformed/, ...). The
#                  corpus's own files (its MANIFEST.json, the expected.json verdicts, the
#                  format's malformed/ and sharded/ cases) and the files extracted from source
#                  literals exist only there.
#   --github URL   where the repositories' files are read from, laid out URL/OWNER/REPO/
#                  COMMIT/PATH (default https://raw.githubusercontent.com, the files as
#                  committed) ...
#   --lfs URL      ... and where a file committed as a Git LFS pointer is read from when the
#                  committed bytes do not match (default https://media.githubusercontent.com/
#                  media; none when --github is given without --lfs).
#   --verify       fetch nothing: check the files already in DEST.
#
# What to fetch is scripts/corpus.lock: per file its SHA-256, its size, its path in the corpus
# and where it comes from (repository @ commit : path, the corpus's provenance list). A file
# whose bytes do not hash to the list's SHA-256 is refused and never lands in DEST; one
# already in DEST with the right hash is kept. Then, where python3 is present, each real/
# file's tensors are checked against real/MANIFEST.json (every tensor's SHA-256, dtype and
# shape). Needs curl and sha256sum.
#
# Exit status: 0 when every file of the list is in DEST and verified; 1 when any is missing
# or fails a check (each is named, with why); 64 for a usage error.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
lock=$here/corpus.lock
from="" github="https://raw.githubusercontent.com" lfs="https://media.githubusercontent.com/media"
verify_only=0 dest="" lfs_given=""
usage() { sed -n '4p' "$0" | sed 's/^# //' >&2; exit 64; }
while (($#)); do
  case $1 in
    --from) (($# >= 2)) || usage; from=${2%/}; shift 2 ;;
    --github) (($# >= 2)) || usage; github=${2%/}; [ -n "$lfs_given" ] || lfs=""; shift 2 ;;
    --lfs) (($# >= 2)) || usage; lfs=${2%/}; lfs_given=1; shift 2 ;;
    --verify) verify_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fetch_corpus: unknown option $1" >&2; usage ;;
    *) [ -z "$dest" ] || usage; dest=$1; shift ;;
  esac
done
[ -n "$dest" ] || usage
for tool in curl sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch_corpus: needs $tool" >&2; exit 1; }
done
# A mirror given as a plain directory is read through file:// like any other URL.
if [ -n "$from" ] && [[ $from != *://* ]]; then
  [ -d "$from" ] || { echo "fetch_corpus: --from $from: not a directory" >&2; exit 64; }
  from="file://$(cd "$from" && pwd)"
fi
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/weightcast-corpus-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# fetch URL SIZE OUT: the file at URL into OUT, refusing more than SIZE bytes (a Git LFS
# object where a pointer was expected must not fill the disk).
fetch() {
  curl -fsSL --proto '=https,file' --retry 2 --max-filesize "$2" -o "$3" "$1" 2>"$tmp/curl.err"
}

ok=0 failed=0 missing=0 unfetchable=()
while IFS=$'\t' read -r sha size path where; do
  [[ -z $sha || $sha == \#* ]] && continue
  target=$dest/$path
  if [ -f "$target" ] && [ "$(sha_of "$target")" = "$sha" ]; then
    ok=$((ok + 1)); continue
  fi
  if ((verify_only)); then
    if [ -f "$target" ]; then
      echo "fetch_corpus: $path: SHA-256 $(sha_of "$target"), expected $sha" >&2
      failed=$((failed + 1))
    else
      echo "fetch_corpus: $path: missing" >&2; missing=$((missing + 1))
    fi
    continue
  fi
  urls=()
  if [ -n "$from" ]; then
    urls+=("$from/$path")
  elif [[ $where =~ ^github:([^@]+)@([0-9a-f]+):(.+)$ ]]; then
    ref="${BASH_REMATCH[1]}/${BASH_REMATCH[2]}/${BASH_REMATCH[3]}"
    urls+=("$github/$ref")
    [ -z "$lfs" ] || urls+=("$lfs/$ref")
  else
    unfetchable+=("$path")
    missing=$((missing + 1)); continue
  fi
  got="" why=""
  for url in "${urls[@]}"; do
    rm -f "$tmp/file"
    if ! fetch "$url" "$size" "$tmp/file"; then
      why="$why; $url: $(tr '\n' ' ' <"$tmp/curl.err")"; continue
    fi
    actual=$(sha_of "$tmp/file")
    if [ "$actual" = "$sha" ]; then got=$url; break; fi
    why="$why; $url: SHA-256 $actual, expected $sha"
  done
  if [ -z "$got" ]; then
    echo "fetch_corpus: $path: refused${why}" >&2
    failed=$((failed + 1)); continue
  fi
  mkdir -p "$(dirname "$target")"
  mv -f "$tmp/file" "$target"
  ok=$((ok + 1))
done <"$lock"

if ((${#unfetchable[@]})); then
  # Grouped by folder: the format's cases are dozens of small files.
  echo "fetch_corpus: not fetched, no public repository holds them (the corpus's own files," \
       "bytes extracted from source literals); take them from a copy of the corpus with" \
       "--from:" >&2
  printf '%s\n' "${unfetchable[@]}" | awk '
    { split($0, p, "/"); key = (p[1] == "malformed" || p[1] == "sharded") ? p[1] "/" : $0
      if (!(key in count)) order[++k] = key; count[key]++ }
    END { for (i = 1; i <= k; i++)
            printf "  %s%s\n", order[i], (count[order[i]] > 1 ? " (" count[order[i]] " files)" : "") }' >&2
fi

# The tensors of every real/ file against the manifest, read with an independent parser.
manifest_status=0
if [ -f "$dest/real/MANIFEST.json" ] && command -v python3 >/dev/null; then
  python3 - "$dest/real" <<'EOF' || manifest_status=1
import hashlib, json, os, struct, sys
root = sys.argv[1]
manifest = json.load(open(os.path.join(root, "MANIFEST.json")))
bad = 0
for name, tensors in sorted(manifest.items()):
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        continue  # reported above as missing
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    problems = []
    if set(header) != set(tensors):
        problems.append("tensor names differ from the manifest's")
    for tensor, entry in tensors.items():
        info = header.get(tensor)
        if info is None:
            continue
        begin, end = info["data_offsets"]
        digest = hashlib.sha256(data[base + begin:base + end]).hexdigest()
        if digest != entry["sha256"] or info["dtype"] != entry["dtype"] \
                or list(info["shape"]) != list(entry["shape"]):
            problems.append(f"tensor '{tensor}' differs from the manifest")
    for p in problems:
        print(f"fetch_corpus: real/{name}: {p}", file=sys.stderr)
    bad += bool(problems)
sys.exit(1 if bad else 0)
EOF
elif [ -f "$dest/real/MANIFEST.json" ]; then
  echo "fetch_corpus: python3 not found: the tensors were not checked against MANIFEST.json" \
       "(each file's SHA-256 was)" >&2
fi

total=$((ok + failed + missing))
echo "fetch_corpus: $dest: $ok of $total files verified, $failed failed the check," \
     "$missing missing"
if ((failed || missing || manifest_status)); then exit 1; fi
echo "fetch_corpus: complete; run the tests with WEIGHTCAST_CORPUS=$dest"

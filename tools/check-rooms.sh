#!/usr/bin/env bash
# Checks that each room of the code includes only what docs/design-notes.md ("The rooms")
# lets it: the project's own headers by directory, and the libraries only one room may see.
# Prints one line per breach, "file:line: <room> may not include <header>", and exits 1 if
# there is any. Run by ctest (rooms_test).
set -euo pipefail
cd "$(dirname "$0")/.."

# room (a directory; the longest match wins) -> the directories of ours it may include.
declare -A allowed=(
  [common]="common/"
  [ps]="common/ ps/"
  [worker]="common/ worker/"
  [worker/data]="common/ worker/data/"
  [worker/model]="common/ worker/model/"
  [worker/compute]="common/ worker/compute/ worker/model/"
  [deploy/launch]="common/ deploy/launch/ worker/data/"
)
# Headers only one place may include (a file or a directory prefix).
declare -A only_in=(
  ["schema/parasync_generated.h"]="common/wire.cc"
  ["rocksdb/"]="ps/"
)

room_of() {
  local file="$1" best=""
  for room in "${!allowed[@]}"; do
    if [[ "$file" == "$room"/* && ${#room} -gt ${#best} ]]; then best="$room"; fi
  done
  echo "$best"
}

breaches=0
while IFS= read -r file; do
  room="$(room_of "$file")"
  while IFS=: read -r line header; do
    for special in "${!only_in[@]}"; do
      if [[ "$header" == "$special"* && "$file" != "${only_in[$special]}"* ]]; then
        echo "$file:$line: only ${only_in[$special]} may include $header"
        breaches=$((breaches + 1))
      fi
    done
    [[ "$header" == */* ]] || continue
    top="${header%%/*}"
    [[ -d "$top" && "$top" != schema ]] || continue  # a library's header, not ours
    ok=0
    for prefix in ${allowed[$room]}; do
      [[ "$header" == "$prefix"* ]] && ok=1
    done
    if [[ $ok -eq 0 ]]; then
      echo "$file:$line: $room/ may not include $header"
      breaches=$((breaches + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<][^">]+[">]' "$file" |
           sed -E 's/^([0-9]+):[^"<]*["<]([^">]+)[">].*/\1:\2/' || true)
done < <(find common ps worker deploy/launch -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) | sort)

if [[ $breaches -gt 0 ]]; then
  echo "check-rooms: $breaches include(s) cross a room's wall (docs/design-notes.md, \"The rooms\")" >&2
  exit 1
fi
echo "check-rooms: every include stays within its room's walls"

#!/usr/bin/env bash
# Lists the functions longer than a bound (default 100 lines) in the given directories
# (default: where the bound applies: the four rooms ps/ worker/ common/ deploy/launch/, the
# tools and benchmarks under tools/, and the fuzz harness and corpus generator under
# tests/fuzz/), longest first: "lines name file:line". Exits 1 when there is any. Uses
# universal-ctags' end: field, so a lambda counts toward the function it is written in.
#   tools/function-lengths.sh [--max N] [DIR...]
set -euo pipefail
cd "$(dirname "$0")/.."
max=100
if [[ "${1:-}" == "--max" ]]; then max="$2"; shift 2; fi
dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=(ps worker common deploy/launch tools tests/fuzz)
command -v ctags >/dev/null || { echo "function-lengths: needs universal-ctags (apt-get install universal-ctags)" >&2; exit 2; }
mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) | sort)
long="$(ctags --language-force=C++ --c++-kinds=f --fields=+ne -o - "${files[@]}" |
  awk -F'\t' -v max="$max" '{
    line = ""; end = ""
    for (i = 4; i <= NF; ++i) {
      if ($i ~ /^line:/) line = substr($i, 6)
      if ($i ~ /^end:/) end = substr($i, 5)
    }
    if (line != "" && end != "" && end - line + 1 > max) printf "%5d %s %s:%s\n", end - line + 1, $1, $2, line
  }' | sort -rn)"
[[ -z "$long" ]] || { echo "$long"; exit 1; }

#!/usr/bin/env bash
# Installs the dependencies, builds everything (the CUDA module too where nvcc exists) and
# runs the whole test suite with CTest: unit tests and multi-process integration tests.
# No GPU is needed; tests labelled gpu skip themselves without one. Then, each in a build
# tree of its own (docs/fuzzing.md):
#   engines  deploy/ on real engines (ctest label `engines`, left out of main): the Slurm
#         batch script on a Slurm cluster of network namespaces, the Docker image and the
#         compose cluster on a Docker daemon, the systemd units under systemd in a
#         container; installs Slurm, munge, Docker and debootstrap first
#         (tools/install-deps.sh --engines); a test that cannot run here fails
#   asan  the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer (+ LSan)
#   fuzz  the PS message fuzzer (clang, libFuzzer): the corpus replayed, then 60 s of fuzzing
# Every stage runs even when an earlier one failed; the exit status is 0 only if all passed,
# and a summary line per stage ends the output.
#
# PARASYNC_TEST_STAGES picks stages (default "main,engines,asan,fuzz"; e.g. "main" for a
# quick local run). .ci/run runs exactly this script with the default.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${PARASYNC_TEST_STAGES:-main,engines,asan,fuzz}
for s in ${stages//,/ }; do
  case "$s" in
    main|engines|asan|fuzz) ;;
    *) echo "run-tests: unknown stage '$s' in PARASYNC_TEST_STAGES (main, engines, asan, fuzz)" >&2; exit 2 ;;
  esac
done
has_stage() { [[ ",$stages," == *",$1,"* ]]; }

tools/install-deps.sh --tests
# The deploy/ validators' npm packages (ctest check_manifests), pinned by package-lock.json;
# refreshed only when the lock file is newer than the install. Node.js comes with npm where
# it is nodesource's; Debian's nodejs needs its npm package.
if ! command -v npm >/dev/null 2>&1; then tools/install-deps.sh npm; fi
if [[ ! tests/deploy/manifests/node_modules/.package-lock.json -nt tests/deploy/manifests/package-lock.json ]]; then
  npm ci --prefix tests/deploy/manifests --no-audit --no-fund ||
    npm ci --prefix tests/deploy/manifests --no-audit --no-fund
fi

summary=()
failed=0
run_stage() {
  local name=$1
  shift
  local start rc=0
  start=$(date +%s)
  echo "run-tests: stage $name: started $(date -u +%H:%M:%SZ)"
  "$@" || rc=$?
  local took=$(( $(date +%s) - start ))
  summary+=("$(printf '%-5s %s in %d min %02d s' "$name" "$([[ $rc -eq 0 ]] && echo passed || echo "FAILED (status $rc)")" $((took / 60)) $((took % 60)))")
  if [[ $rc -ne 0 ]]; then failed=1; fi
}

# The stages below run through run_stage, which shellcheck cannot follow.
# shellcheck disable=SC2317
main_stage() {
  tools/build.sh
  (cd "${BUILD_DIR:-build}" && ctest --output-on-failure --parallel "$(nproc)" --timeout 600 \
    --label-exclude engines)
}

# One test at a time (each runs a whole cluster); their own timeouts (tests/deploy).
# shellcheck disable=SC2317
engines_stage() {
  tools/install-deps.sh --engines
  tools/build.sh
  (cd "${BUILD_DIR:-build}" && PARASYNC_ENGINES_REQUIRED=1 ctest --output-on-failure \
    --label-regex engines)
}

if has_stage main; then run_stage main main_stage; fi
if has_stage engines; then run_stage engines engines_stage; fi
if has_stage asan; then run_stage asan tools/run-sanitizers.sh asan; fi
if has_stage fuzz; then run_stage fuzz tools/run-sanitizers.sh fuzz; fi

echo "run-tests: summary"
for line in "${summary[@]}"; do echo "  $line"; done
exit "$failed"

# deploy/ checked offline by tests/deploy/manifests/check.sh: the Kubernetes manifests
# (kustomize output) against the Kubernetes schemas, the compose files against the Compose
# Specification, the systemd units with systemd-analyze, every shell script with
# shellcheck, the Dockerfile's sources and packages (the runtime packages against the
# libraries the built binaries load). Needs `npm ci --prefix tests/deploy/manifests` once
# (the validators' npm packages); without it the test fails with one line saying so.
add_test(NAME check_manifests
  COMMAND ${PROJECT_SOURCE_DIR}/tests/deploy/manifests/check.sh ${PROJECT_SOURCE_DIR}
    ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(check_manifests PROPERTIES
  LABELS deploy
  TIMEOUT 180)

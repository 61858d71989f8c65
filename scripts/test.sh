#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests (as root: they create
# namespaces and cgroups), and the cgroup v2 test in a QEMU VM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --release -p skiff
cargo test --workspace -- --test-threads=2

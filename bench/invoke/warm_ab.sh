#!/usr/bin/env bash
# Two skiff builds side by side on the warm path: for each of ROUNDS rounds, each build
# serves noop-python on a fresh data directory and oha drives it over TCP at 1 and 16
# connections for 4 s; prints req/s and p50 per build, alternating A and B.
# Usage: bench/invoke/warm_ab.sh SKIFF_A SKIFF_B [ROUNDS]   (as root; oha on PATH or in ~/.cargo/bin)
set -euo pipefail
cd "$(dirname "$0")/../.."
a=$(realpath "$1"); b=$(realpath "$2"); rounds=${3:-2}
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
one() {   # $1: label, $2: skiff, $3: port
  local data; data=$(mktemp -d /tmp/skiff-warm-ab.XXXXXX)
  "$2" --data-dir "$data" --socket "$data/s.sock" serve --listen "127.0.0.1:$3" 2>"$data/log" &
  local daemon=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$3/healthz" >/dev/null && break; sleep 0.05; done
  "$2" --socket "$data/s.sock" deploy bench/invoke/functions/noop-python >/dev/null
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$3/fn/noop-python"
  for c in 1 16; do
    "$OHA" --no-tui --output-format json -z 4s -w -c "$c" -m POST "http://127.0.0.1:$3/fn/noop-python" |
      python3 -c "import json, sys; o = json.load(sys.stdin); print('$1 c=$c', round(o['summary']['requestsPerSec']), 'req/s, p50 %.3f ms' % (o['latencyPercentiles']['p50'] * 1e3))"
  done
  kill "$daemon"; wait "$daemon" 2>/dev/null || true
  "$2" --data-dir "$data" gc --pools >/dev/null 2>&1 || true
  rm -rf "$data"
}
for _ in $(seq "$rounds"); do one A "$a" 18501; one B "$b" 18502; done

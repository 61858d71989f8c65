#!/usr/bin/env bash
# bench/sessions: skiff's session state vs the same wasm app keeping its state in a local
# redis-server (XFaaS §4), side by side in one run (issue 6).
#   closed loop: kvapp's RO, RMW (weak) and RMW-Linear (strong) on 1 KiB values, 1..80
#          clients over the Unix socket; kv-session sends every request to one session
#          (primary + secondaries past 10 in flight, XFaaS's setting), kv-redis the same
#          keys through GET/SET and WATCH/MULTI/EXEC; mean and p99 latency, throughput
#   micro: inside a worker (bench/sessions/micro): a request in a fresh instance, a 1 KiB
#          state read in the primary and over a secondary's RPC, next to a Redis GET
#   cold:  a new session, a secondary worker, a restore from a 1 MiB checkpoint (cold.py)
# Usage: bench/sessions/run.sh [--quick]      (as root; ~5 min, --quick ~1.5)
#   env SKIFF_BIN=PATH: use this skiff binary instead of building one
# Writes bench/out/sessions/{*.jsonl,sessions.md,daemon.log}, bench/sessions.png and prints
# the tables. Stops only the daemon and redis-server it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
quick=0
case "${1:-}" in --quick) quick=1 ;; "") ;; *) echo "usage: $0 [--quick]" >&2; exit 2 ;; esac
if [ $quick = 1 ]; then SECS=1.5; CLIENTS="1 10 40"; REPS=4; RUNS=5000
else SECS=3; CLIENTS="1 2 5 10 20 40 80"; REPS=10; RUNS=20000; fi
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
log() { echo "# $*" >&2; }
PY=python3
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
$PY -c 'import matplotlib' 2>/dev/null || { log "installing matplotlib"; pip install -q matplotlib; }

if [ -n "${SKIFF_BIN:-}" ]; then skiff=$(realpath "$SKIFF_BIN")
else
  log "building skiff (release) and the wasm guests"
  cargo build --release -q -p skiff
  skiff=$repo/target/x86_64-unknown-linux-musl/release/skiff
fi
bash scripts/build-wasm.sh
# The micro benchmark and the load generator: their own workspace, the root's musl target.
log "building bench/sessions/micro"
(cd bench/sessions/micro && cargo build --release -q --target-dir "$repo/target/sessions-micro")
bin=$repo/target/sessions-micro/x86_64-unknown-linux-musl/release
wasm=$repo/bench/sessions/kvapp/kvapp.wasm

out=$repo/bench/out/sessions
rm -rf "$out"; mkdir -p "$out"
data=$(mktemp -d /tmp/skiff-bench-sessions.XXXXXX)
sock=$data/skiff.sock
free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port); rport=$(free_port)
daemon=""; redis=""
cleanup() {
  [ -z "$daemon" ] || { kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; }
  [ -z "$redis" ] || { kill -TERM "$redis" 2>/dev/null || true; wait "$redis" 2>/dev/null || true; }
  "$skiff" --data-dir "$data" gc --pools >/dev/null 2>&1 || true
  umount "$data/run" "$data/pool/dev" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT

# Redis as a cache, the way the peers use it: no RDB snapshots, no AOF.
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --logfile "$out/redis.log" &
redis=$!
"$skiff" --data-dir "$data" --socket "$sock" serve --listen 127.0.0.1:$port 2>>"$out/daemon.log" &
daemon=$!
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { echo "skiff serve did not come up; see $out/daemon.log" >&2; exit 1; }
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

# deploy NAME MANIFEST-TAIL: kvapp under another name and manifest, from a temp dir.
# pids: 1024 because a session's primary serves each secondary's in-flight requests on a
# thread per RPC connection: with the default limit (64) a primary past ~5 secondaries
# cannot start them and those requests fail "state unavailable" (seen at 80 clients).
deploy() {
  local dir=$data/fn-$1
  mkdir -p "$dir"; cp "$wasm" "$dir/"
  printf 'name: %s\nruntime: wasm\nhandler: kvapp.wasm\nlimits:\n  timeout: 10s\n  pids: 1024\n%s\n' "$1" "$2" >"$dir/skiff.yaml"
  "$skiff" --socket "$sock" deploy "$dir" >/dev/null
}
session_yaml() {   # $1: max_concurrency
  printf 'session:\n  key: header:x-session\n  max_concurrency: %s\n  keep_alive: 120s\n  durability: checkpoint' "$1"
}
deploy kv-session "$(session_yaml 10)"
deploy kv-redis "$(printf 'network: host\nenv:\n  SKIFF_STATE_REDIS: 127.0.0.1:%s\nscale:\n  concurrency: 10' "$rport")"
deploy kv-sec "$(session_yaml 1)"
deploy kv-restore "$(session_yaml 10)"

inv() {   # FUNCTION BODY: one request on the benchmark's session
  curl -sf --unix-socket "$sock" -H 'x-session: bench' --data-binary "$2" "http://skiff/fn/$1"
}
# One key per app, seeded in both backends (RO reads a present 1 KiB value).
for fn in kv-session kv-redis; do
  for k in kro krmw klin; do [ "$(inv $fn "seed $k")" = 0 ] || { echo "seeding $fn failed" >&2; exit 1; }; done
done

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "{\"load_before\":\"$(load)\",\"nproc\":$(nproc),\"kernel\":\"$(uname -r)\",\"redis\":\"$(redis-server --version | grep -o 'v=[^ ]*')\",\"secs\":$SECS}" >"$out/machine.json"

log "closed loop: $CLIENTS clients, ${SECS}s per point"
for c in $CLIENTS; do
  for app in ro:kro rmw:krmw linear:klin; do
    # The two backends alternate at each point, so drift in other load hits both alike.
    for fn in kv-session kv-redis; do
      r=$("$bin/closed_loop" "$sock" "/fn/$fn" "${app%%:*} ${app#*:}" "$c" "$SECS" "x-session: bench")
      echo "{\"fn\":\"$fn\",\"app\":\"${app%%:*}\",${r#\{}" >>"$out/loop.jsonl"
    done
  done
  log "clients=$c done (load $(load))"
done
# How many workers the benchmark's session ran at its peak and what each started in.
curl -sf --unix-socket "$sock" http://skiff/v1/instances >"$out/instances.json"
curl -sf --unix-socket "$sock" http://skiff/v1/sessions >"$out/sessions.json"

log "micro: a request in a fresh instance, state reads ($RUNS runs)"
"$bin/micro" "$wasm" "$rport" "$RUNS" >"$out/micro.jsonl"

log "cold starts ($REPS each)"
$PY bench/sessions/cold.py "$sock" "$REPS" >"$out/cold.jsonl"
echo "{\"load_after\":\"$(load)\"}" >>"$out/machine.json"

$PY bench/sessions/report.py "$out"
$PY bench/sessions/plot.py "$out/loop.jsonl" "$repo/bench/sessions.png"

#!/usr/bin/env bash
# bench/invoke: skiff serve end to end, side by side with its peers, in one run.
#   cold:  HTTP request in to response out with no idle instance, per runtime: python3 and
#          node through their templates (zygotes) and plainly, binary; peers: the bare
#          interpreter processes, and runc starting python in a container on the same root;
#          and the page faults of a template start (start_faults.py)
#   heavy: the same for a function that imports numpy and pandas (its own template vs plain
#          vs python importing them bare vs runc), and the memory of its idle template beside
#          a plain instance's
#   warm:  a trivial python function under oha at 1..256 connections, over TCP and the
#          Unix socket; peer: the same handler behind a bare asyncio HTTP server
#   study: the Docker concurrency study on our API: 200 sequential requests, then 1..1000
#          concurrent clients over each socket: mean latency, its coefficient of
#          variation, errors
# Usage: bench/invoke/run.sh [--quick]      (as root; ~6 min, --quick ~2)
#   env SKIFF_BIN=PATH: use this skiff binary instead of building one
# Writes bench/out/invoke/{*.jsonl,invoke.md,*.png} and prints the tables. Leaves no
# daemon, sandbox, container or cgroup behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
quick=0
case "${1:-}" in --quick) quick=1 ;; "") ;; *) echo "usage: $0 [--quick]" >&2; exit 2 ;; esac
if [ $quick = 1 ]; then N_HEAVY=5; N_COLD=30; SECS=2; CONC="1 16 256"; STUDY="1 10 100 1000"
else N_HEAVY=20; N_COLD=200; SECS=5; CONC="1 4 16 64 256"; STUDY="1 10 50 100 200 500 1000"; fi
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
log() { echo "# $*" >&2; }
ulimit -n "$(ulimit -Hn)"   # 1000 clients: a descriptor each, on both ends

need=()
command -v runc >/dev/null || need+=(runc)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
command -v make >/dev/null || need+=(make)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null; apt-get install -y -q "${need[@]}" >/dev/null; }
fi
PY=/usr/bin/python3.11
RUNC=$(command -v runc)
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
[ -x "$OHA" ] || { log "installing oha (cargo install)"; cargo install oha --locked -q; }
if [ -n "${SKIFF_BIN:-}" ]; then skiff=$(realpath "$SKIFF_BIN")
else
  log "building skiff (release)"
  cargo build --release -q -p skiff
  skiff=$repo/target/x86_64-unknown-linux-musl/release/skiff
fi
make -s -C examples/echo-binary

out=$repo/bench/out/invoke
rm -rf "$out"; mkdir -p "$out"
data=$(mktemp -d /tmp/skiff-bench-invoke.XXXXXX)
sock=$data/skiff.sock
port=18480; bare_port=18481
daemon=""; bare=""
stop_daemon() {
  [ -n "$daemon" ] || return 0
  kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; daemon=""
}
cleanup() {
  stop_daemon
  [ -z "$bare" ] || { kill "$bare" 2>/dev/null || true; wait "$bare" 2>/dev/null || true; }
  "$RUNC" delete -f skiff-bench-cold >/dev/null 2>&1 || true
  "$RUNC" delete -f skiff-bench-heavy >/dev/null 2>&1 || true
  "$skiff" --data-dir "$data" gc --pools >/dev/null 2>&1 || true
  umount "$data/run" "$data/pool/dev" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT
start_daemon() {   # $1: template|plain
  "$skiff" --data-dir "$data" --socket "$sock" serve --listen 127.0.0.1:$port --cold-start "$1" \
    2>>"$out/daemon.log" &
  daemon=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return; sleep 0.05; done
  echo "skiff serve did not come up; see $out/daemon.log" >&2; exit 1
}
deploy() { "$skiff" --socket "$sock" deploy "$1" >/dev/null; }

log "cold starts ($N_COLD each)"
start_daemon template
for f in bench/invoke/functions/noop-python bench/invoke/functions/noop-node examples/echo-binary \
         bench/invoke/functions/numpy-pandas; do
  deploy "$f"
done
$PY bench/invoke/cold.py $port noop-python "python3 template" "$N_COLD" >>"$out/cold.jsonl"
$PY bench/invoke/cold.py $port noop-node "node template" "$N_COLD" >>"$out/cold.jsonl"
$PY bench/invoke/start_faults.py $port "$daemon" noop-python python3 "python3 template" 8 >>"$out/faults.jsonl"
$PY bench/invoke/start_faults.py $port "$daemon" noop-node node "node template" 8 >>"$out/faults.jsonl"
$PY bench/invoke/cold.py $port numpy-pandas "numpy+pandas: its own template" "$N_HEAVY" >>"$out/heavy.jsonl"
$PY bench/invoke/memory.py $port numpy-pandas "its template, idle" template >>"$out/memory.jsonl"
$PY bench/invoke/memory.py $port numpy-pandas "an instance forked from it" instance >>"$out/memory.jsonl"
stop_daemon; start_daemon plain
$PY bench/invoke/cold.py $port numpy-pandas "numpy+pandas: plain" "$N_HEAVY" >>"$out/heavy.jsonl"
$PY bench/invoke/memory.py $port numpy-pandas "a plain instance" instance >>"$out/memory.jsonl"
$PY bench/invoke/cold.py $port noop-python "python3 plain" "$N_COLD" >>"$out/cold.jsonl"
$PY bench/invoke/cold.py $port noop-node "node plain" "$N_COLD" >>"$out/cold.jsonl"
$PY bench/invoke/cold.py $port echo-binary "binary" "$N_COLD" >>"$out/cold.jsonl"
# The peers run the interpreter of noop-python's own environment.
env_of() { echo "$data/envs/$(curl -sf "http://127.0.0.1:$port/v1/functions/$1" | $PY -c 'import json,sys; print(json.load(sys.stdin)["env"])')/root"; }
env_root=$(env_of noop-python)
bundle=$data/bundle
mkdir -p "$bundle"
(cd "$bundle" && "$RUNC" spec)
$PY - "$bundle/config.json" "$env_root" <<'PY'
import json, sys
path, root = sys.argv[1], sys.argv[2]
c = json.load(open(path))
c["root"] = {"path": root, "readonly": True}
c["process"]["terminal"] = False
c["process"]["cwd"] = "/code"
c["process"]["args"] = ["/usr/bin/python3.11", "-I", "-S", "-c",
                        "import io, os, select, struct, sys, time, _json"]
# runc puts the container below our own cgroup in every hierarchy.
c["linux"]["cgroupsPath"] = "skiff-bench-runc/cold"
json.dump(c, open(path, "w"), indent=1)
PY
$PY bench/invoke/peer_cold.py "$N_COLD" "$env_root" "$bundle" "$RUNC" "$(env_of noop-node)" >>"$out/cold.jsonl"
# The same container importing numpy and pandas on numpy-pandas's root.
heavy_root=$(env_of numpy-pandas)
heavy_bundle=$data/heavy-bundle
mkdir -p "$heavy_bundle"
$PY - "$bundle/config.json" "$heavy_bundle/config.json" "$heavy_root" <<'PY'
import json, sys
src, dst, root = sys.argv[1:4]
c = json.load(open(src))
c["root"]["path"] = root
c["process"]["args"] = ["/usr/bin/python3.11", "-I", "-S", "-c",
                        "import sys; sys.path.append('/usr/lib/python3/dist-packages'); import numpy, pandas"]
c["linux"]["cgroupsPath"] = "skiff-bench-runc/heavy"
json.dump(c, open(dst, "w"), indent=1)
PY
$PY bench/invoke/peer_heavy.py "$N_HEAVY" "$heavy_root" "$heavy_bundle" "$RUNC" >>"$out/heavy.jsonl"
stop_daemon

log "warm invocations (oha, ${SECS}s per point)"
start_daemon template
curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/fn/noop-python"
$PY bench/invoke/bare_server.py $bare_port & bare=$!
sleep 0.5
oha_json() {   # one line of JSON per run
  "$OHA" --no-tui --output-format json "$@" | $PY -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))'
}
for c in $CONC; do
  for t in tcp unix bare; do
    case $t in
      tcp) url=http://127.0.0.1:$port/fn/noop-python; extra=() ;;
      unix) url=http://skiff/fn/noop-python; extra=(--unix-socket "$sock") ;;
      bare) url=http://127.0.0.1:$bare_port/; extra=() ;;
    esac
    r=$(oha_json -z ${SECS}s -w -c "$c" -m POST "${extra[@]}" "$url")
    echo "{\"transport\":\"$t\",\"c\":$c,\"oha\":$r}" >>"$out/warm.jsonl"
    log "warm $t c=$c done"
  done
done

log "the Docker study on our API"
for t in unix tcp; do
  case $t in
    tcp) url=http://127.0.0.1:$port/fn/noop-python; extra=() ;;
    unix) url=http://skiff/fn/noop-python; extra=(--unix-socket "$sock") ;;
  esac
  for c in seq $STUDY; do
    if [ "$c" = seq ]; then n=200; conns=1; else conns=$c; n=$((c * 4 > 400 ? c * 4 : 400)); fi
    db=$out/study-$t-$c.sqlite
    r=$(oha_json -n "$n" -c "$conns" -m POST "${extra[@]}" --db-url "$db" "$url")
    echo "{\"transport\":\"$t\",\"clients\":\"$c\",\"n\":$n,\"db\":\"$db\",\"oha\":$r}" >>"$out/study.jsonl"
    log "study $t clients=$c done"
  done
done
stop_daemon

$PY bench/invoke/report.py "$out"

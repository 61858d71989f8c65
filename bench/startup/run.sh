#!/usr/bin/env bash
# bench/startup: skiff and runc side by side, in one run, on the same rootfs and the same
# program (stamp.c prints CLOCK_MONOTONIC as the first thing its main does; FRE §6.1).
#   sequential: ms from spawn to the program's main and to the launcher's exit
#   concurrent: N = 1..256 spawned at once; ms until all run, slowest start, CPU-seconds
#   memory:     idle sandboxes alive at once; machine memory per sandbox, and beyond a
#               bare process of the same program
# Usage: bench/startup/run.sh [--quick]    (as root; ~10 min on an idle machine, --quick ~2)
#   env SKIFF_BIN=PATH: use this skiff binary instead of building one
#   env QUIET=0.10 QUIET_WAIT=300: wait (at most QUIET_WAIT s) before each batch until
#       other load on the machine is below QUIET CPUs
# Writes bench/out/{startup.json,startup.md,concurrent.png} and bench/startup-concurrent.png,
# prints the tables. Cleans up every container, sandbox, process and cgroup it made.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac
if [ $quick = 1 ]; then SEQ=50; CONC="1 8 32 64"; REPS=1; IDLE=50; MEM_REPS=1
else SEQ=500; CONC="1 8 32 64 128 256"; REPS=5; IDLE=500; MEM_REPS=3; fi
CHUNKS=5                                 # sequential starts alternate skiff/runc in chunks
MAX_N=${CONC##* }
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
log() { echo "# $*" >&2; }

# ---- what it needs -------------------------------------------------------------------
need=()
command -v runc >/dev/null || need+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
[ -x /usr/bin/python3 ] || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the package lists are missing or too old to install from.
  apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
  }
fi
PY=/usr/bin/python3
RUNC=$(command -v runc)
BUSYBOX=$(dpkg -L busybox-static | grep -m1 '/bin/busybox$')
if grep -qs x86_64-unknown-linux-musl .cargo/config.toml && command -v rustup >/dev/null &&
   ! rustup target list --installed | grep -q x86_64-unknown-linux-musl; then
  rustup target add x86_64-unknown-linux-musl
fi
if [ -n "${SKIFF_BIN:-}" ]; then   # an already built binary instead of building one
  skiff_bin=$(realpath "$SKIFF_BIN")
else
  log "building skiff (release)"
  skiff_bin=$(cargo build --release -p skiff --message-format=json-render-diagnostics |
    $PY -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "skiff" and m.get("executable"):
        print(m["executable"])')
fi
[ -x "$skiff_bin" ] || { echo "no skiff binary from cargo build" >&2; exit 1; }
mkdir -p bench/out
[ "$skiff_bin" -ef bench/out/skiff ] || cp "$skiff_bin" bench/out/skiff   # others may rebuild target/ meanwhile
skiff_bin=$repo/bench/out/skiff

# ---- rootfs, driver, bundles -------------------------------------------------------------
out=$repo/bench/out
mkdir -p "$out"
rootfs=$out/rootfs
bundles=$out/bundles
data=$out/data
skiff=("$skiff_bin" --data-dir "$data")
rm -rf "$rootfs" "$bundles"
mkdir -p "$rootfs"/{bin,proc,dev,tmp,sys,etc} "$bundles"
gcc -O2 -Wall -o "$out/driver" bench/startup/driver.c
gcc -O2 -static -Wall -o "$rootfs/stamp" bench/startup/stamp.c
cp "$BUSYBOX" "$rootfs/bin/busybox"
for a in sh ls cat echo sleep ps; do ln -s busybox "$rootfs/bin/$a"; done
driver=$out/driver

# runc takes its cgroup from config.json, so one bundle per container that may exist at
# once: b<i> runs /stamp, m<i> runs /stamp sleep. The same rootfs (read-only), namespaces
# (pid ipc uts mount cgroup; no network namespace: skiff's default shares the host's)
# and limits (256M, 1 CPU, 64 pids) as `skiff run`'s defaults. cgroupsPath is relative:
# runc puts it below its own cgroup in every hierarchy (here memory:/process_api/<hash>,
# / elsewhere), i.e. <own cgroup>/skiff-bench-runc/<bundle>, never outside our cgroup.
n_b=$(( SEQ / CHUNKS > MAX_N ? SEQ / CHUNKS : MAX_N ))
(cd "$bundles" && "$RUNC" spec && mv config.json spec.json)
"$PY" - "$bundles" "$rootfs" "$n_b" "$IDLE" <<'PY'
import json, os, sys
dir, rootfs, n_b, n_m = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = json.load(open(os.path.join(dir, "spec.json")))
c["process"]["terminal"] = False
c["root"] = {"path": rootfs, "readonly": True}
c["linux"]["namespaces"] = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")]
c["linux"]["resources"] = {
    "devices": c["linux"].get("resources", {}).get("devices", [{"allow": False, "access": "rwm"}]),
    "memory": {"limit": 256 << 20},
    "cpu": {"quota": 100000, "period": 100000},
    "pids": {"limit": 64},
}
for prefix, args, n in (("b", ["/stamp"], n_b), ("m", ["/stamp", "sleep"], n_m)):
    for i in range(n):
        c["process"]["args"] = args
        c["linux"]["cgroupsPath"] = f"skiff-bench-runc/{prefix}{i}"
        os.makedirs(os.path.join(dir, f"{prefix}{i}"))
        json.dump(c, open(os.path.join(dir, f"{prefix}{i}", "config.json"), "w"), indent=1)
PY

# ---- cleanup: only what this script started -----------------------------------------------
bare_pids=$out/bare.pids
skiff_ids=$out/skiff.ids
touch "$bare_pids" "$skiff_ids"   # kept from an interrupted run: cleanup below uses them
kill_bare() {
  local p left
  for p in $(cat "$bare_pids"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = stamp ] && kill -KILL "$p" 2>/dev/null || true
  done
  for _ in $(seq 100); do   # not our children (the driver exited): wait until they are gone
    left=0
    for p in $(cat "$bare_pids"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = stamp ] && left=1 && break; done
    [ $left = 0 ] && break; sleep 0.05
  done
  : >"$bare_pids"
}
kill_skiff() {
  local id
  for id in $(cat "$skiff_ids"); do "${skiff[@]}" kill "$id" >/dev/null 2>&1 || true; done
  : >"$skiff_ids"
}
kill_runc() {
  local id
  for id in $("$RUNC" list -q 2>/dev/null | grep '^skbench-' || true); do
    "$RUNC" delete -f "$id" >/dev/null 2>&1 || true
  done
}
runc_cgroup_dirs() {   # skiff-bench-runc below our own cgroup, in every hierarchy
  local path d
  while IFS=: read -r _ _ path; do
    for d in /sys/fs/cgroup/*"${path%/}"/skiff-bench-runc; do [ -d "$d" ] && echo "$d"; done
  done </proc/self/cgroup | sort -u
}
cleanup() {
  local -; set +e   # options local to the function: the script keeps its set -e
  kill_bare; kill_skiff; kill_runc
  "${skiff[@]}" gc --pools >/dev/null 2>&1
  local d
  for d in $(runc_cgroup_dirs); do
    find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
    rmdir "$d" || echo "warning: could not remove $d" >&2
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup   # what a previous, interrupted run may have left

# ---- checks before measuring ----------------------------------------------------------------
"${skiff[@]}" pool --size $(( IDLE + 100 )) >/dev/null
got=$("${skiff[@]}" run --rootfs "$rootfs" -- /stamp) && [ "$got" -gt 0 ] 2>/dev/null ||
  { echo "skiff run --rootfs $rootfs -- /stamp printed '$got', not a stamp" >&2; exit 1; }
got=$("$RUNC" run --bundle "$bundles/b0" skbench-check </dev/null) && [ "$got" -gt 0 ] 2>/dev/null ||
  { echo "runc run printed '$got', not a stamp" >&2; exit 1; }
# This machine's 2 cores may be shared (other builds and tests): before each measured
# batch, wait until the rest of the machine is idle (< QUIET CPUs busy over 0.5 s; at most
# QUIET_WAIT s, then measure anyway). Every sample goes into bg.jsonl and the report.
QUIET=${QUIET:-0.10}; QUIET_WAIT=${QUIET_WAIT:-300}
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
: >"$out/bg.jsonl"
quiet() {   # quiet LABEL
  local start=$SECONDS b0 b1 cpus warned=0
  while :; do
    b0=$(busy); sleep 0.5; b1=$(busy)
    cpus=$(awk -v d=$(( b1 - b0 )) -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", 2*d/hz}')
    if awk -v c="$cpus" -v q="$QUIET" 'BEGIN{exit !(c < q)}'; then break; fi
    if [ $(( SECONDS - start )) -ge "$QUIET_WAIT" ]; then log "still $cpus CPUs busy: measuring $1 anyway"; break; fi
    [ $warned = 0 ] && log "waiting for other load to end before $1 ($cpus CPUs busy)" && warned=1
  done
  echo "{\"label\":\"$1\",\"cpus\":$cpus,\"waited_s\":$(( SECONDS - start ))}" >>"$out/bg.jsonl"
}
# measure LABEL DRIVER-ARGS...: the driver's JSON line, measured again (3 tries at most)
# while the driver reports the batch "disturbed" by other load.
measure() {
  local label=$1 r try; shift
  for try in 1 2 3; do
    quiet "$label"
    r=$("$driver" "$@" </dev/null)
    case $r in *'"disturbed":1'*) ;; *) break ;; esac
    log "$label: disturbed by other load$([ $try -lt 3 ] && echo ', again')"
    echo "{\"label\":\"$label\",\"disturbed_try\":$try}" >>"$out/bg.jsonl"
  done
  echo "$r"
}

# ---- 1. sequential ------------------------------------------------------------------------
skiff_cmd=("$skiff_bin" --data-dir "$data" run --rootfs "$rootfs" -- /stamp)
per=$(( SEQ / CHUNKS ))
log "sequential: $SEQ starts each, alternating in $CHUNKS chunks of $per"
"$driver" seq 20 -- "${skiff_cmd[@]}" >/dev/null                       # warm-up
"$driver" seq 20 -- "$RUNC" run --bundle "$bundles/b{}" skbench-w{} </dev/null >/dev/null
: >"$out/seq.jsonl"
for c in $(seq $CHUNKS); do
  echo "{\"who\":\"skiff\",\"r\":$(measure "sequential skiff $c" seq $per -- "${skiff_cmd[@]}")}" >>"$out/seq.jsonl"
  echo "{\"who\":\"runc\",\"r\":$(measure "sequential runc $c" seq $per -- "$RUNC" run --bundle "$bundles/b{}" skbench-s$c-{})}" >>"$out/seq.jsonl"
done

# ---- 2. concurrent ------------------------------------------------------------------------
log "concurrent: N = $CONC, $REPS repetitions"
: >"$out/conc.jsonl"
for rep in $(seq $REPS); do
  for n in $CONC; do
    echo "{\"who\":\"skiff\",\"rep\":$rep,\"r\":$(measure "concurrent skiff $rep N=$n" conc "$n" -- "${skiff_cmd[@]}")}" >>"$out/conc.jsonl"
    echo "{\"who\":\"runc\",\"rep\":$rep,\"r\":$(measure "concurrent runc $rep N=$n" conc "$n" -- "$RUNC" run --bundle "$bundles/b{}" skbench-c$rep-{})}" >>"$out/conc.jsonl"
  done
done

# ---- 3. memory ----------------------------------------------------------------------------
# Readings, caches dropped first: the machine's MemTotal - MemAvailable (what it costs the
# machine); the usage of this script's own memory cgroup, hierarchical, so with skiff's pool
# and runc's cgroups below it; and the usage of every other top-level memory cgroup (other
# sessions that share this machine: their builds move the machine-wide number by 100s of
# MB, and the report subtracts their change from it).
memcg_root=/sys/fs/cgroup/memory
own_memcg=$memcg_root$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
[ -r "$own_memcg/memory.usage_in_bytes" ] && [ "$own_memcg" != "$memcg_root/" ] || own_memcg=
used() {
  sync; echo 3 >/proc/sys/vm/drop_caches; sleep 0.5
  local cg=0 all=0 f
  if [ -n "$own_memcg" ]; then
    cg=$(( $(cat "$own_memcg/memory.usage_in_bytes") / 1024 ))
    for f in "$memcg_root"/*/memory.usage_in_bytes; do all=$(( all + $(cat "$f") / 1024 )); done
  fi
  awk -v cg=$cg -v others=$(( all - cg )) '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2}
    END{printf "{\"machine_kb\":%d,\"cgroup_kb\":%d,\"others_kb\":%d}", t-a, cg, others}' /proc/meminfo
}
# A reading once the machine's number has stopped moving: three in a row, over 2 s or
# more, within 2 MB (at most 60 s). It moves for a while after a phase: the kernel frees
# some things late (dying cgroups), and this VM's balloon driver takes free memory away in
# 2 MB blocks while it reports them to the host (free page reporting), up to 64 MB at once.
settled() {
  local cur m a=-1 b=-1 start=$SECONDS
  while :; do
    cur=$(used); sleep 0.5
    m=$(sed 's/.*"machine_kb":\([0-9-]*\).*/\1/' <<<"$cur")
    if [ $a -ge 0 ] && awk -v a=$a -v b=$b -v c=$m 'function abs(x) { return x < 0 ? -x : x }
        BEGIN { exit !(abs(a - b) < 2048 && abs(b - c) < 2048 && abs(a - c) < 2048) }'; then break; fi
    if [ $(( SECONDS - start )) -ge 60 ]; then log "memory reading still moving after 60 s"; break; fi
    a=$b; b=$m
  done
  echo "$cur"
}
stamps() { pgrep -c -x stamp || true; }   # zombies too: gone means reaped
wait_stamps() {   # wait_stamps up|gone: until IDLE more than base run, or none of ours is left
  local want=$(( base + IDLE )) n
  for _ in $(seq 400); do
    n=$(stamps)
    if [ "$1" = up ]; then [ "$n" -ge $want ] && return 0; else [ "$n" -le "$base" ] && return 0; fi
    sleep 0.05
  done
  echo "$1: $n processes named stamp, expected $([ "$1" = up ] && echo "$want" || echo "$base")" >&2; return 1
}
record() { echo "{\"who\":\"$1\",\"rep\":$rep,\"before\":$before,\"up\":$up,\"after\":$after}" >>"$out/mem.jsonl"; }
log "memory: $IDLE idle sandboxes at once, $MEM_REPS repetitions"
: >"$out/mem.jsonl"
base=$(stamps)   # others' (normally 0)
for rep in $(seq $MEM_REPS); do
  quiet "memory rep $rep bare"
  before=$(settled)
  "$driver" idle "$IDLE" -- "$rootfs/stamp" sleep >"$bare_pids"
  wait_stamps up; sleep 1; up=$(settled)
  kill_bare; wait_stamps gone; after=$(settled)
  record bare

  quiet "memory rep $rep skiff"
  before=$(settled)
  for i in $(seq "$IDLE"); do
    "${skiff[@]}" run -d --rootfs "$rootfs" -- /stamp sleep </dev/null >>"$skiff_ids"
  done
  wait_stamps up; sleep 1; up=$(settled)
  kill_skiff; wait_stamps gone; after=$(settled)
  record skiff

  quiet "memory rep $rep runc"
  before=$(settled)
  for i in $(seq 0 $(( IDLE - 1 ))); do
    "$RUNC" run -d --bundle "$bundles/m$i" "skbench-m$i" </dev/null >/dev/null
  done
  wait_stamps up; sleep 1; up=$(settled)
  kill_runc; wait_stamps gone; after=$(settled)
  record runc
done

# What skiff's pool costs: made once, before any start, reused by every sandbox (runc
# makes and removes its cgroups in every start instead).
"${skiff[@]}" gc --pools >/dev/null
before=$(settled)
"${skiff[@]}" pool --size $(( IDLE + 100 )) >/dev/null
up=$(settled)
echo "{\"idle\":$IDLE,\"pool_slots\":$(( IDLE + 100 )),\"pool_before\":$before,\"pool_after\":$up,\"runc\":\"$("$RUNC" --version | head -1)\",\"skiff\":\"$("$skiff_bin" --version)\"}" >"$out/meta.json"

"$PY" bench/startup/report.py "$out" "$quick"
cp "$out/concurrent.png" bench/startup-concurrent.png

#!/usr/bin/env bash
# bench/startup: skiff and runc side by side, in one run, on the same rootfs and the
# same program (stamp.c prints CLOCK_MONOTONIC when its main starts, as FRE §6.1).
#   sequential starts: ms to the program's main and to the launcher's exit
#   concurrent starts: 1..256 released at once; ms until all run, CPU-seconds used
#   memory: idle sandboxes alive at once, machine memory used per sandbox beyond a
#           bare process of the same program
# Usage: bench/startup/run.sh [--quick]   (as root; writes bench/out/ and prints a table)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
quick=0; [ "${1:-}" = --quick ] && quick=1
if [ $quick = 1 ]; then SEQ=50; CONC="1 8 32 64"; REPS=1; IDLE=50; else SEQ=500; CONC="1 8 32 64 128 256"; REPS=3; IDLE=500; fi

need=()
command -v runc >/dev/null || need+=(runc)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null; fi
bash scripts/deps.sh
cargo build --release -q -p skiff
skiff_bin=$repo/target/x86_64-unknown-linux-musl/release/skiff

out=$repo/bench/out
rm -rf "$out/rootfs" "$out/bundles"; mkdir -p "$out"/rootfs/{bin,proc,dev,tmp,sys} "$out/bundles"
gcc -O2 -Wall -o "$out/driver" bench/startup/driver.c
gcc -O2 -static -o "$out/rootfs/stamp" bench/startup/stamp.c
cp /bin/busybox "$out/rootfs/bin/busybox"; ln -sf busybox "$out/rootfs/bin/sh"
rootfs=$out/rootfs
data=$out/data
skiff="$skiff_bin --data $data"

# One runc bundle per container: the same config but its own cgroup, at a path relative
# to runc's own cgroup (so below ours in every hierarchy, never outside it). The same
# namespaces as skiff (no network namespace: skiff's default shares the host's) and the
# same limits.
max_n=$(( IDLE > SEQ ? IDLE : SEQ )); [ "$max_n" -lt 256 ] && max_n=256
(cd "$out/bundles" && runc spec && mv config.json template.json)
/usr/bin/python3 - "$out/bundles" "$rootfs" "$max_n" <<'PY'
import json, os, sys
dir, rootfs, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open(os.path.join(dir, "template.json")))
c["process"]["terminal"] = False
c["process"]["args"] = ["/stamp"]
c["root"] = {"path": rootfs, "readonly": True}
c["linux"]["namespaces"] = [{"type": t} for t in ["pid", "ipc", "uts", "mount", "cgroup"]]
c["linux"]["resources"] = {"memory": {"limit": 256 << 20}, "cpu": {"quota": 100000, "period": 100000}, "pids": {"limit": 64}}
for i in range(n):
    b = os.path.join(dir, f"b{i}")
    os.makedirs(b, exist_ok=True)
    c["linux"]["cgroupsPath"] = f"skiff-bench-runc/c{i}"
    json.dump(c, open(os.path.join(b, "config.json"), "w"))
PY

runc_ids=()
cleanup() {
  for id in $(runc list -q 2>/dev/null | grep '^skb' || true); do runc delete -f "$id" >/dev/null 2>&1 || true; done
  $skiff gc --pools >/dev/null 2>&1 || true
  for d in /sys/fs/cgroup/*/skiff-bench-runc /sys/fs/cgroup/*/*/*/skiff-bench-runc; do
    [ -d "$d" ] && { rmdir "$d"/c* 2>/dev/null || true; rmdir "$d" 2>/dev/null || true; }
  done
}
trap cleanup EXIT
$skiff pool --size $(( IDLE + 100 )) >/dev/null

echo "# sequential: $SEQ starts each" >&2
$out/driver seq 20 -- $skiff_bin --data "$data" run --rootfs "$rootfs" -- /stamp >/dev/null
$out/driver seq 20 -- /usr/sbin/runc run --bundle "$out/bundles/b{}" skbw{} >/dev/null
$out/driver seq $SEQ -- $skiff_bin --data "$data" run --rootfs "$rootfs" -- /stamp >"$out/seq-skiff.json"
$out/driver seq $SEQ -- /usr/sbin/runc run --bundle "$out/bundles/b{}" skbs{} >"$out/seq-runc.json"

echo "# concurrent: N = $CONC, $REPS repetitions" >&2
: >"$out/conc.jsonl"
for n in $CONC; do
  for rep in $(seq $REPS); do
    echo "{\"who\":\"skiff\",\"rep\":$rep,\"r\":$($out/driver conc $n -- $skiff_bin --data "$data" run --rootfs "$rootfs" -- /stamp)}" >>"$out/conc.jsonl"
    echo "{\"who\":\"runc\",\"rep\":$rep,\"r\":$($out/driver conc $n -- /usr/sbin/runc run --bundle "$out/bundles/b{}" skbc$rep-{})}" >>"$out/conc.jsonl"
  done
done

echo "# memory: $IDLE idle sandboxes each" >&2
used_kb() { sync; echo 3 >/proc/sys/vm/drop_caches; sleep 0.5; awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print t-a}' /proc/meminfo; }
wait_running() { for _ in $(seq 100); do [ "$(pgrep -c -x stamp || true)" -ge "$1" ] && return 0; sleep 0.1; done; return 1; }
# The rise when they start and the fall when they end, averaged: drift in the machine's
# own memory use cancels out.
delta() { echo $(( ($2 - $1 + $2 - $3) / 2 )); }
before=$(used_kb); pids=()
for i in $(seq $IDLE); do "$rootfs/stamp" sleep >/dev/null & pids+=($!); done
wait_running $IDLE; sleep 1; up=$(used_kb)
kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
bare=$(delta "$before" "$up" "$(used_kb)")

before=$(used_kb); ids=()
for i in $(seq $IDLE); do ids+=($($skiff run -d --rootfs "$rootfs" -- /stamp sleep)); done
wait_running $IDLE; sleep 1; up=$(used_kb)
for id in "${ids[@]}"; do $skiff kill "$id"; done
skiff_mem=$(delta "$before" "$up" "$(used_kb)")

for i in $(seq 0 $(( IDLE - 1 ))); do
  sed -i 's|"args": \["/stamp"\]|"args": ["/stamp", "sleep"]|' "$out/bundles/b$i/config.json"
done
before=$(used_kb)
for i in $(seq 0 $(( IDLE - 1 ))); do runc run -d --bundle "$out/bundles/b$i" skbm$i </dev/null >/dev/null 2>&1; done
wait_running $IDLE; sleep 1; up=$(used_kb)
for i in $(seq 0 $(( IDLE - 1 ))); do runc delete -f skbm$i >/dev/null 2>&1 || true; done
runc_mem=$(delta "$before" "$up" "$(used_kb)")

# What the pool itself costs (made before any start, reused by every sandbox).
$skiff gc --pools >/dev/null
before=$(used_kb); $skiff pool --size $(( IDLE + 100 )) >/dev/null; pool_mem=$(( $(used_kb) - before ))
echo "{\"idle\":$IDLE,\"bare_kb\":$bare,\"skiff_kb\":$skiff_mem,\"runc_kb\":$runc_mem,\"pool_slots\":$(( IDLE + 100 )),\"pool_kb\":$pool_mem}" >"$out/mem.json"

/usr/bin/python3 bench/startup/report.py "$out" "$quick"

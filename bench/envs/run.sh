#!/usr/bin/env bash
# bench/envs: function environments side by side in one run (FRE §6.2, §6.3).
#   size:   skiff's bytes on disk for hello functions (python3, node, binary) against a
#           conventional image of the same runtime (the files of the Debian packages
#           that own the runtime's files, copied whole), and what a second function adds
#   memory: 20 idle instances of five runtimes (python3, node, a native binary, busybox,
#           perl): skiff sandboxes sharing the store's inodes, vs the same trees copied
#           per instance (as unshared images would be), vs bare processes
#   build:  environment build time, cold and with the store warm
# Usage: bench/envs/run.sh [--quick]   (as root; writes bench/out/envs.* and prints a table)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
quick=0; [ "${1:-}" = --quick ] && quick=1
N=20; [ $quick = 1 ] && N=5
bash scripts/deps.sh
cargo build --release -q -p skiff
skiff_bin=$repo/target/x86_64-unknown-linux-musl/release/skiff
out=$repo/bench/out/envs
rm -rf "$out"; mkdir -p "$out"
data=$out/data
skiff="$skiff_bin --data-dir $data"
cleanup() {
  for id in $($skiff ps --json 2>/dev/null | sed -n 's/.*"id": "\(.*\)".*/\1/p'); do $skiff kill "$id" >/dev/null 2>&1 || true; done
  $skiff gc --pools >/dev/null 2>&1 || true
  rm -rf "$out/copies"
}
trap cleanup EXIT

# The functions: the examples, a second python function, and a native one.
fns=$out/functions
mkdir -p "$fns"
cp -r examples/hello-python examples/hello-node "$fns/"
mkdir -p "$fns/second-python" "$fns/stamp-binary"
sed 's/name: hello-python/name: second-python/' examples/hello-python/skiff.yaml >"$fns/second-python/skiff.yaml"
printf 'def handle(event, context):\n    return {"second": True}\n' >"$fns/second-python/main.py"
gcc -O2 -o "$fns/stamp-binary/stamp" bench/startup/stamp.c
printf 'name: stamp-binary\nruntime: binary\nhandler: ./stamp\n' >"$fns/stamp-binary/skiff.yaml"

ms() { date +%s%N; }
store_bytes() { find "$data/store" -type f -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {print s+0}'; }
declare -A build_ms store_after
for f in hello-python second-python hello-node stamp-binary; do
  t0=$(ms); $skiff build "$fns/$f" >/dev/null; t1=$(ms)
  build_ms[$f]=$(( (t1 - t0) / 1000000 )); store_after[$f]=$(store_bytes)
done
# Warm: the same function again after removing its environment (runtime layer kept).
$skiff envs --rm hello-node >/dev/null; t0=$(ms); $skiff build "$fns/hello-node" >/dev/null; t1=$(ms); build_ms[node-warm]=$(( (t1 - t0) / 1000000 ))

# Two more runtimes as images (busybox, perl), imported from docker-save tarballs made
# from the host's files.
image() { # name files...
  local name=$1; shift; local dir=$out/img-$name; mkdir -p "$dir/layer"
  for f in "$@"; do mkdir -p "$dir/layer$(dirname "$f")"; cp -L "$f" "$dir/layer$f"; done
  mkdir -p "$dir/layer/proc" "$dir/layer/dev" "$dir/layer/tmp"
  tar -C "$dir/layer" -cf "$dir/layer.tar" . && echo '[{"Config":"c.json","Layers":["layer.tar"]}]' >"$dir/manifest.json" && echo '{}' >"$dir/c.json"
  tar -C "$dir" -cf "$dir.tar" manifest.json c.json layer.tar
  $skiff import "$dir.tar" --name "$name" >/dev/null
}
image busybox /bin/busybox
perl_files=(/usr/bin/perl $(ldd /usr/bin/perl | grep -o '/[^ ]*' | sort -u))
image perl "${perl_files[@]}"

env_root() { echo "$data/envs/$($skiff envs | awk -v n="$1" '$1 == n {print $2}')/root"; }

# Sizes of the conventional images: every file of the runtime's Debian package and its
# installed dependency closure (what a Debian-based image of that runtime carries), plus
# the bytecode Debian compiles at install time for Python.
conventional() { # main package -> bytes
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$1" 2>/dev/null \
    | grep -v '^ ' | sort -u | while read -r pkg; do dpkg -s "$pkg" >/dev/null 2>&1 && dpkg -L "$pkg"; done | sort -u \
    | while read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && echo "$f"; done >"$out/conv-$1.files"
  [ "$1" = python3.11 ] && find /usr/lib/python3.11 -path '*__pycache__*' -type f >>"$out/conv-$1.files"
  sort -u "$out/conv-$1.files" | xargs -d '\n' stat -c %s | awk '{s+=$1} END {print s+0}'
}
[ -n "$(apt-cache depends python3.11 2>/dev/null)" ] || apt-get update -q >/dev/null
{
  echo "{\"python_first\":${store_after[hello-python]},\"python_second_adds\":$(( ${store_after[second-python]} - ${store_after[hello-python]} )),"
  echo "\"node_first\":$(( ${store_after[hello-node]} - ${store_after[second-python]} )),\"binary_first\":$(( ${store_after[stamp-binary]} - ${store_after[hello-node]} )),"
  echo "\"python_conventional\":$(conventional python3.11),\"node_conventional\":$(conventional nodejs),\"binary_conventional\":$(conventional libc6),"
  echo "\"build_ms\":{\"python_cold\":${build_ms[hello-python]},\"python_warm\":${build_ms[second-python]},\"node_cold\":${build_ms[hello-node]},\"node_warm\":${build_ms[node-warm]},\"binary\":${build_ms[stamp-binary]}}}"
} >"$out/size.json"

# Memory: idle instances. MemTotal - MemFree after dropping caches, so page cache the
# instances pull in counts: shared inodes are read once, copies once each.
used_kb() {
  sync; echo 3 >/proc/sys/vm/drop_caches; sleep 1; echo 3 >/proc/sys/vm/drop_caches; sleep 0.5
  awk '/MemTotal/{t=$2}/MemFree/{f=$2}END{print t-f}' /proc/meminfo
}
# Proportional set size of the instances' processes: shared pages split between the
# processes that map them, so it is exact where the machine-wide rise is noisy (it
# leaves out kernel objects, which bench/startup measures per sandbox).
pss_kb() { for p in "$@"; do awk '/^Pss:/{print $2}' "/proc/$p/smaps_rollup"; done | awk '{s+=$1} END {print s+0}'; }
sandbox_pids() { $skiff ps --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p'; }
# The rise when the instances start and the fall when they end, averaged: memory freed
# lazily by the previous set cancels out.
delta() { echo $(( ($2 - $1 + $2 - $3) / 2 )); }
declare -A env_of=([python3]=hello-python [node]=hello-node [binary]=stamp-binary [busybox]=busybox [perl]=perl)
memjson="{"
for rt in python3 node binary busybox perl; do
  root=$(env_root "${env_of[$rt]}")
  case $rt in
    python3) env_cmd=(/usr/bin/python3 -c "import sys; sys.path.insert(0, '/code'); import main, time; time.sleep(1e6)")
             bare_cmd=(/usr/bin/python3.11 -c "import sys; sys.path.insert(0, '$fns/hello-python'); import main, time; time.sleep(1e6)") ;;
    node) env_cmd=(/usr/bin/node -e "require('/code/index.js'); setInterval(() => {}, 1 << 30)")
          bare_cmd=(/usr/bin/node -e "require('$fns/hello-node/index.js'); setInterval(() => {}, 1 << 30)") ;;
    binary) env_cmd=(/code/stamp sleep); bare_cmd=("$fns/stamp-binary/stamp" sleep) ;;
    busybox) env_cmd=(/bin/busybox sleep 1000000); bare_cmd=(/bin/busybox sleep 1000000) ;;
    perl) env_cmd=(/usr/bin/perl -e 'sleep(1e6)'); bare_cmd=(/usr/bin/perl -e 'sleep(1e6)') ;;
  esac
  # shared
  b=$(used_kb); ids=()
  for i in $(seq $N); do ids+=($($skiff run -d --memory 512M --env "${env_of[$rt]}" -- "${env_cmd[@]}")); done
  sleep 3; up=$(used_kb)
  [ "$($skiff ps | grep -c running)" = "$N" ] || { echo "skiff $rt: not all $N running" >&2; $skiff ps >&2; exit 1; }
  shared_pss=$(pss_kb $(sandbox_pids))
  for id in "${ids[@]}"; do $skiff kill "$id"; done
  shared=$(delta "$b" "$up" "$(used_kb)")
  # copied per instance
  mkdir -p "$out/copies"; for i in $(seq $N); do cp -a "$root" "$out/copies/$i"; done
  b=$(used_kb); ids=()
  for i in $(seq $N); do ids+=($($skiff run -d --memory 512M --rootfs "$out/copies/$i" -- "${env_cmd[@]}")); done
  sleep 3; up=$(used_kb)
  copied_pss=$(pss_kb $(sandbox_pids))
  for id in "${ids[@]}"; do $skiff kill "$id"; done
  copied=$(delta "$b" "$up" "$(used_kb)")
  rm -rf "$out/copies"
  # bare
  b=$(used_kb); pids=()
  for i in $(seq $N); do "${bare_cmd[@]}" >/dev/null 2>&1 & pids+=($!); done
  sleep 3; up=$(used_kb)
  alive=$(for p in "${pids[@]}"; do [ -d /proc/$p ] && echo; done | wc -l)
  [ "$alive" = "$N" ] || { echo "bare $rt: only $alive of $N alive" >&2; exit 1; }
  bare_pss=$(pss_kb "${pids[@]}")
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  bare=$(delta "$b" "$up" "$(used_kb)")
  memjson+="\"$rt\":{\"shared_kb\":$shared,\"copied_kb\":$copied,\"bare_kb\":$bare,\"shared_pss_kb\":$shared_pss,\"copied_pss_kb\":$copied_pss,\"bare_pss_kb\":$bare_pss},"
  echo "# memory $rt: PSS shared $shared_pss KB, copied $copied_pss KB, bare $bare_pss KB; machine rise $shared / $copied / $bare KB, for $N" >&2
done
echo "${memjson%,}, \"n\": $N}" >"$out/memory.json"
/usr/bin/python3 bench/envs/report.py "$out" "$quick"

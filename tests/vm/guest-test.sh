#!/bin/sh
# Runs inside the VM (pure cgroup v2: cpuset cpu io memory pids) as PID 1's child, on
# /bin/skiff with the rootfs /rootfs (busybox). Prints `ok - ...` or `FAIL - ...` per check,
# `# ...` comments, and a final `SKIFF-VM-RESULT: PASS|FAIL` line. Every skiff call has a
# time limit, so a hang fails a check instead of the whole VM run.
D=/tmp/d
S="timeout 60 /bin/skiff --data-dir $D"
R=/rootfs
failed=0
ok() { echo "ok - $*"; }
fail() { echo "FAIL - $*"; failed=1; }
# One line of details: "a | b | c".
oneline() { printf '%s' "$*" | tr '\n' '|' | sed 's/|/ | /g'; }
# The cgroup directory whose cgroup.procs lists PID, under skiff's pools.
cgroup_of() { find /sys/fs/cgroup -path '*/skiff-*' -name cgroup.procs -exec grep -lx "$1" {} + 2>/dev/null | head -n 1 | xargs -r dirname; }
# Whether PID is a live process (not a zombie).
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# Live processes running what the sandboxes here run ("PID COMM" lines).
sandbox_pids() {
  for p in /proc/[0-9]*; do
    c=$(cat "$p/comm" 2>/dev/null) || continue
    case "$c" in sleep|dd|probe) alive "${p#/proc/}" && echo "${p#/proc/} $c" ;; esac
  done
}

echo "# kernel $(uname -r), controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "# $(/bin/skiff --version 2>&1)"

# 1. skiff sees a pure cgroup v2 host.
out=$($S pool 2>&1)
echo "$out" | grep -q "cgroup: v2" && ok "skiff pool reports cgroup v2 ($(oneline "$out"))" \
  || fail "skiff pool does not report cgroup: v2: $(oneline "$out")"

# 2. The cgroup namespace is rooted at the sandbox's slot.
out=$($S run --rootfs $R --memory 32M -- /bin/sh -c 'cat /proc/self/cgroup' 2>&1)
code=$?
[ $code = 0 ] && [ "$out" = "0::/" ] && ok "the cgroup namespace is rooted at the slot (/proc/self/cgroup: $out)" \
  || fail "cgroup namespace: exit $code, output: $(oneline "$out")"

# 3. The limits land in the slot's cgroup files (read from the host side: /sys is not
#    mounted in a sandbox).
id=$($S run -d --memory 48M --pids 20 --cpu 0.5 --rootfs $R -- /bin/sleep 30 2>/tmp/err)
code=$?
if [ $code != 0 ] || [ -z "$id" ]; then
  fail "run -d: exit $code, stdout '$id', stderr: $(oneline "$(cat /tmp/err)")"
else
  ps=$($S ps 2>&1)
  pid=$(echo "$ps" | awk -v id="$id" '$1 == id { print $2 }')
  slot=$(echo "$ps" | awk -v id="$id" '$1 == id { print $4 }')
  json=$($S ps --json 2>&1)
  echo "$json" | tr -d ' \n' | grep -q "\"id\":\"$id\"" && echo "$json" | tr -d ' \n' | grep -q "\"slot\":$slot" \
    && ok "ps --json lists the sandbox with its slot $slot" || fail "ps --json: $(oneline "$json") (ps: $(oneline "$ps"))"
  dir=$(cgroup_of "$pid")
  if [ -z "$pid" ] || [ -z "$dir" ]; then
    fail "sandbox $id (pid '$pid') is in no skiff cgroup; ps: $(oneline "$ps"); /proc/$pid/cgroup: $(cat /proc/$pid/cgroup 2>&1)"
  else
    echo "# sandbox $id: pid $pid, slot $slot, cgroup $dir"
    [ "${dir##*/}" = "$slot" ] && ok "the sandbox runs in its slot's cgroup ($dir)" \
      || fail "pid $pid is in $dir, not in slot $slot"
    v=$(cat "$dir/memory.max"); [ "$v" = 50331648 ] && ok "memory.max = $v" || fail "memory.max = $v, want 50331648"
    v=$(cat "$dir/pids.max"); [ "$v" = 20 ] && ok "pids.max = $v" || fail "pids.max = $v, want 20"
    v=$(cat "$dir/cpu.max"); [ "$v" = "50000 100000" ] && ok "cpu.max = $v" || fail "cpu.max = '$v', want '50000 100000'"
  fi
  # 7a. kill a detached sandbox.
  out=$($S kill "$id" 2>&1)
  code=$?
  if [ $code = 0 ] && ! alive "$pid" && ! $S ps | grep -q "^$id "; then
    ok "skiff kill ends the detached sandbox (pid $pid gone, record gone)"
  else
    fail "kill: exit $code, $(oneline "$out"); pid $pid alive: $(alive "$pid" && echo yes || echo no); ps: $(oneline "$($S ps 2>&1)")"
  fi
  [ -n "$dir" ] && { [ -z "$(cat "$dir/cgroup.procs")" ] && ok "the slot's cgroup is empty after kill" \
    || fail "processes left in $dir: $(oneline "$(cat "$dir/cgroup.procs")")"; }
fi

# 4. A memory hog is OOM-killed and reported.
err=$($S run --memory 32M --rootfs $R -- /bin/dd if=/dev/zero of=/dev/null bs=100M count=1 2>&1 >/dev/null)
code=$?
[ $code = 137 ] && echo "$err" | grep -q "out of memory" && ok "a memory hog is OOM-killed: exit 137, '$(oneline "$err")'" \
  || fail "OOM: exit $code (want 137), stderr: $(oneline "$err")"
echo "# kernel: $(dmesg | grep -m 1 'Memory cgroup out of memory' | sed 's/^\[[^]]*\] //')"

# 5. A fork bomb stops at the pids limit, the command returns, the host is unharmed.
t0=$(cut -d' ' -f1 /proc/uptime)
out=$($S run --pids 8 --rootfs $R -- /bin/sh -c 'for i in $(seq 20); do sleep 5 & done; wait' 2>&1)
code=$?
t1=$(cut -d' ' -f1 /proc/uptime)
forks=$(echo "$out" | grep -c "can't fork")
if [ $code != 124 ] && [ $code != 143 ] && [ "$forks" -gt 0 ]; then
  ok "a fork bomb stops at pids.max: $forks fork failures, exit $code after $(echo "$t0 $t1" | awk '{ printf "%.1f", $2 - $1 }') s ($(echo "$out" | grep -m 1 "can't fork"))"
else
  fail "pids: exit $code, $forks fork failures: $(oneline "$out")"
fi
host=$( (for i in $(seq 30); do sleep 0 & done; wait; echo forked) 2>&1 )
left=$(sandbox_pids)
[ "$host" = forked ] && [ -z "$left" ] && ok "the host forks freely afterwards and no sandbox process is left" \
  || fail "host after the fork bomb: '$(oneline "$host")', left: $(oneline "$left")"

# 6. The sandbox was spawned straight into its cgroup.
err=$(SKIFF_LOG=debug $S run --rootfs $R -- /bin/true 2>&1 >/dev/null)
code=$?
line=$(echo "$err" | grep -m 1 "clone3 CLONE_INTO_CGROUP")
[ $code = 0 ] && [ -n "$line" ] && ok "spawned with clone3 CLONE_INTO_CGROUP ($line)" \
  || fail "no 'clone3 CLONE_INTO_CGROUP' in the debug log (exit $code): $(oneline "$err")"

# Optional: a CPU hog gets its cpu.max quota (needs a static tests/probe/probe.c).
if [ -x $R/bin/probe ]; then
  out=$($S run --cpu 0.2 --rootfs $R -- /bin/probe spin 1000 2>&1)
  cpu=$(echo "$out" | sed -n 's/^cpu //p')
  awk -v c="$cpu" 'BEGIN { exit !(c > 0.02 && c <= 0.35) }' && ok "a CPU hog gets its cpu.max quota ($cpu CPU-s in 1 s at 0.2)" \
    || fail "cpu quota 0.2: $(oneline "$out")"
fi

# 7b. gc --pools leaves nothing of skiff in /sys/fs/cgroup or the mount table, and no
#     sandbox process alive.
id=$($S run -d --rootfs $R -- /bin/sleep 30 2>/dev/null)
pid=$($S ps | awk -v id="$id" '$1 == id { print $2 }')
$S kill "$id" >/dev/null 2>&1
echo "# before gc --pools: mounts under $D: $(oneline "$(grep " $D" /proc/mounts | cut -d' ' -f2,3)"); cgroups: $(oneline "$(find /sys/fs/cgroup -maxdepth 1 -name 'skiff-*')")"
out=$($S gc --pools 2>&1)
code=$?
echo "# gc --pools: $(oneline "$out")"
cg=$(find /sys/fs/cgroup -name 'skiff-*' 2>/dev/null)
mnt=$(grep " $D" /proc/mounts)
left=$(sandbox_pids)
if [ $code = 0 ] && [ -z "$cg" ] && [ -z "$mnt" ] && [ -z "$left" ] && ! alive "$pid"; then
  ok "gc --pools leaves no skiff-* cgroup, no mount of $D and no sandbox process"
else
  fail "gc --pools: exit $code; cgroups: $(oneline "$cg"); mounts: $(oneline "$mnt"); processes: $(oneline "$left"); sleep pid ${pid:-?} alive: $(alive "$pid" && echo yes || echo no)"
fi

if [ $failed = 0 ]; then echo "SKIFF-VM-RESULT: PASS"; else echo "SKIFF-VM-RESULT: FAIL"; fi

#!/bin/sh
# Runs inside the VM (pure cgroup v2: memory, cpu, pids) on /bin/skiff; prints TAP-like
# lines and a final SKIFF-VM-RESULT line.
S="/bin/skiff --data /tmp/data"
R=/rootfs
failed=0
ok() { echo "ok - $*"; }
fail() { echo "FAIL - $*"; failed=1; }

echo "# kernel $(uname -r), controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
out=$($S pool --size 8 2>&1)
echo "$out" | grep -q "^cgroup: v2$" && ok "skiff sees a pure cgroup v2 host" || fail "pool: $out"

out=$($S run --rootfs $R -- /bin/cat /proc/self/cgroup 2>&1)
[ "$out" = "0::/" ] && ok "the cgroup namespace is rooted at the slot" || fail "cgroup namespace: $out"

err=$(SKIFF_LOG=debug $S run --rootfs $R -- /bin/true 2>&1 >/dev/null)
echo "$err" | grep -q "clone3 CLONE_INTO_CGROUP" && ok "spawned straight into the cgroup with clone3 CLONE_INTO_CGROUP" \
  || fail "no CLONE_INTO_CGROUP: $err"

id=$($S run -d --memory 48M --pids 20 --cpu 0.5 --rootfs $R -- /bin/sleep 30)
slot=$($S ps --json | grep '"slot"' | head -n 1 | tr -dc '0-9')
pid=$($S ps --json | grep '"pid"' | head -n 1 | tr -dc '0-9')
dir=$($S pool | sed -n 's/^path: //p')/$slot
[ "$(cat $dir/memory.max)" = 50331648 ] && ok "memory.max set" || fail "memory.max: $(cat $dir/memory.max)"
[ "$(cat $dir/pids.max)" = 20 ] && ok "pids.max set" || fail "pids.max: $(cat $dir/pids.max)"
[ "$(cat $dir/cpu.max)" = "50000 100000" ] && ok "cpu.max set" || fail "cpu.max: $(cat $dir/cpu.max)"
grep -qx "$pid" $dir/cgroup.procs && ok "the sandbox runs in its slot" || fail "pid $pid not in $dir: $(cat $dir/cgroup.procs)"
$S kill $id && [ -z "$(cat $dir/cgroup.procs)" ] && ok "kill empties the slot" || fail "kill: $(cat $dir/cgroup.procs)"

err=$($S run --memory 32M --rootfs $R -- /bin/dd if=/dev/zero of=/dev/null bs=100M count=1 2>&1 >/dev/null)
code=$?
[ $code = 137 ] && echo "$err" | grep -q "out of memory" && ok "a memory hog is OOM-killed (memory.events)" \
  || fail "OOM: exit $code, $err"

err=$($S run --pids 8 --rootfs $R -- /bin/sh -c 'for i in $(seq 20); do sleep 1 & done; wait' 2>&1)
echo "$err" | grep -q "can't fork" && ok "a fork bomb stops at pids.max" || fail "pids: $err"

if [ -x $R/bin/probe ]; then
  cpu=$($S run --cpu 0.2 --rootfs $R -- /bin/probe spin 1000 | sed -n 's/^cpu //p')
  awk -v c="$cpu" 'BEGIN { exit !(c > 0.02 && c <= 0.35) }' && ok "a CPU hog gets its cpu.max quota ($cpu CPU-s in 1 s at 0.2)" \
    || fail "cpu: $cpu"
fi

out=$($S gc --pools 2>&1)
left=$(ls /sys/fs/cgroup | grep '^skiff-')
[ -z "$left" ] && ok "gc --pools removes every cgroup" || fail "left: $left ($out)"

if [ $failed = 0 ]; then echo "SKIFF-VM-RESULT: PASS"; else echo "SKIFF-VM-RESULT: FAIL"; fi

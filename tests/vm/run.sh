#!/usr/bin/env bash
# Tests skiff's cgroup v2 path for real: this host is hybrid (its v2 mount has no
# controllers), so boot Debian's cloud kernel (pure cgroup v2: cpuset cpu io memory pids)
# in QEMU with software emulation (nested KVM hangs the guest here) from an initramfs
# holding busybox, skiff, a tiny rootfs for sandboxes and guest-test.sh, and read the
# results off the serial console. About 2 s of boot, 5-10 s in all.
#
# Usage: tests/vm/run.sh SKIFF_BINARY [PROBE_BINARY]
#   SKIFF_BINARY  a static skiff (static-pie/musl: the initramfs has no shared libraries)
#   PROBE_BINARY  optional static tests/probe/probe.c, for the CPU quota check
# Env: SKIFF_VM_TIMEOUT (seconds, default 120), SKIFF_VM_KERNEL (a vmlinuz to use instead
#   of Debian's cloud kernel, which is downloaded once into tests/vm/work/, gitignored),
#   SKIFF_VM_GUEST_TEST (another guest script, e.g. a smoke test of the boot path).
# Exit status: 0 only if the guest printed `SKIFF-VM-RESULT: PASS` and no `FAIL -` line.
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: $0 SKIFF_BINARY [PROBE_BINARY]" >&2; exit 2; }
skiff=$(realpath "$1")
probe=${2:+$(realpath "$2")}
here=$(cd "$(dirname "$0")" && pwd)
work=$here/work
timeout_s=${SKIFF_VM_TIMEOUT:-120}
mkdir -p "$work"
command -v qemu-system-x86_64 >/dev/null || { echo "run.sh: qemu-system-x86_64 is missing: apt-get install qemu-system-x86" >&2; exit 2; }
[ -x /bin/busybox ] || { echo "run.sh: /bin/busybox is missing: apt-get install busybox-static" >&2; exit 2; }
for bin in "$skiff" /bin/busybox ${probe:+"$probe"}; do
  if readelf -l "$bin" 2>/dev/null | grep -q 'program interpreter'; then
    echo "run.sh: $bin is dynamically linked; the initramfs has no shared libraries" >&2; exit 2
  fi
done

# The kernel: Debian's cloud kernel unpacked from its package (not installed on the host),
# downloaded once. Everything it needs here is built in (checked below), so the initramfs
# carries no modules.
fetch_kernel() {
  local pkg
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -q >/dev/null
    pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  [ -n "$pkg" ] || { echo "run.sh: cannot resolve linux-image-cloud-amd64's kernel package" >&2; return 1; }
  rm -f "$work"/*.deb
  # A stale package list names a version the mirror no longer has: update once and retry.
  (cd "$work" && apt-get download -q "$pkg") || { apt-get update -q >/dev/null && (cd "$work" && apt-get download -q "$pkg"); }
  rm -rf "$work/kernel.tmp" && dpkg-deb -x "$work/$pkg"_*.deb "$work/kernel.tmp"
  rm -rf "$work/kernel" && mv "$work/kernel.tmp" "$work/kernel"
}
if [ -n "${SKIFF_VM_KERNEL:-}" ]; then
  kernel=$(realpath "$SKIFF_VM_KERNEL")
else
  (
    flock 9
    ls "$work"/kernel/boot/vmlinuz-* >/dev/null 2>&1 || fetch_kernel
  ) 9>"$work/.kernel.lock"
  kernel=$(ls "$work"/kernel/boot/vmlinuz-* | sort -V | tail -n 1)
  config=$work/kernel/boot/config-${kernel##*/vmlinuz-}
  # What the guest uses must be built in (=y), or it would need modules in the initramfs:
  # serial console, initramfs, devtmpfs/tmpfs, cgroup v2 controllers, namespaces, seccomp.
  # (cgroup namespaces, pidfd and clone3 have no options of their own on x86_64.)
  missing=()
  for opt in SERIAL_8250 SERIAL_8250_CONSOLE BLK_DEV_INITRD RD_GZIP DEVTMPFS TMPFS PROC_FS \
      SYSFS BINFMT_SCRIPT CGROUPS MEMCG CGROUP_PIDS CGROUP_SCHED CFS_BANDWIDTH CPUSETS \
      NAMESPACES UTS_NS IPC_NS PID_NS NET_NS USER_NS SECCOMP_FILTER UNIX; do
    grep -qx "CONFIG_$opt=y" "$config" || missing+=("$opt")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "run.sh: $(basename "$kernel") does not build in ${missing[*]} (modules are not loaded here)" >&2
    exit 2
  fi
fi

# The initramfs, per run (runs may overlap): busybox, skiff, a rootfs for sandboxes, the test.
run=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
initrd=$run/initramfs
mkdir -p "$initrd"/{bin,proc,sys,dev,tmp,run,new,rootfs/bin,rootfs/proc,rootfs/dev,rootfs/tmp}
cp /bin/busybox "$initrd/bin/busybox"
for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$initrd/bin/$applet"; done
cp "$skiff" "$initrd/bin/skiff"
cp /bin/busybox "$initrd/rootfs/bin/busybox"
for applet in sh cat true sleep dd seq grep echo ls; do ln -s busybox "$initrd/rootfs/bin/$applet"; done
if [ -n "$probe" ]; then cp "$probe" "$initrd/rootfs/bin/probe"; fi
cp "${SKIFF_VM_GUEST_TEST:-$here/guest-test.sh}" "$initrd/guest-test.sh"
cat > "$initrd/init" <<'INIT'
#!/bin/sh
# pivot_root cannot leave the initramfs root (rootfs), and sandboxes pivot_root: copy
# everything onto a tmpfs and switch_root into it, as a real init does.
mount -t tmpfs -o mode=755 tmpfs /new
cp -a /bin /rootfs /guest-test.sh /new/
mkdir -p /new/proc /new/sys /new/dev /new/tmp /new/run
cat > /new/stage2 <<'STAGE2'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# Kernel messages (the OOM report) would interleave with the result lines on ttyS0.
dmesg -n 1
echo
echo "# booted in $(cut -d' ' -f1 /proc/uptime) s (guest clock)"
sh /guest-test.sh 2>&1 || echo "SKIFF-VM-RESULT: FAIL (guest-test.sh exited $?)"
echo "# done at $(cut -d' ' -f1 /proc/uptime) s (guest clock)"
sync
poweroff -f
STAGE2
chmod +x /new/stage2
exec switch_root /new /stage2
INIT
chmod +x "$initrd/init"
(cd "$initrd" && find . | cpio -o -H newc --quiet | gzip -1) > "$run/initramfs.cpio.gz"

log=$run/console.log
start=$(date +%s%N)
status=0
# No NIC: sandboxes here need loopback only, and the firmware skips iPXE's boot attempt.
timeout "$timeout_s" qemu-system-x86_64 -accel tcg -m 1024 -smp 2 -nographic -no-reboot -nic none \
  -kernel "$kernel" -initrd "$run/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" </dev/null >"$log" 2>&1 || status=$?
end=$(date +%s%N)
# The console without carriage returns and the firmware's terminal escapes.
cp "$log" "$work/console.raw"
sed -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' -e 's/Booting from ROM\.\.\./&\n/' "$log" >"$work/console.log"
echo "# console ($(basename "$kernel"), qemu exit $status):"
if grep -q '^Booting from ROM' "$work/console.log"; then
  sed -n '/^Booting from ROM/,$p' "$work/console.log" | tail -n +2 | sed '/./,$!d'
else
  cat "$work/console.log"
fi
echo "# VM run took $(( (end - start) / 1000000 )) ms on the host; log in $work/console.log"
[ "$status" = 124 ] && echo "# qemu timed out after ${timeout_s} s (SKIFF_VM_TIMEOUT)"
if [ "$(grep '^SKIFF-VM-RESULT:' "$work/console.log" | tail -n 1)" = "SKIFF-VM-RESULT: PASS" ] \
    && ! grep -q '^FAIL - ' "$work/console.log"; then
  exit 0
fi
echo "# the guest did not pass" >&2
exit 1

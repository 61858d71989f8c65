#!/usr/bin/env bash
# Tests skiff's cgroup v2 path for real: this host is hybrid (its v2 mount has no
# controllers), so boot Debian's cloud kernel (cgroup v2 with memory, cpu, pids) in QEMU
# with software emulation (nested KVM hangs here) from an initramfs holding busybox,
# skiff and guest-test.sh, and read the results off the serial console.
# Usage: tests/vm/run.sh SKIFF_BINARY [PROBE_BINARY]
set -euo pipefail
skiff=$(realpath "$1")
probe=${2:+$(realpath "$2")}
here=$(cd "$(dirname "$0")" && pwd)
work=$here/work
mkdir -p "$work"

# The kernel, unpacked from Debian's package without installing it on the host.
if ! ls "$work"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
  [ -n "$(apt-cache depends linux-image-cloud-amd64 2>/dev/null)" ] || apt-get update -q >/dev/null
  pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  (cd "$work" && rm -f ./*.deb && apt-get download "$pkg" 2>/dev/null)
  rm -rf "$work/kernel" && dpkg-deb -x "$work"/"$pkg"_*.deb "$work/kernel"
fi
kernel=$(ls "$work"/kernel/boot/vmlinuz-* | head -n 1)

# The initramfs: busybox, skiff, a rootfs for sandboxes, and the test.
initrd=$work/initramfs
rm -rf "$initrd" && mkdir -p "$initrd"/{bin,proc,sys,dev,tmp,run,new,rootfs/bin,rootfs/proc,rootfs/dev,rootfs/tmp}
cp /bin/busybox "$initrd/bin/busybox"
for applet in $("$initrd/bin/busybox" --list); do [ "$applet" = busybox ] || ln -sf busybox "$initrd/bin/$applet"; done
cp "$skiff" "$initrd/bin/skiff"
cp /bin/busybox "$initrd/rootfs/bin/busybox"
for applet in sh cat true sleep dd seq grep echo; do ln -sf busybox "$initrd/rootfs/bin/$applet"; done
[ -n "$probe" ] && cp "$probe" "$initrd/rootfs/bin/probe"
cp "$here/guest-test.sh" "$initrd/guest-test.sh"
cat > "$initrd/init" <<'INIT'
#!/bin/sh
# pivot_root cannot leave the initramfs root: copy everything onto a tmpfs and
# switch_root into it, as a real init does.
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
sh /guest-test.sh
sync
poweroff -f
STAGE2
chmod +x /new/stage2
exec switch_root /new /stage2
INIT
chmod +x "$initrd/init"
(cd "$initrd" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.cpio.gz"

log=$work/console.log
start=$(date +%s.%N)
timeout 300 qemu-system-x86_64 -accel tcg -m 1024 -smp 2 -nographic -no-reboot \
  -kernel "$kernel" -initrd "$work/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" </dev/null >"$log" 2>&1 || true
end=$(date +%s.%N)
tr -d '\r' <"$log" | grep -E '^(ok|FAIL|SKIFF-VM|#)' || true
echo "# VM run took $(echo "$end - $start" | bc) s with $(basename "$kernel")"
if ! grep -q '^SKIFF-VM-RESULT: PASS' <(tr -d '\r' <"$log"); then
  echo "# the guest did not pass; console log:"; tr -d '\r' <"$log" | tail -n 60
  exit 1
fi

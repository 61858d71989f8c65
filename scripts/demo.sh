#!/usr/bin/env bash
# The main job as it stands: build skiff, make a busybox rootfs, and run commands in
# sandboxes (foreground, limits, detached + ps + kill), then clean up with gc.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo build --release -p skiff
skiff=target/x86_64-unknown-linux-musl/release/skiff
export SKIFF_DATA=${SKIFF_DATA:-/var/lib/skiff}
rootfs=target/demo-rootfs
mkdir -p "$rootfs"/{bin,proc,dev,tmp}
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh echo cat id hostname sleep ls; do ln -sf busybox "$rootfs/bin/$applet"; done

set -x
$skiff pool
$skiff run --rootfs "$rootfs" --memory 64M --cpu 0.5 --pids 32 -- /bin/sh -c 'echo "hello from pid $$ on $(hostname) as $(id)"'
id=$($skiff run -d --rootfs "$rootfs" -- /bin/sleep 60)
$skiff ps
$skiff kill "$id"
$skiff gc

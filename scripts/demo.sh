#!/usr/bin/env bash
# The main job as it stands: build skiff, start `skiff serve` on the embedded defaults
# (data /var/lib/skiff, socket /run/skiff/skiff.sock, TCP 127.0.0.1:8080), deploy the
# examples (python3, node, binary, a wasm counter with sessions) and invoke them over the socket and over TCP, an
# async invocation and its record, logs, instances; then the sandbox tier by hand: a
# command with limits, a detached sandbox listed and killed, gc.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo build --release -p skiff
skiff=$PWD/target/x86_64-unknown-linux-musl/release/skiff
make -s -C examples/echo-binary
bash scripts/build-wasm.sh

$skiff serve &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S /run/skiff/skiff.sock ] && break; sleep 0.1; done

set -x
$skiff deploy examples/hello-python
$skiff deploy examples/hello-node
$skiff deploy examples/echo-binary
$skiff deploy examples/counter-wasm
$skiff ls
$skiff invoke hello-python -d '{"name": "skiff"}'
echo
$skiff invoke hello-node --data '{"name": "skiff"}'   # as curl: -d, --data, @FILE
echo
$skiff invoke echo-binary -d 'hello from a skiff sandbox'
echo
# A session per x-user: alice's count goes up, bob's starts at 1.
$skiff invoke counter-wasm -H x-user:alice
echo
$skiff invoke counter-wasm -H x-user:alice
echo
$skiff invoke counter-wasm -H x-user:bob
echo
curl -s http://127.0.0.1:8080/v1/sessions
echo
curl -s -i --data '{"name": "TCP"}' http://127.0.0.1:8080/fn/hello-python
echo
id=$($skiff invoke hello-python --async -d '{"name": "later"}')
sleep 0.5
$skiff invocation "$id"
$skiff ps

rootfs=target/demo-rootfs
mkdir -p "$rootfs"/{bin,proc,dev,tmp}
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh echo cat id hostname sleep ls; do ln -sf busybox "$rootfs/bin/$applet"; done
$skiff run --rootfs "$rootfs" --memory 64M --cpu 0.5 --pids 32 -- /bin/sh -c 'echo "hello from pid $$ on $(hostname) as $(id)"'
id=$($skiff run -d --rootfs "$rootfs" -- /bin/sleep 60)
$skiff ps
$skiff kill "$id"
$skiff gc

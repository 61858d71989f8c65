#!/usr/bin/env bash
# Installs what skiff's build, demo and tests need on a fresh Debian machine (as root).
# Quick when everything is already there.
set -euo pipefail
need=()
command -v busybox >/dev/null && [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || need+=(busybox-static)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v file >/dev/null || need+=(file)
command -v umoci >/dev/null || need+=(umoci)
command -v curl >/dev/null || need+=(curl)
command -v make >/dev/null || need+=(make)
# wasmtime compiles a C helper for the musl target.
command -v musl-gcc >/dev/null || need+=(musl-tools)
# The runtimes functions use; node's headers come with it (the node template's addon).
[ -x /usr/bin/python3.11 ] || need+=(python3)
command -v node >/dev/null || need+=(nodejs npm)
# bench/sessions runs the same wasm apps against a real local Redis.
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "deps: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
rustup target list --installed 2>/dev/null | grep -q x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
# The wasm examples and test guests.
rustup target list --installed 2>/dev/null | grep -q wasm32-wasip1 || rustup target add wasm32-wasip1

#!/usr/bin/env bash
# Builds skiff's wasm guests and copies each module next to the skiff.yaml that names it:
# the examples (examples/*-wasm), the integration tests' fixtures
# (crates/skiff/tests/functions/wasm-*) and the session benchmark's app
# (bench/sessions/kvapp). Idempotent and quiet; exits non-zero on the first failure.
#
#   bash scripts/build-wasm.sh
#
# Rust guests build with cargo for wasm32-wasip1 (the target is added with rustup if
# missing) into target/wasm and target/wasm-tests, outside the function directories,
# which `skiff deploy` uploads whole. The C example needs clang and wasm-ld; without
# them it is skipped with a note.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=wasm32-wasip1

say() { echo "build-wasm: $*" >&2; }

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    say "adding the $target target"
    rustup target add "$target" >/dev/null
fi

# build DIR TARGET_DIR: cargo-builds the workspace in DIR (relative to the root).
build() {
    (cd "$root/$1" && cargo build --quiet --locked --release --target "$target" \
        --target-dir "$root/$2") || {
        say "cargo build failed in $1"
        exit 1
    }
}

# install MODULE DEST: copies a built module into DEST (a directory with a skiff.yaml),
# rewriting it only when it changed so unchanged functions keep their mtime.
install() {
    local module=$1 dest=$2
    [ -f "$root/$dest/skiff.yaml" ] || { say "no skiff.yaml in $dest"; exit 1; }
    [ -f "$module" ] || { say "missing build output $module"; exit 1; }
    local name
    name=$(basename "$module")
    cmp -s "$module" "$root/$dest/$name" || cp "$module" "$root/$dest/$name"
}

# The examples and the benchmark app share one target directory; the test guests have
# their own, since a crate name like "counter" occurs in both.
out=target/wasm/$target/release
for dir in examples/counter-wasm examples/cart-wasm examples/lookup-wasm bench/sessions/kvapp; do
    build "$dir" target/wasm
done
install "$root/$out/counter.wasm" examples/counter-wasm
install "$root/$out/cart.wasm" examples/cart-wasm
install "$root/$out/lookup.wasm" examples/lookup-wasm
install "$root/$out/kvapp.wasm" bench/sessions/kvapp

build crates/skiff/tests/wasm-guests target/wasm-tests
for name in counter weak hostile hook pubsub; do
    install "$root/target/wasm-tests/$target/release/$name.wasm" \
        "crates/skiff/tests/functions/wasm-$name"
done

# The freestanding C example: only skiff's imports, no libc.
if command -v clang >/dev/null && command -v wasm-ld >/dev/null; then
    make --quiet -C "$root/examples/hello-c-wasm" CLANG=clang >/dev/null || {
        say "make failed in examples/hello-c-wasm"
        exit 1
    }
else
    say "skipping examples/hello-c-wasm: needs clang and wasm-ld (apt-get install clang lld)"
fi

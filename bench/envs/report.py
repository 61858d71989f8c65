"""Prints bench/envs results as markdown (also written to bench/out/envs/envs.md)."""

import json
import os
import sys
import time

out, quick = sys.argv[1], sys.argv[2] == "1"
size = json.load(open(f"{out}/size.json"))
mem = json.load(open(f"{out}/memory.json"))
MB = 1 << 20
lines = []
say = lines.append
say(f"### Environments: skiff's shared store vs conventional images ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, kernel {os.uname().release})")
say("")
say(f"`bench/envs/run.sh{' --quick' if quick else ''}`")
say("")
say("Size on disk (the conventional image: all files of the Debian packages that own the runtime's files):")
say("")
say("| runtime | skiff, first function | conventional image | skiff / conventional | a second function adds |")
say("|---|---|---|---|---|")
for rt, first, conv, second in (
    ("python3", size["python_first"], size["python_conventional"], f"{size['python_second_adds'] / 1024:.1f} KB"),
    ("node", size["node_first"], size["node_conventional"], ""),
    ("binary", size["binary_first"], size["binary_conventional"], ""),
):
    say(f"| {rt} | {first / MB:.1f} MB | {conv / MB:.1f} MB | {100 * first / max(conv, 1):.0f}% | {second} |")
say("")
b = size["build_ms"]
say(f"Build time: python3 cold (runtime layer made) {b['python_cold']} ms, warm (second function) {b['python_warm']} ms; node cold {b['node_cold']} ms, warm (same function rebuilt) {b['node_warm']} ms; binary {b['binary']} ms.")
say("")
n = mem["n"]
say(f"Memory of {n} idle instances: PSS summed over the instances' processes (shared pages split between their users; exact), and the machine-wide rise of MemTotal - MemFree with caches dropped (includes kernel objects and page cache; noisy at a few MB here):")
say("")
say("| runtime | skiff, shared inodes | copied trees per instance | bare processes | skiff vs bare | copied / skiff | machine rise: skiff / copied / bare |")
say("|---|---|---|---|---|---|---|")
worst = 0.0
for rt in ("python3", "node", "binary", "busybox", "perl"):
    m = mem[rt]
    s, c, bare = m["shared_pss_kb"], m["copied_pss_kb"], m["bare_pss_kb"]
    over = 100 * (s - bare) / max(bare, 1)
    worst = max(worst, over)
    rise = " / ".join(f"{m[k] / 1024:.1f}" for k in ("shared_kb", "copied_kb", "bare_kb"))
    say(f"| {rt} | {s / 1024:.1f} MB | {c / 1024:.1f} MB | {bare / 1024:.1f} MB | {over:+.1f}% | {c / max(s, 1):.1f}x | {rise} MB |")
say("")
say(
    "Targets: a second python function adds < 1 MB: "
    + ("met" if size["python_second_adds"] < MB else "MISSED")
    + f"; first python function < 40% of the conventional image: {'met' if size['python_first'] < 0.4 * size['python_conventional'] else 'MISSED'}"
    + f"; memory at most 1% above bare: worst {worst:+.1f}% ({'met' if worst <= 1 else 'MISSED'})"
)
text = "\n".join(lines) + "\n"
open(f"{out}/envs.md", "w").write(text)
print(text)

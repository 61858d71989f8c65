"""Turns bench/out/*.json from bench/startup/run.sh into a table, a markdown section
(bench/out/startup.md) and a plot of the concurrent curve (bench/startup-concurrent.png)."""

import json
import os
import statistics
import subprocess
import sys
import time

out, quick = sys.argv[1], sys.argv[2] == "1"
repo = os.path.dirname(os.path.dirname(out))


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


seq = {who: json.load(open(f"{out}/seq-{who}.json")) for who in ("skiff", "runc")}
conc = [json.loads(line) for line in open(f"{out}/conc.jsonl")]
mem = json.load(open(f"{out}/mem.json"))

lines = []
say = lines.append
kernel = os.uname().release
say(f"### Startup: skiff vs runc ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, kernel {kernel})")
say("")
say(f"`bench/startup/run.sh{' --quick' if quick else ''}` (runc {subprocess.run(['runc', '--version'], capture_output=True, text=True).stdout.split()[2]}; the same rootfs, program, namespaces and limits; skiff's pool pre-created)")
say("")
say(f"Sequential, {seq['skiff']['n']} starts each (ms; failures: skiff {seq['skiff']['failures']}, runc {seq['runc']['failures']}):")
say("")
say("| | skiff p50 | skiff p99 | skiff max | runc p50 | runc p99 | runc max | runc / skiff at p50 |")
say("|---|---|---|---|---|---|---|---|")
for key, label in (("to_main_ms", "to the program's main"), ("to_exit_ms", "to the launcher's exit")):
    s, r = seq["skiff"][key], seq["runc"][key]
    say(f"| {label} | {pct(s, 50):.2f} | {pct(s, 99):.2f} | {max(s):.2f} | {pct(r, 50):.2f} | {pct(r, 99):.2f} | {max(r):.2f} | {pct(r, 50) / pct(s, 50):.1f}x |")
say("")
ns = sorted({c["r"]["n"] for c in conc})
reps = max(c["rep"] for c in conc)
say(f"Concurrent starts released at once (median of {reps}; ms until every program's main ran, CPU-seconds the machine used):")
say("")
say("| N | skiff all running | skiff CPU-s | runc all running | runc CPU-s | runc / skiff | failures |")
say("|---|---|---|---|---|---|---|")
curve = []
for n in ns:
    row = {}
    for who in ("skiff", "runc"):
        runs = [c["r"] for c in conc if c["who"] == who and c["r"]["n"] == n]
        row[who] = (
            statistics.median(r["all_running_ms"] for r in runs),
            statistics.median(r["cpu_s"] for r in runs),
            sum(r["failures"] for r in runs),
        )
    curve.append((n, row["skiff"][0], row["runc"][0]))
    say(f"| {n} | {row['skiff'][0]:.1f} | {row['skiff'][1]:.2f} | {row['runc'][0]:.1f} | {row['runc'][1]:.2f} | {row['runc'][0] / row['skiff'][0]:.1f}x | {row['skiff'][2]} / {row['runc'][2]} |")
say("")
idle = mem["idle"]
per = {k: mem[f"{k}_kb"] / idle for k in ("bare", "skiff", "runc")}
say(f"Memory, {idle} idle sandboxes alive at once (rise of MemTotal - MemAvailable, caches dropped, per sandbox):")
say("")
say("| bare process | skiff | runc | skiff beyond bare | runc beyond bare | ratio of overheads |")
say("|---|---|---|---|---|---|")
over_s, over_r = per["skiff"] - per["bare"], per["runc"] - per["bare"]
say(f"| {per['bare']:.0f} KB | {per['skiff']:.0f} KB | {per['runc']:.0f} KB | {over_s:.0f} KB | {over_r:.0f} KB | {over_r / max(over_s, 1):.0f}x |")
say("")
say(f"skiff's cgroup pool ({mem['pool_slots']} slots, made once before any start) costs {mem['pool_kb'] / mem['pool_slots']:.0f} KB per slot; runc creates and removes its cgroups on every start.")
say("")
seq_p50 = pct(seq["skiff"]["to_main_ms"], 50)
top = curve[-1]
targets = [
    ("p50 sequential start to main <= 2 ms", seq_p50 <= 2.0, f"{seq_p50:.2f} ms"),
    (f"{top[0]} concurrent all running <= 300 ms", top[1] <= 300, f"{top[1]:.0f} ms"),
    (">= 10x faster than runc at p50", pct(seq["runc"]["to_main_ms"], 50) / seq_p50 >= 10, f"{pct(seq['runc']['to_main_ms'], 50) / seq_p50:.1f}x"),
    (f">= 10x faster than runc at {top[0]}-way", top[2] / top[1] >= 10, f"{top[2] / top[1]:.1f}x"),
    ("<= 300 KB per idle sandbox beyond the bare process", over_s <= 300, f"{over_s:.0f} KB"),
]
say("Targets: " + "; ".join(f"{name}: {value} ({'met' if ok else 'MISSED'})" for name, ok, value in targets))
say("")
say("![concurrent starts](startup-concurrent.png)")
text = "\n".join(lines) + "\n"
open(f"{out}/startup.md", "w").write(text)
json.dump({"seq": {w: {k: seq[w][k] for k in ("to_main_ms", "to_exit_ms")} for w in seq}, "conc": conc, "mem": mem}, open(f"{out}/startup.json", "w"))
print(text)

dat = f"{out}/concurrent.dat"
with open(dat, "w") as f:
    for n, s, r in curve:
        f.write(f"{n} {s} {r}\n")
png = f"{repo}/bench/startup-concurrent.png"
subprocess.run(["gnuplot"], input=f"""
set terminal pngcairo size 800,500
set output '{png}'
set title 'Concurrent starts until every program runs ({os.cpu_count()} cores)'
set xlabel 'sandboxes started at once'
set ylabel 'ms until all running'
set logscale xy
set key left top
set grid
plot '{dat}' using 1:3 with linespoints title 'runc run', '{dat}' using 1:2 with linespoints title 'skiff run'
""", text=True, check=True)

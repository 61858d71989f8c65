"""Turns the raw results of bench/startup/run.sh (bench/out/*.jsonl, meta.json) into the
tables it prints, bench/out/startup.md (a section for bench/RESULTS.md),
bench/out/startup.json (everything raw, in one file) and bench/out/concurrent.png.
Usage: report.py OUT_DIR QUICK(0|1)"""

import json
import os
import statistics
import subprocess
import sys
import time

out, quick = sys.argv[1], sys.argv[2] == "1"


def jsonl(name):
    return [json.loads(line) for line in open(os.path.join(out, name)) if line.strip()]


def pct(values, p):
    """Nearest-rank percentile."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, -(-p * len(values) // 100) - 1))]


seq_chunks, conc, mem = jsonl("seq.jsonl"), jsonl("conc.jsonl"), jsonl("mem.jsonl")
meta = json.load(open(os.path.join(out, "meta.json")))
bg = jsonl("bg.jsonl")
samples = [b for b in bg if "cpus" in b]
retries = [b for b in bg if "disturbed_try" in b]
seq = {}
for who in ("skiff", "runc"):
    chunks = [c["r"] for c in seq_chunks if c["who"] == who]
    seq[who] = {
        "to_main_ms": [v for c in chunks for v in c["to_main_ms"]],
        "to_exit_ms": [v for c in chunks for v in c["to_exit_ms"]],
        "failures": sum(c["failures"] for c in chunks),
    }

lines = []
say = lines.append
cores = os.cpu_count()
cpu_model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
say(f"### Startup: skiff vs runc ({time.strftime('%Y-%m-%d')}, {cores} cores, kernel {os.uname().release})")
say("")
say(f"`bench/startup/run.sh{' --quick' if quick else ''}`: {meta['skiff']} vs {meta['runc']}, on {cores} cores "
    f"({cpu_model}), the same rootfs, static program, namespaces (pid ipc uts mount cgroup) and limits "
    f"(256M, 1 CPU, 64 pids); skiff's cgroup pool made beforehand. Other load on the machine, sampled "
    f"before each batch: median {statistics.median(b['cpus'] for b in samples):.2f}, max "
    f"{max(b['cpus'] for b in samples):.2f} CPUs busy (waited {sum(b['waited_s'] for b in samples)} s in all for it "
    f"to end; {len(retries)} batches measured again because other load came up during them, "
    f"{sum(c['r']['disturbed'] for c in seq_chunks + conc)} kept although still disturbed after 3 tries).")
say("")

n_seq = len(seq["skiff"]["to_main_ms"])
say(f"Sequential, {n_seq} starts each, alternating in chunks (ms from spawn; failures: skiff "
    f"{seq['skiff']['failures']}, runc {seq['runc']['failures']}):")
say("")
say("| | skiff p50 | skiff p99 | skiff max | runc p50 | runc p99 | runc max | runc / skiff p50 | runc / skiff p99 |")
say("|---|---|---|---|---|---|---|---|---|")
for key, label in (("to_main_ms", "to the program's main"), ("to_exit_ms", "to the launcher's exit")):
    s, r = seq["skiff"][key], seq["runc"][key]
    say(f"| {label} | {pct(s, 50):.2f} | {pct(s, 99):.2f} | {max(s):.2f} | {pct(r, 50):.2f} | {pct(r, 99):.2f} | "
        f"{max(r):.2f} | {pct(r, 50) / pct(s, 50):.1f}x | {pct(r, 99) / pct(s, 99):.1f}x |")
say("")

ns = sorted({c["r"]["n"] for c in conc})
reps = max(c["rep"] for c in conc)
say(f"Concurrent: N launchers spawned back to back (median of {reps}; ms from the first spawn until every "
    "program's main ran, the slowest single start, CPU-seconds the whole machine was busy over the batch "
    "(in brackets: of the launchers and their programs alone, without kernel threads)):")
say("")
say("| N | skiff all running | skiff slowest | skiff CPU-s | runc all running | runc slowest | runc CPU-s | "
    "runc / skiff | failures skiff / runc |")
say("|---|---|---|---|---|---|---|---|---|")
curve = []
for n in ns:
    row = {}
    for who in ("skiff", "runc"):
        runs = [c["r"] for c in conc if c["who"] == who and c["r"]["n"] == n]
        row[who] = {k: statistics.median(r[k] for r in runs)
                    for k in ("all_running_ms", "slowest_start_ms", "cpu_s", "children_cpu_s", "spawn_loop_ms")}
        row[who]["failures"] = sum(r["failures"] for r in runs)
    s, r = row["skiff"], row["runc"]
    curve.append((n, s["all_running_ms"], r["all_running_ms"]))
    say(f"| {n} | {s['all_running_ms']:.1f} | {s['slowest_start_ms']:.1f} | {s['cpu_s']:.2f} ({s['children_cpu_s']:.2f}) | "
        f"{r['all_running_ms']:.1f} | {r['slowest_start_ms']:.1f} | {r['cpu_s']:.2f} ({r['children_cpu_s']:.2f}) | "
        f"{r['all_running_ms'] / s['all_running_ms']:.1f}x | {s['failures']} / {r['failures']} |")
say("")
s = row["skiff"]
say(f"At N = {ns[-1]} skiff's batch is CPU-bound: it kept the machine busy for {s['cpu_s']:.2f} CPU-seconds, "
    f"so {cores} cores need at least {s['cpu_s'] / cores * 1000:.0f} ms (measured: {s['all_running_ms']:.0f} ms), "
    f"while the slowest single start took {s['slowest_start_ms']:.0f} ms; the driver's spawn loop itself "
    f"lasted {s['spawn_loop_ms']:.0f} ms, sharing the cores with the starts it had already made.")
say("")

idle = meta["idle"]
mem_reps = max(m["rep"] for m in mem)
METRICS = (
    ("machine", "machine: MemTotal - MemAvailable"),
    ("corrected", "the same, less other sessions' cgroups"),
    ("cgroup", "this script's own memory cgroup"),
)


def reading(r, metric):
    if metric == "corrected":
        return r["machine_kb"] - r["others_kb"]
    return r[f"{metric}_kb"]


per, over = {}, {}
for metric, _ in METRICS:
    for who in ("bare", "skiff", "runc"):
        runs = [m for m in mem if m["who"] == who]
        per[metric, who] = {
            "rise": statistics.median((reading(m["up"], metric) - reading(m["before"], metric)) / idle for m in runs),
            "fall": statistics.median((reading(m["up"], metric) - reading(m["after"], metric)) / idle for m in runs),
        }
    for who in ("skiff", "runc"):
        over[metric, who] = {k: per[metric, who][k] - per[metric, "bare"][k] for k in ("rise", "fall")}
say(f"Memory: {idle} idle programs alive at once (`stamp sleep`; median of {mem_reps}). KB per program of the rise "
    "when they start; in brackets the fall when they are removed, as a check. Each reading after dropping caches "
    "and once it is steady (3 in a row within 2 MB: this VM's free page reporting hides up to 64 MB of free "
    "memory for seconds). Three readings: the machine's MemTotal - MemAvailable; the same less the change in "
    "other sessions' memory cgroups (this machine is shared); and the usage of the script's own memory cgroup "
    "(hierarchical: skiff's pool and runc's cgroups are below it), which misses kernel memory charged to no "
    "cgroup, such as the memory cgroups runc makes per container:")
say("")
say("| reading | bare process | skiff | runc | skiff beyond bare | runc beyond bare | runc / skiff beyond bare |")
say("|---|---|---|---|---|---|---|")
fmt = lambda d: f"{d['rise']:.0f} KB ({d['fall']:.0f})"
for metric, label in METRICS:
    o_s, o_r = over[metric, "skiff"], over[metric, "runc"]
    ratio = f"{o_r['rise'] / o_s['rise']:.1f}x" if o_s["rise"] > 0 else "-"
    say(f"| {label} | {fmt(per[metric, 'bare'])} | {fmt(per[metric, 'skiff'])} | {fmt(per[metric, 'runc'])} | "
        f"{fmt(o_s)} | {fmt(o_r)} | {ratio} |")
say("")
pool = {m: reading(meta["pool_after"], m) - reading(meta["pool_before"], m) for m, _ in METRICS}
say(f"Not in the per-sandbox numbers: skiff's cgroup pool ({meta['pool_slots']} slots, made once before any start "
    f"and reused) took {pool['corrected'] / 1024:.1f} MB of the machine, less other sessions' change "
    f"({pool['corrected'] / meta['pool_slots']:.0f} KB per slot; {pool['machine'] / 1024:.1f} MB uncorrected, "
    f"{pool['cgroup'] / 1024:.1f} MB in the own-cgroup reading); runc makes and removes its cgroups in every "
    "start instead.")
say("")

seq_p50 = pct(seq["skiff"]["to_main_ms"], 50)
seq_ratio = pct(seq["runc"]["to_main_ms"], 50) / seq_p50
top_n, top_s, top_r = curve[-1]
targets = [
    ("skiff p50 sequential start to main", "<= 2 ms", f"{seq_p50:.2f} ms", seq_p50 <= 2.0),
    (f"skiff {top_n} concurrent, all running", "<= 300 ms", f"{top_s:.0f} ms", top_s <= 300),
    ("runc / skiff at p50 (to main)", ">= 10x", f"{seq_ratio:.1f}x", seq_ratio >= 10),
    (f"runc / skiff at {top_n}-way (all running)", ">= 10x", f"{top_r / top_s:.1f}x", top_r / top_s >= 10),
] + [
    (f"skiff per idle sandbox beyond bare ({label})", "<= 300 KB", f"{over[metric, 'skiff']['rise']:.0f} KB",
     over[metric, "skiff"]["rise"] <= 300)
    for metric, label in METRICS
]
if top_n != 256:
    targets[1] = (targets[1][0] + " (target is for 256; --quick stops at 64)",) + targets[1][1:]
say("| target | goal | measured | |")
say("|---|---|---|---|")
for name, goal, value, ok in targets:
    say(f"| {name} | {goal} | {value} | {'met' if ok else 'MISSED'} |")
say("")
say("![concurrent starts](startup-concurrent.png)")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "startup.md"), "w").write(text)
json.dump({"meta": meta, "background": bg, "seq": seq, "seq_chunks": seq_chunks, "conc": conc, "mem": mem},
          open(os.path.join(out, "startup.json"), "w"))
print(text)

dat = os.path.join(out, "concurrent.dat")
with open(dat, "w") as f:
    for n, s, r in curve:
        f.write(f"{n} {s} {r}\n")
subprocess.run(["gnuplot"], input=f"""
set terminal pngcairo size 800,500
set output '{os.path.join(out, "concurrent.png")}'
set title 'N starts at once until every program runs ({cores} cores)'
set xlabel 'sandboxes started at once (N)'
set ylabel 'ms until all running (log)'
set logscale xy
set key left top
set grid
plot '{dat}' using 1:3 with linespoints pt 7 title 'runc run', '{dat}' using 1:2 with linespoints pt 7 title 'skiff run'
""", text=True, check=True)

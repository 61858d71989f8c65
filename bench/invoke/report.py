"""Tables (stdout and OUT/invoke.md) and plots (OUT/*.png, via gnuplot) for
bench/invoke/run.sh's results. Usage: report.py OUT"""
import json
import os
import sqlite3
import statistics
import subprocess
import sys

out = sys.argv[1]
lines = []


def say(text=""):
    print(text)
    lines.append(text)


def heading(title, columns):
    """A section's title and its table's header."""
    say(title)
    say()
    say("| " + " | ".join(columns) + " |")
    say("|" + "---|" * len(columns))


def load(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def cold_table(title, rows):
    """Cold starts, each row beside the row of runc's peer (its label ends `in runc`)."""
    runc = next((statistics.median(c["ms"]) for c in rows if c["label"].endswith("in runc")), None)
    heading(title, ["path", "n", "p50", "p99", "mean", "instance start p50 (daemon's init_ms)",
                    "runc p50 / this p50"])
    for c in rows:
        init = f"{statistics.median(c['init_ms']):.2f}" if c.get("init_ms") else "-"
        ratio = f"{runc / statistics.median(c['ms']):.1f}x" if runc else "-"
        say(f"| {c['label']} | {len(c['ms'])} | {pct(c['ms'], 50):.2f} | {pct(c['ms'], 99):.2f} | "
            f"{statistics.mean(c['ms']):.2f} | {init} | {ratio} |")
    say()


cold = load("cold.jsonl")
if cold:
    cold_table("### Cold start, end to end (ms; HTTP request in to response out, no idle instance)", cold)

heavy = load("heavy.jsonl")
if heavy:
    cold_table("### Cold start of a function importing numpy and pandas (ms; as above; peers spawn to exit)",
               heavy)

memory = load("memory.jsonl")
if memory:
    heading("### Memory of the numpy + pandas function (KiB)", ["process", "PSS", "RSS", "charged to its cgroup"])
    for m in memory:
        say(f"| {m['label']} | {m['pss_kb']} | {m['rss_kb']} | {m['cgroup_kb']} |")
    say()

faults = load("faults.jsonl")
if faults:
    heading("### Page faults of a template start (minor faults of the spare that becomes the instance)",
            ["path", "starts", "while it waited (median)", "from plan to first reply (median, max)"])
    for f in faults:
        say(f"| {f['label']} | {len(f['start'])} | {statistics.median(f['waiting']):.0f} | "
            f"{statistics.median(f['start']):.0f}, {max(f['start'])} |")
    say()

warm = load("warm.jsonl")
if warm:
    heading("### Warm invocations of a trivial python function (oha; latency ms, requests/s)",
            ["connections", "TCP p50", "TCP p99", "TCP req/s", "Unix p50", "Unix p99", "Unix req/s",
             "bare asyncio p50", "bare p99", "bare req/s", "skiff TCP / bare req/s", "errors (tcp, unix)"])
    by = {(w["transport"], w["c"]): w["oha"] for w in warm}
    conns = sorted({w["c"] for w in warm})
    for c in conns:
        row = [str(c)]
        for t in ("tcp", "unix", "bare"):
            o = by[(t, c)]
            row += [f"{o['latencyPercentiles']['p50'] * 1e3:.3f}", f"{o['latencyPercentiles']['p99'] * 1e3:.3f}",
                    f"{o['summary']['requestsPerSec']:.0f}"]
        ratio = by[("tcp", c)]["summary"]["requestsPerSec"] / by[("bare", c)]["summary"]["requestsPerSec"]
        errors = [sum(by[(t, c)]["errorDistribution"].values()) +
                  sum(n for s, n in by[(t, c)]["statusCodeDistribution"].items() if s != "200")
                  for t in ("tcp", "unix")]
        say("| " + " | ".join(row) + f" | {ratio:.2f} | {errors[0]}, {errors[1]} |")
    say()
    with open(os.path.join(out, "warm.dat"), "w") as f:
        for c in conns:
            f.write(f"{c} " + " ".join(f"{by[(t, c)]['summary']['requestsPerSec']:.0f}" for t in ("tcp", "unix", "bare")) + "\n")

study = load("study.jsonl")
if study:
    heading("### The Docker concurrency study on skiff's API (noop-python; latency ms)",
            ["socket", "clients", "requests", "errors", "mean", "coefficient of variation", "p50", "p99"])
    for s in study:
        d = [r[0] * 1e3 for r in sqlite3.connect(s["db"]).execute("select duration from oha where status = 200")]
        errors = s["n"] - len(d)
        mean = statistics.mean(d) if d else float("nan")
        cv = statistics.pstdev(d) / mean if len(d) > 1 else 0.0
        clients = "200 sequential" if s["clients"] == "seq" else s["clients"]
        say(f"| {s['transport']} | {clients} | {s['n']} | {errors} | {mean:.2f} | {cv:.2f} | "
            f"{pct(d, 50):.2f} | {pct(d, 99):.2f} |")
        s["mean"] = mean
    say()
    with open(os.path.join(out, "study.dat"), "w") as f:
        for t in ("unix", "tcp"):
            for s in study:
                if s["transport"] == t and s["clients"] != "seq":
                    f.write(f"{s['clients']} {s['mean']:.3f}\n")
            f.write("\n\n")

open(os.path.join(out, "invoke.md"), "w").write("\n".join(lines) + "\n")
plot = f"""
set terminal pngcairo size 800,450
set output '{out}/warm.png'
set title 'Warm invocations of a trivial python function'
set xlabel 'connections'; set ylabel 'requests/s'; set logscale x 2; set key left top; set grid
plot '{out}/warm.dat' using 1:2 with linespoints title 'skiff over TCP', \
     '' using 1:3 with linespoints title 'skiff over the Unix socket', \
     '' using 1:4 with linespoints title 'bare asyncio server (no platform)'
set output '{out}/study.png'
set title 'Docker concurrency study on skiff: mean latency'
set xlabel 'concurrent clients'; set ylabel 'mean latency (ms)'; set logscale x 10
plot '{out}/study.dat' index 0 using 1:2 with linespoints title 'Unix socket', \
     '' index 1 using 1:2 with linespoints title 'TCP'
"""
if warm and study:
    subprocess.run(["gnuplot"], input=plot.encode(), check=False)

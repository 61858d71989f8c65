"""Throughput and p99 latency vs closed-loop clients for the 6 series (3 apps x skiff
sessions / redis). Usage: python3 plot.py LOOP.jsonl OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display
import matplotlib.pyplot as plt

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fig, (tp, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
names = {"ro": "RO", "rmw": "RMW", "linear": "RMW-Linear"}
colors = {"ro": "tab:blue", "rmw": "tab:orange", "linear": "tab:green"}
for app in ("ro", "rmw", "linear"):
    for fn, style, label in (("kv-session", "-o", "skiff session"), ("kv-redis", "--s", "redis")):
        pts = sorted((r["clients"], r["rps"], r["p99_ms"]) for r in rows
                     if r["app"] == app and r["fn"] == fn)
        if not pts:
            continue
        c, rps, p99 = zip(*pts)
        kw = dict(color=colors[app], label=f"{names[app]}, {label}", markersize=4)
        tp.plot(c, rps, style, **kw)
        lat.plot(c, p99, style, **kw)
for ax, title, ylabel in ((tp, "throughput", "requests / s"), (lat, "p99 latency", "ms")):
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 5, 10, 20, 40, 80])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
lat.set_yscale("log")
tp.legend(fontsize=7)
fig.suptitle("kvapp on 1 KiB values: state in a skiff session vs in redis-server (one session / the same keys)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)

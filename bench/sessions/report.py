"""Tables (stdout and OUT/sessions.md) for bench/sessions/run.sh, with the issue's targets
marked PASS or MISS. Usage: python3 report.py OUT"""
import json
import statistics
import sys

out = sys.argv[1]


def lines(name):
    with open(f"{out}/{name}") as f:
        return [json.loads(l) for l in f if l.strip()]


machine = {k: v for d in lines("machine.json") for k, v in d.items()}
loop = {(r["fn"], r["app"], r["clients"]): r for r in lines("loop.jsonl")}
micro = {r["name"]: r for r in lines("micro.jsonl")}
cold = lines("cold.jsonl")
md = []


def p(s=""):
    md.append(s)


def table(header, rows):
    p("| " + " | ".join(header) + " |")
    p("|" + "---|" * len(header))
    for r in rows:
        p("| " + " | ".join(str(x) for x in r) + " |")
    p()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


p(f"Machine: {machine['nproc']} cores, kernel {machine['kernel']}, redis {machine['redis']}; "
  f"load average (1/5/15 min) before {machine['load_before']}, after {machine['load_after']}; "
  f"{machine['secs']} s per closed-loop point after 0.5 s of warm-up.")
p()
names = {"ro": "RO", "rmw": "RMW (weak)", "linear": "RMW-Linear (strong)"}
clients = sorted({c for (_, _, c) in loop})
for app in ("ro", "rmw", "linear"):
    p(f"Closed loop, {names[app]}: throughput (req/s), mean and p99 latency (ms); "
      "errors are non-200 answers or `error:` bodies")
    p()
    rows = []
    for c in clients:
        s, r = loop[("kv-session", app, c)], loop[("kv-redis", app, c)]
        rows.append([c, f"{s['rps']:.0f}", f"{s['mean_ms']:.2f}", f"{s['p99_ms']:.2f}",
                     f"{r['rps']:.0f}", f"{r['mean_ms']:.2f}", f"{r['p99_ms']:.2f}",
                     f"{s['rps'] / r['rps']:.2f}x", f"{r['p99_ms'] / s['p99_ms']:.2f}x",
                     f"{s['errors']} / {r['errors']}"])
    table(["clients", "skiff req/s", "skiff mean", "skiff p99", "redis req/s", "redis mean",
           "redis p99", "skiff / redis req/s", "redis / skiff p99", "errors skiff / redis"], rows)
for (fn, app, c), r in sorted(loop.items()):
    if r["errors"]:
        p(f"- {fn} {app} at {c} clients: {r['errors']} errors, e.g. `{r['error_sample']}`")
p()

p("Inside a worker (bench/sessions/micro; µs; each timed call on its own):")
p()
what = {
    "run_no_state": "a request in a fresh instance, no state call (instantiate + WASI context + call)",
    "run_ro": "the same, `ro`: one weak 1 KiB read from a Space",
    "run_seed": "the same, `seed`: one weak 1 KiB write",
    "run_rmw": "the same, `rmw`: weak read + weak write",
    "run_linear": "the same, `linear`: strong read + strong write (the lock)",
    "space_read_weak": "Space::read of 1 KiB, weak (the primary)",
    "space_read_strong": "Space::read strong + finish (lock taken and released)",
    "remote_read_weak": "Remote::read of 1 KiB over the RPC socket (a secondary) + finish",
    "redis_get": "redis GET of 1 KiB (redis crate, one connection, TCP loopback)",
    "redis_set": "redis SET of 1 KiB",
}
table(["operation", "p50", "p99", "mean", "runs"],
      [[what.get(k, k), f"{v['p50_us']:.2f}", f"{v['p99_us']:.2f}", f"{v['mean_us']:.2f}", v["runs"]]
       for k, v in micro.items()])

news = [r for r in cold if r["kind"] == "new_session"]
secs = [r for r in cold if r["kind"] == "secondary"]
rest = [r for r in cold if r["kind"] == "restore"]
ckpt = [r for r in cold if r["kind"] == "checkpoint"]
sec_init = [x for r in secs for x in r["init_ms"]]
sec_req = [x for r in secs for x in r["cold_request_ms"]]
fork = micro["run_no_state"]["p50_us"]
p("Cold starts (ms, p50 over the repetitions; XFaaS Table 2 for reference):")
p()
table(["start", "skiff end to end", "skiff init_ms (record)", "n", "XFaaS"], [
    ["a new instance in a warm worker", f"{fork / 1e3:.3f} (in the worker)", "-",
     micro["run_no_state"]["runs"], "1.98 (fork)"],
    ["a secondary worker (CopySession)",
     f"{median(sec_req):.2f} (the request that started it)" if sec_req else "-",
     f"{median(sec_init):.2f}", len(sec_init), "263"],
    ["a new session (ColdSession, empty)", f"{median([r['ms'] for r in news]):.2f}",
     f"{median([r['init_ms'] for r in news]):.2f}", len(news), "268"],
    [f"a restore from a {rest[0]['disk_bytes'] / 2**20:.2f} MiB checkpoint" if rest else "a restore",
     f"{median([r['ms'] for r in rest]):.2f}", f"{median([r['init_ms'] for r in rest]):.2f}",
     len(rest), "268 (1 MB)"],
])
def ms_list(xs):
    return ", ".join("%.1f" % x for x in xs)


if news:
    p("New session, all runs (ms end to end): " + ms_list(r["ms"] for r in news)
      + "; init_ms: " + ms_list(r["init_ms"] for r in news))
if sec_init:
    p("Secondary workers' init_ms, all: " + ms_list(sec_init))
if rest:
    p("Restore, all runs (ms end to end): " + ms_list(r["ms"] for r in rest)
      + "; init_ms: " + ms_list(r["init_ms"] for r in rest)
      + "; close took p50 %.1f ms; the checkpoint of %d bytes took %.1f ms (POST .../checkpoint)"
      % (median([r["close_ms"] for r in rest]), ckpt[0]["disk_bytes"], ckpt[0]["ms"]))
p()

lin_s, lin_r = loop.get(("kv-session", "linear", 40)), loop.get(("kv-redis", "linear", 40))
targets = [
    ("a new instance, WASI context included (p50, in the worker)", "<= 50 µs",
     f"{fork:.1f} µs", fork <= 50),
    ("a state read in the primary (Space::read 1 KiB, p50)", "<= 2 µs",
     f"{micro['space_read_weak']['p50_us']:.2f} µs", micro["space_read_weak"]["p50_us"] <= 2),
]
if lin_s and lin_r:
    ratio = lin_s["rps"] / lin_r["rps"]
    targets.append(("RMW-Linear throughput at 40 clients, skiff / redis", ">= 3x",
                    f"{ratio:.2f}x ({lin_s['rps']:.0f} vs {lin_r['rps']:.0f} req/s)", ratio >= 3))
if news:
    m = median([r["ms"] for r in news])
    targets.append(("a new session (end to end, p50)", "<= 10 ms", f"{m:.2f} ms", m <= 10))
if rest:
    m = median([r["ms"] for r in rest])
    targets.append(("a restore from a 1 MB checkpoint (end to end, p50)", "<= 20 ms", f"{m:.2f} ms", m <= 20))
table(["target", "goal", "measured", ""],
      [[t, g, m, "PASS" if ok else "MISS"] for t, g, m, ok in targets])

text = "\n".join(md)
print(text)
with open(f"{out}/sessions.md", "w") as f:
    f.write(text + "\n")

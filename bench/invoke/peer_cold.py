"""Cold-start peers, timed the same way (spawn to exit of a process that starts the
interpreter and imports what skiff's bootstrap imports): the bare interpreters (no
isolation), and runc starting python in a container on the same root. Prints JSON lines.
Usage: peer_cold.py N PYTHON_ROOT BUNDLE RUNC NODE_ROOT"""
import json
import subprocess
import sys
import time


def time_peer(label, argv, n, warmup):
    """Prints the JSON line of `n` runs of `argv`, spawn to exit, after `warmup` untimed."""
    samples = []
    for i in range(n + warmup):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        if i >= warmup:
            samples.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"label": label, "ms": samples}), flush=True)


if __name__ == "__main__":
    n, root, bundle, runc, node_root = sys.argv[1:6]
    CODE = "import io, os, select, struct, sys, time, _json"
    bare = [f"{root}/usr/bin/python3.11", "-I", "-S", "-c", CODE]
    node = [f"{node_root}/usr/bin/node", "-e", "require('net'); require('path'); require('async_hooks')"]
    for label, argv in [("python3 bare process", bare), ("node bare process", node),
                        ("python3 in runc", [runc, "run", "--bundle", bundle, "skiff-bench-cold"])]:
        time_peer(label, argv, int(n), 3)

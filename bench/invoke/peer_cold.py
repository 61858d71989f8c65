"""Cold-start peers, timed the same way (spawn to exit of a process that starts the
interpreter and imports what skiff's bootstrap imports): the bare interpreters (no
isolation), and runc starting python in a container on the same root. Prints JSON lines.
Usage: peer_cold.py N PYTHON_ROOT BUNDLE RUNC NODE_ROOT"""
import json
import subprocess
import sys
import time

n, root, bundle, runc, node_root = sys.argv[1:6]
n = int(n)
CODE = "import io, os, select, struct, sys, time, _json"
bare = [f"{root}/usr/bin/python3.11", "-I", "-S", "-c", CODE]
node = [f"{node_root}/usr/bin/node", "-e", "require('net'); require('path'); require('async_hooks')"]
for label, argv in [("python3 bare process", bare), ("node bare process", node),
                    ("python3 in runc", [runc, "run", "--bundle", bundle, "skiff-bench-cold"])]:
    samples = []
    for i in range(n + 3):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        if i >= 3:
            samples.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"label": label, "ms": samples}), flush=True)

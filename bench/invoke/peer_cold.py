"""Cold-start peers, timed the same way (spawn to exit of a process that starts the
interpreter and imports what skiff's bootstrap imports): the bare interpreter (no
isolation), and runc starting it in a container on the same root. Prints JSON lines.
Usage: peer_cold.py N ROOT BUNDLE RUNC"""
import json
import subprocess
import sys
import time

n, root, bundle, runc = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
CODE = "import io, json, os, socket, struct, sys, threading, time, traceback"
bare = [f"{root}/usr/bin/python3.11", "-I", "-S", "-c", CODE]
for label, argv in [("python3 bare process", bare),
                    ("python3 in runc", [runc, "run", "--bundle", bundle, "skiff-bench-cold"])]:
    samples = []
    for i in range(n + 3):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        if i >= 3:
            samples.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"label": label, "ms": samples}), flush=True)

"""Cold-start peers of a function that imports numpy and pandas, timed as peer_cold.py
times its own (spawn to exit): the interpreter of the function's environment importing
them bare (no isolation), and runc starting the same in a container on that root.
Prints JSON lines. Usage: peer_heavy.py N ROOT BUNDLE RUNC"""
import json
import subprocess
import sys
import time

n, root, bundle, runc = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
CODE = f"import sys; sys.path.append({root!r} + '/usr/lib/python3/dist-packages'); import numpy, pandas"
bare = [f"{root}/usr/bin/python3.11", "-I", "-S", "-c", CODE]
for label, argv in [("numpy+pandas: python3 bare process", bare),
                    ("numpy+pandas: python3 in runc", [runc, "run", "--bundle", bundle, "skiff-bench-heavy"])]:
    samples = []
    for i in range(n + 2):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        if i >= 2:
            samples.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"label": label, "ms": samples}), flush=True)

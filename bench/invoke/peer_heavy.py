"""Cold-start peers of a function that imports numpy and pandas, timed as peer_cold.py
times its own (spawn to exit): the interpreter of the function's environment importing
them bare (no isolation), and runc starting the same in a container on that root.
Prints JSON lines. Usage: peer_heavy.py N ROOT BUNDLE RUNC"""
import sys

from peer_cold import time_peer

n, root, bundle, runc = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
CODE = f"import sys; sys.path.append({root!r} + '/usr/lib/python3/dist-packages'); import numpy, pandas"
time_peer("numpy+pandas: python3 bare process", [f"{root}/usr/bin/python3.11", "-I", "-S", "-c", CODE], n, 2)
time_peer("numpy+pandas: python3 in runc", [runc, "run", "--bundle", bundle, "skiff-bench-heavy"], n, 2)

# Prints, then dies the way the path asks: past its timeout, out of memory, by os._exit,
# or by a signal (a real segfault: PID 1 of its namespace ignores a kill it sends itself).
import ctypes
import os
import sys
import time


def handle(event, context):
    case = context.path.strip("/")
    print(f"py-dying before {case}")
    print(f"py-dying to stderr before {case}", file=sys.stderr)
    if case == "timeout":
        time.sleep(30)
    elif case == "oom":
        hog = []
        while True:
            hog.append(bytearray(8 << 20))
    elif case == "exit":
        os._exit(3)
    elif case == "signal":
        ctypes.string_at(0)
    return "survived"

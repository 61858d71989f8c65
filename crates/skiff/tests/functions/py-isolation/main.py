# One function that misbehaves in whatever way the path asks for. Each instance answers
# with its own token, so a test can tell a fresh instance from the one before.
import os
import time

INSTANCE = os.urandom(8).hex()


def handle(event, context):
    if context.path == "/crash":
        os._exit(3)
    if context.path == "/hang":
        time.sleep(30)
    if context.path == "/oom":
        hog = []
        while True:
            hog.append(bytearray(8 << 20))
    if context.path == "/flood":
        for i in range(100_000):
            print(f"flood line {i}")
        return "flooded"
    if context.path == "/raise":
        raise ValueError("raised on purpose")
    return f"ok {INSTANCE}"

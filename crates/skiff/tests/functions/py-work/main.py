# Sleeps for the milliseconds the query asks (sleep=N), then answers with the body.
import time
from urllib.parse import parse_qs


def handle(event, context):
    ms = int(parse_qs(context.query).get("sleep", ["0"])[0])
    time.sleep(ms / 1000)
    print(f"py-work slept {ms} ms")
    return {"echo": event, "slept_ms": ms}

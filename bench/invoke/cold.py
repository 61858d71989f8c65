"""Cold starts end to end: scale a function to zero (DELETE /v1/functions/NAME/instances),
then time one invocation, HTTP request out to response in, with a real HTTP client over
TCP; checks the response says it was a cold start. Prints one JSON line.
Usage: cold.py PORT FUNCTION LABEL N"""
import http.client
import json
import sys
import time

port, function, label, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])


def call(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.connect()
    start = time.perf_counter()
    c.request(method, path, body=body)
    r = c.getresponse()
    data = r.read()
    took = time.perf_counter() - start
    c.close()
    return r, data, took


samples, init = [], []
for i in range(n + 3):
    call("DELETE", f"/v1/functions/{function}/instances")
    r, data, took = call("POST", f"/fn/{function}", b"{}")
    if r.status != 200 or r.getheader("x-skiff-cold-start") != "true":
        sys.exit(f"{label}: call {i} answered {r.status} cold={r.getheader('x-skiff-cold-start')}: {data[:200]!r}")
    if i < 3:  # warm-up: the first start of a runtime also starts its template
        continue
    samples.append(took * 1e3)
    _, record, _ = call("GET", f"/v1/invocations/{r.getheader('x-skiff-invocation-id')}")
    init.append(json.loads(record)["init_ms"])
print(json.dumps({"label": label, "function": function, "ms": samples, "init_ms": init}))

"""The session benchmark's end-to-end cold starts, through the daemon's Unix socket:
  new_session:  the first request with a fresh x-session value (a new primary worker, an
                empty state): its latency and its invocation record's init_ms;
  secondary:    a session of kv-sec (max_concurrency 1): one request starts the primary,
                then a burst of concurrent ones forces secondaries; their init_ms is read
                from /v1/instances (the instances that appeared during the burst);
  restore:      kv-restore's session holding 1024 keys x 1 KiB: checkpoint, close (its
                workers end), then the next request restores it; its latency and init_ms.
Usage: python3 cold.py SOCKET REPS   (prints one JSON line per measurement)
"""
import http.client
import json
import socket
import sys
import threading
import time
import uuid


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("skiff", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


SOCK = sys.argv[1]
REPS = int(sys.argv[2])


def call(method, path, body=None, headers=None, conn=None):
    """(status, headers, body, ms); a fresh connection unless one is given."""
    c = conn or UnixHTTP(SOCK)
    t = time.perf_counter()
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t) * 1e3
    if conn is None:
        c.close()
    return r.status, dict(r.getheaders()), data, ms


def get_json(path):
    status, _, body, _ = call("GET", path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def record(headers):
    return get_json("/v1/invocations/" + headers["x-skiff-invocation-id"])


def invoke(fn, body, key, conn=None):
    status, headers, data, ms = call("POST", "/fn/" + fn, body.encode(), {"x-session": key}, conn)
    assert status == 200 and not data.startswith(b"error"), (fn, body, status, data)
    return headers, data, ms


def session_id(fn):
    ids = [s["id"] for s in get_json("/v1/sessions") if s["function"] == fn]
    assert len(ids) == 1, (fn, ids)
    return ids[0]


def emit(kind, **fields):
    print(json.dumps({"kind": kind, **fields}), flush=True)


def new_sessions():
    for i in range(REPS):
        key = "new-" + uuid.uuid4().hex
        # A persistent connection is open already: the time is the daemon's and the worker's.
        conn = UnixHTTP(SOCK)
        conn.connect()
        headers, data, ms = invoke("kv-session", "ro k", key, conn)
        conn.close()
        rec = record(headers)
        emit("new_session", ms=ms, init_ms=rec["init_ms"], cold_start=rec["cold_start"])
        time.sleep(0.1)


def secondaries():
    seen = {i["id"] for i in get_json("/v1/instances")}
    for i in range(REPS):
        key = "sec-" + uuid.uuid4().hex
        invoke("kv-sec", "seed k", key)  # the primary
        primary = {i["id"] for i in get_json("/v1/instances")} - seen
        seen |= primary
        # 4 clients at once, 5 requests each: with max_concurrency 1, up to 3 secondaries.
        cold = []

        def client():
            c = UnixHTTP(SOCK)
            for _ in range(5):
                h, _, ms = invoke("kv-sec", "rmw k", key, c)
                if h.get("x-skiff-cold-start") == "true":
                    cold.append(ms)
            c.close()

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        new = [i for i in get_json("/v1/instances") if i["id"] not in seen and i["function"] == "kv-sec"]
        seen |= {i["id"] for i in new}
        emit("secondary", init_ms=[i["init_ms"] for i in new], cold_request_ms=cold)
        # End this session's workers so the next repetition starts from none.
        status, _, body, _ = call("DELETE", "/v1/sessions/" + session_id("kv-sec"))
        assert status == 204, (status, body)


def restore():
    key = "restore"
    c = UnixHTTP(SOCK)
    for k in range(1024):
        invoke("kv-restore", "seed k%04d" % k, key, c)
    c.close()
    sid = session_id("kv-restore")
    status, _, body, ms = call("POST", "/v1/sessions/%s/checkpoint" % sid)
    assert status == 200, (status, body)
    disk = [s["disk_bytes"] for s in get_json("/v1/sessions") if s["id"] == sid][0]
    emit("checkpoint", ms=ms, disk_bytes=disk)
    for i in range(REPS):
        status, _, body, close_ms = call("POST", "/v1/sessions/%s/close" % sid)
        assert status == 204, (status, body)
        time.sleep(0.2)
        conn = UnixHTTP(SOCK)
        conn.connect()
        headers, data, ms = invoke("kv-restore", "ro k%04d" % (i * 97 % 1024), key, conn)
        conn.close()
        assert data == b"1024", data  # the value came back from the checkpoint
        rec = record(headers)
        emit("restore", ms=ms, init_ms=rec["init_ms"], cold_start=rec["cold_start"],
             close_ms=close_ms, disk_bytes=disk)


new_sessions()
secondaries()
restore()

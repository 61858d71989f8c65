# skiff's python3 bootstrap: imports the handler once, then serves invocations over
# the framed channel on fd 0 (frame: u32 meta length, u32 body length, JSON meta, body).
import io, json, os, socket, struct, sys, threading, time, traceback
sys.path[:0] = ["/code"]
sys.path.append("/usr/lib/python3/dist-packages")
HEAD = struct.Struct(">II")
chan = socket.socket(fileno=os.dup(0))
_null = os.open("/dev/null", os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
reader = chan.makefile("rb")
send_lock = threading.Lock()
current = threading.local()


def send(meta, body=b""):
    meta = json.dumps(meta, separators=(",", ":")).encode()
    with send_lock:
        chan.sendall(HEAD.pack(len(meta), len(body)) + meta + body)


class Capture(io.TextIOBase):
    """print() inside a handler: whole lines, sent as log frames of the invocation."""

    def __init__(self, stream):
        self.stream = stream

    def writable(self):
        return True

    def write(self, text):
        # Whole lines, sent in batches: one frame per print() would cost more than it.
        pending = getattr(current, self.stream, "") + text
        if len(pending) < 4096:
            setattr(current, self.stream, pending)
        else:
            lines, nl, rest = pending.rpartition("\n")
            setattr(current, self.stream, rest)
            self.emit(lines + nl)
        return len(text)

    def flush(self):
        rest = getattr(current, self.stream, "")
        if rest:
            setattr(current, self.stream, "")
            self.emit(rest)

    def emit(self, text):
        send({"t": "log", "id": getattr(current, "id", None), "stream": self.stream},
             text.encode("utf-8", "replace"))


class Context:
    __slots__ = ("request_id", "function_name", "method", "path", "query", "headers", "deadline")

    def remaining_ms(self):
        return max(0, int((self.deadline - time.time()) * 1000))


def event_of(body):
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        try:
            return body.decode()
        except UnicodeDecodeError:
            return body


def user_traceback():
    """The traceback from the first frame that is not the bootstrap's or importlib's."""
    kind, error, tb = sys.exc_info()
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name == "<string>" or name.startswith("<frozen") or "/importlib/" in name):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(kind, error, tb))


def encode(result):
    """(status, headers, body) for what a handler returned."""
    if result is None:
        return 200, {}, b""
    if isinstance(result, (bytes, bytearray)):
        return 200, {"content-type": "application/octet-stream"}, bytes(result)
    if isinstance(result, str):
        return 200, {"content-type": "text/plain; charset=utf-8"}, result.encode()
    if isinstance(result, dict) and "statusCode" in result:
        headers = {str(k).lower(): str(v) for k, v in (result.get("headers") or {}).items()}
        _, inner, body = encode(result.get("body"))
        for k, v in inner.items():
            headers.setdefault(k, v)
        return int(result["statusCode"]), headers, body
    return 200, {"content-type": "application/json"}, json.dumps(result).encode()


def serve(meta, body):
    current.id = meta["id"]
    ctx = Context()
    ctx.request_id = meta["request_id"]
    ctx.function_name = FUNCTION
    ctx.method = meta["method"]
    ctx.path = meta["path"]
    ctx.query = meta["query"]
    ctx.headers = meta["headers"]
    ctx.deadline = time.time() + meta["timeout_ms"] / 1000
    try:
        status, headers, out = encode(handle(event_of(body), ctx))
        reply = {"t": "result", "id": meta["id"], "status": status, "headers": headers}
    except BaseException:
        out = user_traceback().encode()
        reply = {"t": "error", "id": meta["id"]}
    sys.stdout.flush()
    sys.stderr.flush()
    current.id = None
    send(reply, out)


def read_exact(n):
    data = reader.read(n)
    if len(data) < n:
        os._exit(0)
    return data


FUNCTION = os.environ.get("SKIFF_FUNCTION", "")
module_name, _, attr = sys.argv[1].rpartition(".")
concurrency = int(sys.argv[2])
try:
    import importlib

    handle = getattr(importlib.import_module(module_name), attr)
except BaseException:
    send({"t": "init_error"}, user_traceback().encode())
    sys.exit(1)
sys.stdout = Capture("stdout")
sys.stderr = Capture("stderr")
send({"t": "ready"})
while True:
    meta_len, body_len = HEAD.unpack(read_exact(HEAD.size))
    meta = json.loads(read_exact(meta_len))
    body = read_exact(body_len)
    if concurrency == 1:
        serve(meta, body)
    else:
        threading.Thread(target=serve, args=(meta, body), daemon=True).start()

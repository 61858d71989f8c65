# skiff's python3 bootstrap. As an instance (argv: HANDLER CONCURRENCY) it imports the
# handler once, then serves invocations over the framed channel on fd 0 (frame: u32
# meta length, u32 body length, JSON meta, body). As a template (argv: --template) it
# forks spare children on request on fd 0, each of which becomes an instance from the
# plan the daemon sends it (see template()).
# Only what every instance needs is imported up front (a plain cold start pays for each
# module): socket, threading and traceback come when used.
import io, os, select, struct, sys, time, _json
HEAD = struct.Struct(">II")
WHITESPACE = " \t\n\r"

# JSON through the json module's C half alone: `import json` costs a plain start ~12 ms
# here, nearly all of it re and enum, which its pure-python half needs and we do not.


class Decoding:
    """What json's C scanner reads from a decoder: the json module's defaults."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def not_serializable(value):
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


scan = _json.make_scanner(Decoding)


def json_loads(data):
    """json.loads(data) for bytes. What the scanner alone would not read exactly as json
    does (a BOM, UTF-16 or -32, no value, trailing data) goes to json itself, which
    answers or raises as it always does."""
    if data[:3] != b"\xef\xbb\xbf" and b"\0" not in data[:4]:
        text = data.decode("utf-8", "surrogatepass")
        try:
            value, end = scan(text, len(text) - len(text.lstrip(WHITESPACE)))
            if not text[end:].strip(WHITESPACE):
                return value
        except StopIteration:
            pass
    import json

    return json.loads(data)


def json_dumps(value, separators=(", ", ": ")):
    """json.dumps(value, separators=separators)."""
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    item, key = separators
    # A fresh encoder each time, as json makes one: its record of the containers being
    # encoded (for cycles) keeps what an error interrupted.
    encode = _json.make_encoder({}, not_serializable, _json.encode_basestring_ascii, None, key, item, False, False, True)
    return "".join(encode(value, 0))


class Unshared:
    """Per-invocation state and a no-op lock while invocations run one at a time."""

    id = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


send_lock = current = Unshared()
chan = waiter = handle = None
inbox = bytearray()  # what came on the channel and is not read yet
FUNCTION = ""


def attach(fd):
    """The channel is fd; stdin becomes /dev/null."""
    global chan, waiter
    chan = fd
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def send(meta, body=b""):
    meta = json_dumps(meta, (",", ":")).encode()
    frame = memoryview(HEAD.pack(len(meta), len(body)) + meta + body)
    with send_lock:
        while frame:
            frame = frame[os.write(chan, frame):]


class Capture(io.TextIOBase):
    """print() inside a handler: whole lines, sent as log frames of the invocation."""

    def __init__(self, stream):
        self.stream = stream

    def writable(self):
        return True

    def write(self, text):
        # Each line leaves when it ends (a print's text and its newline are two writes):
        # what a handler printed before it hangs or is killed is already ours.
        pending = getattr(current, self.stream, "") + text
        if "\n" in text:
            lines, nl, rest = pending.rpartition("\n")
            setattr(current, self.stream, rest)
            self.emit(lines + nl)
        elif len(pending) < 4096:
            setattr(current, self.stream, pending)
        else:
            setattr(current, self.stream, "")
            self.emit(pending)
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
        return json_loads(body)
    except ValueError:
        try:
            return body.decode()
        except UnicodeDecodeError:
            return body


def user_traceback():
    """The traceback from the first frame that is not the bootstrap's or importlib's."""
    import traceback

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
    return 200, {"content-type": "application/json"}, json_dumps(result).encode()


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
    """n bytes from the channel. It sleeps in poll, not in read: a reader asleep in read
    is woken each time the daemon takes a reply off the socket (the kernel wakes the
    sender's waiters when its buffer frees), a context switch more per call."""
    while len(inbox) < n:
        waiter.poll()
        data = os.read(chan, 1 << 16)
        if not data:
            os._exit(0)
        inbox.extend(data)
    data = bytes(inbox[:n])
    del inbox[:n]
    return data


def run(spec, concurrency):
    """Imports the handler `module.function`, then serves until the channel closes."""
    global handle, FUNCTION, send_lock, current
    FUNCTION = os.environ.get("SKIFF_FUNCTION", "")
    if concurrency > 1:
        import threading

        send_lock, current = threading.Lock(), threading.local()
    sys.path[:0] = ["/code"]
    sys.path.append("/usr/lib/python3/dist-packages")
    module_name, _, attr = spec.rpartition(".")
    try:
        import importlib

        handle = getattr(importlib.import_module(module_name), attr)
    except BaseException:
        send({"t": "init_error"}, user_traceback().encode())
        os._exit(1)
    sys.stdout = Capture("stdout")
    sys.stderr = Capture("stderr")
    send({"t": "ready"})
    while True:
        meta_len, body_len = HEAD.unpack(read_exact(HEAD.size))
        meta = json_loads(read_exact(meta_len))
        body = read_exact(body_len)
        if concurrency == 1:
            serve(meta, body)
        else:
            threading.Thread(target=serve, args=(meta, body), daemon=True).start()


def preload(spec):
    """Imports what the handler's module imports from outside /code (its packages and the
    standard library), as SOCK's import cache does; the function's own modules, whose
    top-level code may open connections or draw random numbers, are left to each
    instance. A module that fails here is left to fail in the instance, with its
    traceback."""
    import ast, importlib

    module = spec.rpartition(".")[0]
    base = "/code/" + module.replace(".", "/")
    source = next((p for p in (base + ".py", base + "/__init__.py") if os.path.isfile(p)), None)
    if source is None:
        return
    with open(source, "rb") as f:
        tree = ast.parse(f.read(), source)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    for name in names:
        top = name.partition(".")[0]
        if os.path.exists(f"/code/{top}.py") or os.path.isdir(f"/code/{top}"):
            continue
        try:
            importlib.import_module(name)
        except BaseException:
            pass


def function_template(spec, concurrency):
    """A function's own template: a sandbox of that function (its root, limits, seccomp,
    no capabilities) that has imported what its handler imports, and forks instances of
    that function alone on request. Each request on the channel carries an instance's
    channel and log pipe; the answer carries the child's pidfd. The child waits for one
    byte on its channel, sent once the daemon has moved it into its own cgroup."""
    import gc, signal, socket

    path = list(sys.path)
    sys.path[:0] = ["/code"]
    sys.path.append("/usr/lib/python3/dist-packages")
    preload(spec)
    sys.path[:] = path
    # It is its forks' parent and their namespace's init: it reaps them (and what they
    # leave behind) and keeps the latest statuses for the daemon to ask about.
    exits = {}

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exits[pid] = status
            if len(exits) > 1024:
                exits.pop(next(iter(exits)))

    signal.signal(signal.SIGCHLD, reap)
    control = socket.socket(fileno=chan)
    send({"t": "ready"})
    gc.collect()
    gc.freeze()
    while True:
        msg, fds, _, _ = socket.recv_fds(control, 64, 2)
        if not msg:
            os._exit(0)
        if msg.startswith(b"exit "):
            reap()
            status = exits.pop(int(msg[5:]), None)
            answer = {}
            if status is not None:
                code = os.waitstatus_to_exitcode(status)
                answer = {"code": code} if code >= 0 else {"signal": -code}
            control.send(json_dumps(answer).encode())
            continue
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            control.send(json_dumps({"error": str(e)}).encode())
            continue
        if pid == 0:
            control.detach()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            forked(fds, spec, concurrency)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(control, [json_dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)


def forked(fds, spec, concurrency):
    """A function template's child: its channel and log, nothing else of the template's,
    then an instance once the daemon says its cgroup is ready."""
    channel, log = fds
    os.dup2(log, 1)
    os.dup2(log, 2)
    keep = os.dup(channel)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    if "numpy.random" in sys.modules:
        # numpy seeds its global generator once, at import: each fork draws its own.
        sys.modules["numpy.random"].seed()
    if not os.read(keep, 1):
        os._exit(0)
    attach(keep)
    del sys.argv[3:]
    run(spec, concurrency)


def template(entry_path):
    """The zygote: an interpreter with this bootstrap loaded, as root in the host's
    namespaces. For each request on the control socket (fd 0) it clones a spare child
    into new namespaces and hands the daemon its pidfd and plan socket; the child takes
    the plan the daemon sends (JSON, the descriptors beside it) and builds its sandbox
    with skiff's sandbox entry (the shared object at entry_path, the native spawner's own
    code: crates/sandbox/src/entry.c), then becomes an instance, skipping the
    interpreter's start."""
    # The template runs in its runtime layer's tree, as a sandbox (see View in
    # crates/sandbox/src/template.rs): what it imports has the paths an instance's has.
    import ctypes, importlib, socket, threading, traceback

    libc = ctypes.CDLL(None, use_errno=True)
    # clone3 through PyDLL: the GIL stays held, so the child's copy of it is consistent.
    raw = ctypes.PyDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    entry = ctypes.CDLL(entry_path)
    control = socket.socket(fileno=os.dup(0))
    attach_null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(attach_null, 0)
    os.close(attach_null)

    def check(result, what):
        if result < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")
        return result

    # The entry's structs (crates/sandbox/src/entry.h).
    C, I, U, U64, V = ctypes.c_char_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    Names = ctypes.POINTER(C)

    class Prep(ctypes.Structure):
        _fields_ = [("masked_files", Names), ("masked_dirs", Names), ("readonly", Names),
                    ("mask_options", C), ("last_cap", U), ("leave_chroot", I)]

    class Plan(ctypes.Structure):
        _fields_ = [("root", C), ("dev_template", C), ("shm_options", C), ("tmp_options", C),
                    ("tmpfs", Names), ("work", C), ("hostname", C), ("cwd", C),
                    ("joins", ctypes.POINTER(I)), ("n_joins", U), ("cgroup", I), ("netns", I),
                    ("user_ns_sock", I), ("uid", U), ("gid", U), ("max_open_files", U64),
                    ("securebits", U64), ("die_with_parent", I), ("parent_sock", I),
                    ("stdio", I * 3), ("channel", I), ("close_rest", I), ("before_lock", V),
                    ("before_lock_arg", V), ("seccomp", C), ("seccomp_len", U)]

    class Failure(ctypes.Structure):
        _fields_ = [("stage", I), ("index", I), ("error", I)]

    entry.skiff_plan_size.restype = ctypes.c_size_t
    entry.skiff_describe.argtypes = [V, V, V, C, ctypes.c_size_t]
    if entry.skiff_plan_size() != ctypes.sizeof(Plan):
        raise SystemExit(f"{entry_path}: its struct skiff_plan is not this bootstrap's")

    def failed_step(failure, prep=None, plan=None):
        """OSError("what: reason") for a failed step of the entry."""
        text = ctypes.create_string_buffer(512)
        entry.skiff_describe(prep, plan, ctypes.byref(failure), text, len(text))
        reason = os.strerror(failure.error) if failure.error else "bad plan"
        return OSError(failure.error, f"{text.value.decode()}: {reason}")

    def names(items):
        return (C * (len(items) + 1))(*(n.encode() for n in items), None)

    def prepared(prep):
        """The daemon's `prepare` as the entry's skiff_prep, made once."""
        return Prep(names(prep["masked_files"]), names(prep["masked_dirs"]), names(prep["readonly"]),
                    prep["mask_options"].encode(), prep["last_cap"], 1)

    def enter(plan, fds):
        """In the child: the sandbox the plan describes, by the sandbox entry; returns the
        channel's descriptor."""
        it = iter(fds[3:])
        clone_into = next(it) if plan["clone_into"] else -1
        joins = [next(it) for _ in range(plan["joins"])]
        netns = next(it) if plan["netns"] else -1
        program = bytes.fromhex(plan["seccomp"])
        c = Plan(
            root=plan["rootfs"].encode(), dev_template=plan["dev_template"].encode(),
            shm_options=plan["shm_options"].encode(), tmp_options=plan["tmp_options"].encode(),
            hostname=plan["hostname"].encode(), cwd=plan["cwd"].encode(),
            joins=(I * len(joins))(*joins), n_joins=len(joins), cgroup=clone_into, netns=netns,
            user_ns_sock=-1, uid=plan["uid"], gid=plan["gid"], max_open_files=plan["max_open_files"],
            securebits=plan["secure_bits"], die_with_parent=1, parent_sock=-1,
            # The channel kept, the log pipe as stdout and stderr, nothing else of the zygote's.
            stdio=(I * 3)(-1, fds[1], fds[2]), channel=fds[0], close_rest=1,
            seccomp=program, seccomp_len=len(program) // 8)
        failure = Failure()
        keep = entry.skiff_enter(ctypes.byref(c), ctypes.byref(failure))
        if keep < 0:
            raise failed_step(failure, plan=ctypes.byref(c))
        os.environ.clear()
        for pair in plan["env"]:
            k, _, v = pair.partition("=")
            os.environ[k] = v
        return keep

    def become(plan_bytes, fds, unprepared):
        """In a spare child: build the sandbox from the plan (on top of its preparation,
        which failed if `unprepared` says why), then serve as an instance."""
        try:
            if unprepared:
                raise OSError(unprepared)
            plan = json_loads(plan_bytes)
            keep = enter(plan, fds)
        except BaseException as e:
            msg = json_dumps({"t": "init_error"}).encode()
            body = f"cannot set up the sandbox: {e}".encode()
            os.write(fds[0], HEAD.pack(len(msg), len(body)) + msg + body)
            os._exit(125)
        attach(keep)
        # The command line a plain start has.
        sys.argv[1:] = [plan["handler"], str(plan["concurrency"])]
        if plan.get("function_template"):
            function_template(plan["handler"], plan["concurrency"])
        run(plan["handler"], plan["concurrency"])

    def rehearse():
        """In a spare, while it waits: what every start does that needs no plan. Each object
        it touches sits on a page the spare shares with the template, copied on first
        write (a reference count will do): copied now, not on the start's path. From plan
        to first reply: 412 -> 264 page faults, for 158 more while waiting."""
        json_loads(json_dumps({"env": ["A=B"], "seccomp": "00" * 64, "uid": 1, "readonly": ["x"]}).encode())
        ctx = Context()
        ctx.deadline = time.time()
        encode(None), encode("ok"), encode({"a": [1]}), encode({"statusCode": 200, "body": "x"})
        json_dumps({"t": "result", "id": 1, "status": 200, "headers": {}}, (",", ":"))
        bytes.fromhex("00" * 64)
        Plan(root=b"/", stdio=(ctypes.c_int32 * 3)(-1, 1, 2), seccomp=b"\0" * 8), Failure()
        entry.skiff_enter, entry.skiff_describe

    # The pages an instance's start touched, learnt by the daemon from one of them: each
    # spare populates them while it waits.
    lesson = b""
    # The steps of a start that need no plan, the daemon's `prepare`, as a skiff_prep.
    preparation = None

    def populate():
        """(start, length, advice) triples from the daemon (crates/sandbox/src/lesson.rs):
        only the two populate advices are taken; a range this process lacks fails
        harmlessly and is skipped."""
        for start, length, advice in struct.iter_unpack("<QQQ", lesson):
            if advice in (22, 23):  # MADV_POPULATE_READ, MADV_POPULATE_WRITE
                libc.madvise(start, length, advice)

    def spare():
        """Forks a child ahead of need (a start then skips the fork, ~1 ms here): it
        waits in its new namespaces, as the daemon's child, for the plan it will
        become. Returns its pid, pidfd and the socket to send the plan on."""
        # Everything alive now is the template's: the collector leaves it alone in the
        # child, so it does not copy every page it would otherwise touch.
        gc.freeze()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # CLONE_NEWNS|NEWUTS|NEWIPC|NEWPID|PIDFD|PARENT: the child is the daemon's.
        args = (ctypes.c_uint64 * 11)()
        pidfd = ctypes.c_int(-1)
        args[0] = 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x00001000 | 0x00008000
        args[1] = ctypes.addressof(pidfd)
        pid = raw.syscall(435, args, ctypes.sizeof(args))  # SYS_clone3
        if pid < 0:
            check(-1, "clone3")
        if pid == 0:
            # What os.fork does in a child (clone3 skips it): the interpreter's own state
            # and the at-fork hooks, which reseed `random` among others.
            ctypes.pythonapi.PyOS_AfterFork_Child()
            ours.close()
            control.close()
            unprepared = None if preparation else "the template was not prepared"
            failure = Failure()
            if preparation and entry.skiff_prepare(ctypes.byref(preparation), ctypes.byref(failure)) < 0:
                unprepared = str(failed_step(failure, prep=ctypes.byref(preparation)))
            rehearse()
            populate()
            msg, fds, _, _ = socket.recv_fds(theirs, 1 << 20, 16)
            if not msg:
                os._exit(0)
            theirs.close()
            become(msg, fds, unprepared)
        theirs.close()
        return pid, pidfd.value, ours

    import gc

    control.send(b"ready")
    # Each request is for one spare, handed over with its pidfd and plan socket: the
    # daemon sends the plan to the spare itself.
    while True:
        request = control.recv(1 << 17)
        if not request:
            os._exit(0)
        if request.startswith(b"learn"):
            lesson = request[5:]
            continue
        if request.startswith(b"prepare"):
            preparation = prepared(json_loads(request[7:]))
            continue
        if request == b"next":
            # After a start: leave it the CPU for a while, unless a spare is wanted now.
            select.select([control], [], [], 0.005)
        try:
            pid, pidfd, sock = spare()
            try:
                socket.send_fds(control, [json_dumps({"pid": pid}).encode()], [pidfd, sock.fileno()])
            finally:
                os.close(pidfd)
                sock.close()
        except Exception as e:
            control.send(json_dumps({"error": str(e)}).encode())


if sys.argv[1] == "--template":
    template(sys.argv[2])
elif sys.argv[3:] == ["--function-template"]:
    attach(os.dup(0))
    function_template(sys.argv[1], int(sys.argv[2]))
else:
    attach(os.dup(0))
    run(sys.argv[1], int(sys.argv[2]))

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


def template():
    """The zygote: an interpreter with this bootstrap loaded, as root in the host's
    namespaces. For each request on the control socket (fd 0) it clones a spare child
    into new namespaces and hands the daemon its pidfd and plan socket; the child takes
    the plan the daemon sends (JSON, the descriptors beside it), joins its cgroup, builds
    its sandbox as skiff's native spawner does, and becomes an instance, skipping the
    interpreter's start."""
    # The template runs in its runtime layer's tree, as a sandbox (see View in
    # crates/sandbox/src/template.rs): what it imports has the paths an instance's has.
    import ctypes, importlib, resource, socket, threading, traceback

    libc = ctypes.CDLL(None, use_errno=True)
    # clone3 through PyDLL: the GIL stays held, so the child's copy of it is consistent.
    raw = ctypes.PyDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    control = socket.socket(fileno=os.dup(0))
    attach_null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(attach_null, 0)
    os.close(attach_null)

    def check(result, what):
        if result < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")
        return result

    def mount(src, dst, fstype, flags, data=None):
        enc = lambda s: s.encode() if isinstance(s, str) else s
        return libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data))

    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
    ENOENT = 2

    def prepare(prep):
        """In a spare, before its plan: the steps every start shares (see Preparation in
        crates/sandbox/src/template.rs): a private mount tree, a fresh /proc at /proc with
        runc's masks (moved under the root by enter), an empty bounding set."""
        nsdx = MS_NOSUID | MS_NODEV | MS_NOEXEC
        check(mount(None, "/", None, MS_REC | MS_PRIVATE), "make / private")
        check(mount("proc", "/proc", "proc", nsdx), "mount /proc")
        for name in prep["masked_files"]:
            if mount("/dev/null", f"/proc/{name}", None, MS_BIND) < 0 and ctypes.get_errno() != ENOENT:
                check(-1, f"mask /proc/{name}")
        for name in prep["masked_dirs"]:
            if mount("tmpfs", f"/proc/{name}", "tmpfs", MS_RDONLY | nsdx, prep["mask_options"]) < 0 \
                    and ctypes.get_errno() != ENOENT:
                check(-1, f"mask /proc/{name}")
        for name in prep["readonly"]:
            path = f"/proc/{name}"
            if mount(path, path, None, MS_BIND) < 0:
                if ctypes.get_errno() == ENOENT:
                    continue
                check(-1, f"bind /proc/{name}")
            check(mount(path, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | nsdx), f"remount /proc/{name}")
        for cap in range(prep["last_cap"] + 1):
            check(libc.prctl(24, ctypes.c_ulong(cap)), "drop bounding capabilities")  # PR_CAPBSET_DROP

    def leave_view():
        """In a spare: out of the template's chroot, to the mount tree's root, where the
        plan's host paths are. A chroot into /tmp leaves the working directory outside the
        root, and from there .. climbs to the real one."""
        os.chroot("/tmp")
        while (lambda h, u: (h.st_dev, h.st_ino) != (u.st_dev, u.st_ino))(os.stat("."), os.stat("..")):
            os.chdir("..")
        os.chroot(".")

    def enter(plan, fds):
        """In the child: the steps of skiff's spawner (crates/sandbox/src/child.rs)."""
        it = iter(fds[3:])
        clone_into = next(it) if plan["clone_into"] else None
        joins = [next(it) for _ in range(plan["joins"])]
        netns = next(it) if plan["netns"] else None
        # The child was forked ahead, before its cgroup was known: it moves itself.
        if clone_into is not None:
            procs = os.open("cgroup.procs", os.O_WRONLY, dir_fd=clone_into)
            os.write(procs, b"0")
            os.close(procs)
        for fd in joins:
            os.write(fd, b"0")
        check(libc.unshare(0x02000000), "unshare cgroup namespace")  # CLONE_NEWCGROUP
        if netns is not None:
            check(libc.setns(netns, 0x40000000), "join the network namespace")
        root = plan["rootfs"]
        nsd, nsdx = MS_NOSUID | MS_NODEV, MS_NOSUID | MS_NODEV | MS_NOEXEC
        check(mount(root, root, None, MS_BIND), "bind the root")
        check(mount(root, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | nsd), "remount the root read-only")
        check(mount("/proc", root + "/proc", None, MS_MOVE), "move /proc under the root")
        check(mount(plan["dev_template"], root + "/dev", None, MS_BIND | MS_REC), "bind /dev")
        check(mount("tmpfs", root + "/dev/shm", "tmpfs", nsdx, plan["shm_options"]), "mount /dev/shm")
        check(mount("tmpfs", root + "/tmp", "tmpfs", nsd, plan["tmp_options"]), "mount /tmp")
        os.chdir(root)
        check(libc.syscall(155, b".", b"."), "pivot_root")  # SYS_pivot_root
        check(libc.umount2(b".", 2), "detach the old root")  # MNT_DETACH
        os.chdir("/")
        host = plan["hostname"].encode()
        check(libc.sethostname(host, len(host)), "sethostname")
        nofile = plan["max_open_files"]
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.setgroups([])
        check(libc.prctl(28, ctypes.c_ulong(plan["secure_bits"])), "securebits")  # PR_SET_SECUREBITS
        check(libc.prctl(47, ctypes.c_ulong(4), 0, 0, 0), "clear ambient capabilities")  # PR_CAP_AMBIENT_CLEAR_ALL
        os.setresgid(plan["gid"], plan["gid"], plan["gid"])
        os.setresuid(plan["uid"], plan["uid"], plan["uid"])
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        check(libc.syscall(126, header, data), "capset")  # SYS_capset
        os.chdir(plan["cwd"])
        check(libc.prctl(1, ctypes.c_ulong(9)), "parent-death signal")  # PR_SET_PDEATHSIG SIGKILL
        # Descriptors: the channel and the log pipe, nothing else of the zygote's.
        channel, log_out, log_err = fds[0], fds[1], fds[2]
        os.dup2(log_out, 1)
        os.dup2(log_err, 2)
        keep = os.dup(channel)
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        os.environ.clear()
        for pair in plan["env"]:
            k, _, v = pair.partition("=")
            os.environ[k] = v
        check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
        program = bytes.fromhex(plan["seccomp"])
        buf = ctypes.create_string_buffer(program, len(program))

        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        prog = Prog(len(program) // 8, ctypes.addressof(buf))
        check(libc.syscall(317, 1, 0, ctypes.byref(prog)), "seccomp")  # SECCOMP_SET_MODE_FILTER
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
        for f in (libc.mount, libc.prctl, libc.syscall, libc.unshare, libc.umount2, libc.sethostname):
            f.argtypes

    # The pages an instance's start touched, learnt by the daemon from one of them: each
    # spare populates them while it waits.
    lesson = b""
    # The steps of a start that need no plan, the daemon's `prepare`.
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
            try:
                leave_view()
                if preparation:
                    prepare(preparation)
            except Exception as e:
                unprepared = str(e) or repr(e)
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
            preparation = json_loads(request[7:])
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
    template()
elif sys.argv[3:] == ["--function-template"]:
    attach(os.dup(0))
    function_template(sys.argv[1], int(sys.argv[2]))
else:
    attach(os.dup(0))
    run(sys.argv[1], int(sys.argv[2]))

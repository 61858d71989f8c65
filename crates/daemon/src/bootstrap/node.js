// skiff's node bootstrap. As an instance (argv: HANDLER) it loads the handler once,
// then serves invocations over the framed channel on fd 0 (frame: u32 meta length, u32
// body length, JSON meta, body). As a template (argv: @template ADDON) it waits on fd 0
// for sandbox plans and forks an instance into each (see template()).
"use strict";
// One function scope: none of this (the template's native half least of all) is visible
// to a handler as a global.
(() => {
const path = require("path");
const { AsyncLocalStorage } = require("async_hooks");
const FUNCTION = process.env.SKIFF_FUNCTION || "";
const invocation = new AsyncLocalStorage();
// The template's native half (node_template.c), also in the instances it forks.
let native = null;

// A forked instance has none of node's helper threads: process.exit would wait on them.
const exit = (code) => (native ? native.exit(code) : process.exit(code));

function frame(meta, body) {
  const m = Buffer.from(JSON.stringify(meta));
  const b = body ? Buffer.from(body) : Buffer.alloc(0);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(m.length, 0);
  head.writeUInt32BE(b.length, 4);
  return Buffer.concat([head, m, b]);
}

function eventOf(body) {
  if (body.length === 0) return null;
  const text = body.toString();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function encode(result) {
  if (result === undefined || result === null) return [200, {}, Buffer.alloc(0)];
  if (Buffer.isBuffer(result) || result instanceof Uint8Array)
    return [200, { "content-type": "application/octet-stream" }, Buffer.from(result)];
  if (typeof result === "string")
    return [200, { "content-type": "text/plain; charset=utf-8" }, Buffer.from(result)];
  if (typeof result === "object" && "statusCode" in result) {
    const headers = {};
    for (const [k, v] of Object.entries(result.headers || {})) headers[k.toLowerCase()] = String(v);
    const [, inner, body] = encode(result.body);
    return [Number(result.statusCode), { ...inner, ...headers }, body];
  }
  return [200, { "content-type": "application/json" }, Buffer.from(JSON.stringify(result))];
}

// Calls `onFrame(meta, body)` for each whole frame in `buffered`; returns the rest.
function takeFrames(buffered, onFrame) {
  while (buffered.length >= 8) {
    const metaLen = buffered.readUInt32BE(0);
    const bodyLen = buffered.readUInt32BE(4);
    if (buffered.length < 8 + metaLen + bodyLen) break;
    const meta = JSON.parse(buffered.subarray(8, 8 + metaLen).toString());
    onFrame(meta, buffered.subarray(8 + metaLen, 8 + metaLen + bodyLen));
    buffered = buffered.subarray(8 + metaLen + bodyLen);
  }
  return buffered;
}

// One invocation of `handler`; the answer goes to `send(meta, body)`.
async function serve(handler, send, meta, body) {
  const context = {
    requestId: meta.request_id,
    functionName: process.env.SKIFF_FUNCTION || FUNCTION,
    method: meta.method,
    path: meta.path,
    query: meta.query,
    headers: meta.headers,
    deadline: Date.now() + meta.timeout_ms,
    remainingMs() {
      return Math.max(0, this.deadline - Date.now());
    },
  };
  try {
    const result = await invocation.run(meta.id, () => handler(eventOf(body), context));
    const [status, headers, out] = encode(result);
    send({ t: "result", id: meta.id, status, headers }, out);
  } catch (e) {
    send({ t: "error", id: meta.id }, String((e && e.stack) || e));
  }
}

// Serves invocations of handler `spec` (module.export) on the channel `fd`.
function serveInstance(fd, spec) {
  const net = require("net");
  const chan = new net.Socket({ fd, readable: true, writable: true });
  const send = (meta, body) => chan.write(frame(meta, body));
  // console.log and friends inside a handler become log frames of the invocation.
  for (const stream of ["stdout", "stderr"]) {
    process[stream].write = (chunk, encoding, cb) => {
      send({ t: "log", id: invocation.getStore() ?? null, stream }, Buffer.from(chunk, encoding));
      if (typeof encoding === "function") encoding();
      else if (cb) cb();
      return true;
    };
  }
  let handler;
  try {
    const dot = spec.lastIndexOf(".");
    handler = require(path.join("/code", spec.slice(0, dot)))[spec.slice(dot + 1)];
    if (typeof handler !== "function") throw new Error(`${spec} is not a function`);
  } catch (e) {
    send({ t: "init_error" }, String((e && e.stack) || e));
    chan.end(() => exit(1));
    return;
  }
  // Invocations overlap up to the function's concurrency: the engine never sends more.
  let buffered = Buffer.alloc(0);
  chan.on("data", (chunk) => {
    buffered = takeFrames(buffered.length ? Buffer.concat([buffered, chunk]) : chunk, (meta, body) =>
      serve(handler, send, meta, body),
    );
  });
  chan.on("end", () => exit(0));
  chan.on("error", () => exit(0));
  send({ t: "ready" });
}

// The zygote: node started with this bootstrap, as root in the host's namespaces. For
// each plan on the control socket (fd 0; the plan as JSON, its descriptors beside it) a
// child forked ahead becomes the sandbox the plan describes, replaying the steps of
// skiff's native spawner (crates/sandbox/src/child.rs) through raw system calls, and
// then an instance: node's start and the bootstrap's loading are skipped. Returns only
// in such a child, which then runs on node's event loop; the template itself loops.
function template(addon) {
  // What an instance needs, loaded once here rather than in every fork: net, a socket
  // of the kind the channel is, the standard streams (their writes are replaced in
  // the instance, whatever they were created for).
  const net = require("net");
  const warm = new net.Socket();
  warm.destroy();
  void process.stdout;
  void process.stderr;
  const meta = { id: 0, request_id: "", method: "GET", path: "/", query: "", headers: {}, timeout_ms: 1 };
  for (const result of [null, "ok", Buffer.alloc(1), { statusCode: 200, body: "ok" }, { a: 1 }]) encode(result);
  const mod = { exports: {} };
  process.dlopen(mod, addon);
  native = mod.exports;
  const S = native.sys;
  const errno = Object.fromEntries(Object.entries(require("os").constants.errno).map(([k, v]) => [v, k]));
  const check = (r, what) => {
    if (r < 0) throw new Error(`${what}: ${errno[-r] || -r}`);
    return r;
  };
  const NR = {
    read: 0, write: 1, close: 3, poll: 7, fcntl: 72, socketpair: 53, chdir: 80, setresuid: 117,
    setresgid: 119, setgroups: 116, capset: 126, pivot_root: 155, prctl: 157, mount: 165,
    umount2: 166, sethostname: 170, unshare: 272, openat: 257, dup3: 292, prlimit64: 302,
    setns: 308, seccomp: 317, close_range: 436,
  };
  const [RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE] =
    [1, 2, 4, 8, 32, 4096, 16384, 1 << 18];
  const ENOENT = 2;
  const mount = (src, dst, type, flags, data) => S(NR.mount, src, dst, type, flags, data ?? null);

  function enter(plan, fds) {
    let next = 3;
    const cloneInto = plan.clone_into ? fds[next++] : null;
    const joins = fds.slice(next, next + plan.joins);
    next += plan.joins;
    const netns = plan.netns ? fds[next++] : null;
    // Forked ahead, before its cgroup was known: the child moves itself.
    if (cloneInto !== null) {
      const procs = check(S(NR.openat, cloneInto, "cgroup.procs", 1 | 0x80000, 0), "open cgroup.procs");
      check(S(NR.write, procs, "0", 1), "join the cgroup");
      S(NR.close, procs);
    }
    for (const fd of joins) check(S(NR.write, fd, "0", 1), "join the cgroup");
    check(S(NR.unshare, 0x02000000), "unshare the cgroup namespace");
    if (netns !== null) check(S(NR.setns, netns, 0x40000000), "join the network namespace");
    const root = plan.rootfs;
    const nsd = NOSUID | NODEV;
    const nsdx = nsd | NOEXEC;
    check(mount(null, "/", null, REC | PRIVATE), "make / private");
    check(mount(root, root, null, BIND), "bind the root");
    check(mount(root, root, null, BIND | REMOUNT | RDONLY | nsd), "remount the root read-only");
    check(mount("proc", `${root}/proc`, "proc", nsdx), "mount /proc");
    for (const name of plan.masked_files) {
      const r = mount("/dev/null", `${root}/proc/${name}`, null, BIND);
      if (r < 0 && r !== -ENOENT) check(r, `mask /proc/${name}`);
    }
    for (const name of plan.masked_dirs) {
      const r = mount("tmpfs", `${root}/proc/${name}`, "tmpfs", RDONLY | nsdx, plan.mask_options);
      if (r < 0 && r !== -ENOENT) check(r, `mask /proc/${name}`);
    }
    for (const name of plan.readonly) {
      const p = `${root}/proc/${name}`;
      const r = mount(p, p, null, BIND);
      if (r === -ENOENT) continue;
      check(r, `bind /proc/${name}`);
      check(mount(p, p, null, BIND | REMOUNT | RDONLY | nsdx), `remount /proc/${name}`);
    }
    check(mount(plan.dev_template, `${root}/dev`, null, BIND | REC), "bind /dev");
    check(mount("tmpfs", `${root}/dev/shm`, "tmpfs", nsdx, plan.shm_options), "mount /dev/shm");
    check(mount("tmpfs", `${root}/tmp`, "tmpfs", nsd, plan.tmp_options), "mount /tmp");
    check(S(NR.chdir, root), "chdir to the root");
    check(S(NR.pivot_root, ".", "."), "pivot_root");
    check(S(NR.umount2, ".", 2), "detach the old root");
    check(S(NR.chdir, "/"), "chdir /");
    check(S(NR.sethostname, plan.hostname, Buffer.byteLength(plan.hostname)), "sethostname");
    const limit = (resource, value) => {
      const both = Buffer.alloc(16);
      both.writeBigUInt64LE(BigInt(value), 0);
      both.writeBigUInt64LE(BigInt(value), 8);
      check(S(NR.prlimit64, 0, resource, both, null), "setrlimit");
    };
    limit(7, plan.max_open_files); // RLIMIT_NOFILE
    limit(4, 0); // RLIMIT_CORE
    check(S(NR.setgroups, 0, null), "setgroups");
    check(S(NR.prctl, 28, plan.secure_bits), "securebits");
    for (let cap = 0; cap <= plan.last_cap; cap++) check(S(NR.prctl, 24, cap), "drop bounding capabilities");
    check(S(NR.prctl, 47, 4, 0, 0, 0), "clear ambient capabilities");
    check(S(NR.setresgid, plan.gid, plan.gid, plan.gid), "setresgid");
    check(S(NR.setresuid, plan.uid, plan.uid, plan.uid), "setresuid");
    const header = Buffer.alloc(8);
    header.writeUInt32LE(0x20080522, 0);
    check(S(NR.capset, header, Buffer.alloc(24)), "capset");
    check(S(NR.chdir, plan.cwd), "chdir");
    check(S(NR.prctl, 1, 9), "parent-death signal"); // PR_SET_PDEATHSIG SIGKILL
    // The channel, stdout and stderr may have arrived as any numbers, 0 to 2 included:
    // lift them out of the way, put them in place, close everything else of the
    // template's (the event loop's descriptors too: it is renewed right after).
    const [keep, out, err] = fds.slice(0, 3).map((fd) => check(S(NR.fcntl, fd, 1030, 100), "dup"));
    check(S(NR.dup3, out, 1, 0), "stdout");
    check(S(NR.dup3, err, 2, 0), "stderr");
    S(NR.close_range, 3, keep - 1, 0);
    S(NR.close_range, keep + 1, 0xffffffff, 0);
    check(native.loopFork(), "renew the event loop");
    const devnull = check(S(NR.openat, -100, "/dev/null", 0x80000, 0), "open /dev/null");
    check(S(NR.dup3, devnull, 0, 0), "stdin");
    S(NR.close, devnull);
    for (const k of Object.keys(process.env)) delete process.env[k];
    for (const pair of plan.env) {
      const eq = pair.indexOf("=");
      process.env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
    check(S(NR.prctl, 38, 1, 0, 0, 0), "no_new_privs");
    const program = Buffer.from(plan.seccomp, "hex");
    const prog = Buffer.alloc(16);
    prog.writeUInt16LE(program.length / 8, 0);
    prog.writeBigUInt64LE(native.address(program), 8);
    check(S(NR.seccomp, 1, 0, prog), "seccomp");
    return keep;
  }

  // In a spare child: the sandbox from the plan, then the instance.
  function become(message, fds) {
    let plan;
    let keep;
    try {
      plan = JSON.parse(message.toString());
      keep = enter(plan, fds);
    } catch (e) {
      const f = frame({ t: "init_error" }, `cannot set up the sandbox: ${e.message}`);
      S(NR.write, fds[0], f, f.length);
      native.exit(125);
    }
    serveInstance(keep, plan.handler);
  }

  // NEWNS|NEWUTS|NEWIPC|NEWPID|PARENT (the addon adds PIDFD): the child is the daemon's.
  const FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x00008000;
  const control = 0;
  // Forks a child ahead of need; in the child, waits for its plan and returns null.
  function spare() {
    const pair = Buffer.alloc(8);
    check(S(NR.socketpair, 1, 5 | 0x80000, 0, pair), "socketpair"); // SEQPACKET|CLOEXEC
    const [ours, theirs] = [pair.readInt32LE(0), pair.readInt32LE(4)];
    const [pid, pidfd] = native.spare(FLAGS);
    if (pid < 0) throw new Error(`clone3: ${errno[-pid] || -pid}`);
    if (pid === 0) {
      S(NR.close, ours);
      S(NR.close, control);
      const [message, fds] = native.recvFds(theirs);
      if (message === null) native.exit(0);
      S(NR.close, theirs);
      become(message, fds);
      return null;
    }
    S(NR.close, theirs);
    return { pid, pidfd, ours };
  }

  // One whole invocation through the event loop before the first fork: a frame in on a
  // socketpair, the data event, serve's asynchronous half, the reply out. Forks then
  // start with all of it compiled. Both sockets are closed, and the loop idle, before
  // forking begins (a fork renews the loop with whatever handles it has).
  const warmPair = Buffer.alloc(8);
  check(S(NR.socketpair, 1, 1 | 0x80000, 0, warmPair), "socketpair"); // STREAM|CLOEXEC
  const inner = new net.Socket({ fd: warmPair.readInt32LE(0), readable: true, writable: true });
  const outer = new net.Socket({ fd: warmPair.readInt32LE(4), readable: true, writable: true });
  let pending = Buffer.alloc(0);
  inner.on("data", (chunk) => {
    pending = takeFrames(pending.length ? Buffer.concat([pending, chunk]) : chunk, (m, body) =>
      serve(() => ({ warm: true }), (rm, rb) => inner.write(frame(rm, rb)), m, body),
    );
  });
  outer.once("data", () => {
    let closed = 0;
    const afterClose = () => {
      if (++closed === 2) setImmediate(forkLoop);
    };
    for (const socket of [inner, outer]) {
      socket.once("close", afterClose);
      socket.destroy();
    }
  });
  outer.write(frame(meta, Buffer.from('{"warm": [1, "x", null]}')));

  // The template's loop: answers plans with spare children; returns only in a child.
  function forkLoop() {
    let waiting = spare();
    if (waiting === null) return;
    native.sendFds(control, Buffer.from("ready"), []);
    const pollfd = Buffer.alloc(8);
    pollfd.writeInt32LE(control, 0);
    pollfd.writeInt16LE(1, 4); // POLLIN
    for (;;) {
      const [message, fds] = native.recvFds(control);
      if (message === null) native.exit(0);
      try {
        const child = waiting || spare();
        if (child === null) return;
        waiting = null;
        try {
          check(native.sendFds(child.ours, message, fds), "hand the plan over");
          native.sendFds(control, Buffer.from(JSON.stringify({ pid: child.pid })), [child.pidfd]);
        } finally {
          S(NR.close, child.pidfd);
          S(NR.close, child.ours);
        }
      } catch (e) {
        native.sendFds(control, Buffer.from(JSON.stringify({ error: e.message })), []);
      } finally {
        for (const fd of fds) S(NR.close, fd);
      }
      // The next one once the start has had the CPU for a while: off its path.
      pollfd.writeInt16LE(0, 6);
      if (S(NR.poll, pollfd, 1, 5) === 0) {
        try {
          waiting = spare();
          if (waiting === null) return;
        } catch {
          waiting = null;
        }
      }
    }
  }
}

const [mode, arg] = process.argv.slice(1);
if (mode === "@template") template(arg);
else serveInstance(0, mode);
})();

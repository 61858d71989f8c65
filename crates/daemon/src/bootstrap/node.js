// skiff's node bootstrap. As an instance (argv: HANDLER) it loads the handler once,
// then serves invocations over the framed channel on fd 0 (frame: u32 meta length, u32
// body length, JSON meta, body). As a template (argv: @template ADDON) it forks spare
// children on request on fd 0, each of which becomes an instance from the plan the
// daemon sends it (see template()).
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
// each plan the daemon sends a spare child (the plan as JSON, its descriptors beside
// it), that child becomes the sandbox the plan describes (native.enter: the sandbox
// entry skiff's native spawner calls too, crates/sandbox/src/entry.c), and then an
// instance: node's start and the bootstrap's loading are skipped. Returns only
// in such a child, which then runs on node's event loop; the template itself loops.
function template(addon) {
  // What an instance needs, loaded once here rather than in every fork: net, a socket
  // of the kind the channel is, the standard streams (their writes are replaced in
  // the instance, whatever they were created for).
  const net = require("net");
  const crypto = require("crypto");
  const warm = new net.Socket();
  warm.destroy();
  void process.stdout;
  void process.stderr;
  const meta = { id: 0, request_id: "", method: "GET", path: "/", query: "", headers: {}, timeout_ms: 1 };
  for (const result of [null, "ok", Buffer.alloc(1), { statusCode: 200, body: "ok" }, { a: 1 }]) encode(result);
  // Every instance loads its handler from a file: take that path (resolve, read, compile
  // a module) once here, so the forks find it compiled.
  const fs = require("fs");
  const warmDir = fs.mkdtempSync(path.join(path.dirname(addon), "warm-"));
  fs.writeFileSync(path.join(warmDir, "main.js"), "exports.handler = async (event) => event;\n");
  require(path.join(warmDir, "main")).handler;
  fs.rmSync(warmDir, { recursive: true });
  // The collector, from a context of its own: handlers never see a `gc` global.
  const v8 = require("v8");
  v8.setFlagsFromString("--expose-gc");
  const collect = require("vm").runInNewContext("gc");
  v8.setFlagsFromString("--no-expose-gc");
  const mod = { exports: {} };
  process.dlopen(mod, addon);
  native = mod.exports;
  const S = native.sys;
  const errno = Object.fromEntries(Object.entries(require("os").constants.errno).map(([k, v]) => [v, k]));
  const check = (r, what) => {
    if (r < 0) throw new Error(`${what}: ${errno[-r] || -r}`);
    return r;
  };
  const NR = { write: 1, close: 3, poll: 7, socketpair: 53 };

  // The sandbox (native.enter), then the function's environment in place of the template's.
  function enter(plan, fds) {
    const keep = native.enter(plan, fds);
    // Again through node, which caches its working directory (the template's, "/").
    process.chdir(plan.cwd);
    for (const k of Object.keys(process.env)) delete process.env[k];
    for (const pair of plan.env) {
      const eq = pair.indexOf("=");
      process.env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
    return keep;
  }

  // In a spare child: the sandbox from the plan (on top of its preparation, which failed
  // if `unprepared` says why), then the instance.
  function become(message, fds, unprepared) {
    let plan;
    let keep;
    try {
      if (unprepared) throw new Error(unprepared);
      plan = JSON.parse(message.toString());
      keep = enter(plan, fds);
      reseed();
      // A handler's process.exit ends the instance as the bootstrap's own exits do
      // (node's own would tear down helper threads a fork does not have, and crash).
      process.reallyExit = (code) => native.exit(code);
      // So does an exception nothing catches: node's own end (print, then that teardown)
      // is replaced by the last 'exit' listener, which prints the error as node would.
      process.on("uncaughtExceptionMonitor", (error) => {
        if (process.listenerCount("uncaughtException") || process.hasUncaughtExceptionCaptureCallback()) return;
        process.on("exit", (code) => {
          process.stderr.write(`${require("util").inspect(error)}\n\nNode.js ${process.version}\n`);
          native.exit(code);
        });
      });
      // The template compiles eagerly (--no-lazy: nothing of its own is left for each
      // fork to compile); the function's code compiles as node normally would.
      v8.setFlagsFromString("--lazy");
    } catch (e) {
      const f = frame({ t: "init_error" }, `cannot set up the sandbox: ${e.message}`);
      S(NR.write, fds[0], f, f.length);
      native.exit(125);
    }
    serveInstance(keep, plan.handler);
  }

  // A fork repeats its template's Math.random sequence (V8 seeded it once, at the
  // template's start): each instance draws from a generator of its own, fed by
  // OpenSSL's, which reseeds itself in a process whose pid is new.
  function reseed() {
    const words = new Uint32Array(512);
    let next = words.length;
    Math.random = function random() {
      if (next === words.length) {
        crypto.randomFillSync(words);
        next = 0;
      }
      const high = words[next++] >>> 5;
      const low = words[next++] >>> 6;
      return (high * 67108864 + low) / 9007199254740992;
    };
  }

  // The pages an instance's start touched, learnt by the daemon from one of them: each
  // spare populates them while it waits (native.populate).
  let lesson = null;
  // The steps of a start that need no plan, the daemon's `prepare` (native.prepare).
  let preparation = null;

  // NEWNS|NEWUTS|NEWIPC|NEWPID|PARENT (the addon adds PIDFD): the child is the daemon's.
  const FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x00008000;
  const control = 0;
  // In a spare, while it waits: the instance's first allocations land at the start of
  // the young generation, whose pages the fork shares with the template, so each costs
  // the instance a copy-on-write fault. Allocating there now (~100 KB of garbage, then a
  // scavenge, once in each semispace) takes those copies before the plan comes: 507 ->
  // 375 faults from plan to first reply, for 263 more while waiting (/proc/PID/stat).
  function touchYoungGeneration() {
    for (let round = 0; round < 2; round++) {
      let garbage;
      for (let i = 0; i < 1024; i++) garbage = [i, i, i, i, i, i, i, i];
      void garbage;
      collect({ type: "minor" });
    }
  }

  // Forks a child ahead of need; in the child, waits for its plan and returns null.
  function spare() {
    const pair = Buffer.alloc(8);
    check(S(NR.socketpair, 1, 5 | 0x80000, 0, pair), "socketpair"); // SEQPACKET|CLOEXEC
    const [ours, theirs] = [pair.readInt32LE(0), pair.readInt32LE(4)];
    // An empty young generation: the instance's first allocations would otherwise set
    // off a scavenge of the template's garbage, paying copy-on-write faults for all of it.
    collect({ type: "minor" });
    const [pid, pidfd] = native.spare(FLAGS);
    if (pid < 0) throw new Error(`clone3: ${errno[-pid] || -pid}`);
    if (pid === 0) {
      S(NR.close, ours);
      S(NR.close, control);
      const unprepared = preparation ? native.prepare(preparation) : "the template was not prepared";
      touchYoungGeneration();
      if (lesson) native.populate(lesson);
      const [message, fds] = native.recvFds(theirs);
      if (message === null) native.exit(0);
      S(NR.close, theirs);
      become(message, fds, unprepared);
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

  // The template's loop: each request on the control socket is for one spare child,
  // handed over with its pidfd and plan socket (the daemon sends the plan to the spare
  // itself). Returns only in a child.
  function forkLoop() {
    native.sendFds(control, Buffer.from("ready"), []);
    const pollfd = Buffer.alloc(8);
    pollfd.writeInt32LE(control, 0);
    pollfd.writeInt16LE(1, 4); // POLLIN
    for (;;) {
      const [request] = native.recvFds(control);
      if (request === null) native.exit(0);
      if (request.subarray(0, 5).toString() === "learn") {
        lesson = request.subarray(5);
        continue;
      }
      if (request.subarray(0, 7).toString() === "prepare") {
        preparation = JSON.parse(request.subarray(7).toString());
        continue;
      }
      if (request.toString() === "next") {
        // After a start: leave it the CPU for a while, unless a spare is wanted now.
        S(NR.poll, pollfd, 1, 5);
      }
      try {
        const child = spare();
        if (child === null) return;
        try {
          native.sendFds(control, Buffer.from(JSON.stringify({ pid: child.pid })), [child.pidfd, child.ours]);
        } finally {
          S(NR.close, child.pidfd);
          S(NR.close, child.ours);
        }
      } catch (e) {
        native.sendFds(control, Buffer.from(JSON.stringify({ error: e.message })), []);
      }
    }
  }
}

const [mode, arg] = process.argv.slice(1);
if (mode === "@template") template(arg);
else serveInstance(0, mode);
})();

// skiff's node bootstrap: loads the handler once, then serves invocations over the framed
// channel on fd 0 (frame: u32 meta length, u32 body length, JSON meta, body).
"use strict";
const net = require("net");
const path = require("path");
const { AsyncLocalStorage } = require("async_hooks");
const [spec] = process.argv.slice(1);
const FUNCTION = process.env.SKIFF_FUNCTION || "";
const invocation = new AsyncLocalStorage();
const chan = new net.Socket({ fd: 0, readable: true, writable: true });

function send(meta, body) {
  const m = Buffer.from(JSON.stringify(meta));
  const b = body ? Buffer.from(body) : Buffer.alloc(0);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(m.length, 0);
  head.writeUInt32BE(b.length, 4);
  chan.write(Buffer.concat([head, m, b]));
}

// console.log and friends inside a handler become log frames of the invocation.
for (const stream of ["stdout", "stderr"]) {
  process[stream].write = (chunk, encoding, cb) => {
    send({ t: "log", id: invocation.getStore() ?? null, stream }, Buffer.from(chunk, encoding));
    if (typeof encoding === "function") encoding();
    else if (cb) cb();
    return true;
  };
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

function load() {
  try {
    const dot = spec.lastIndexOf(".");
    const fn = require(path.join("/code", spec.slice(0, dot)))[spec.slice(dot + 1)];
    if (typeof fn !== "function") throw new Error(`${spec} is not a function`);
    return fn;
  } catch (e) {
    send({ t: "init_error" }, String((e && e.stack) || e));
    chan.end(() => process.exit(1));
    return null;
  }
}
const handler = load();

async function serve(meta, body) {
  const context = {
    requestId: meta.request_id,
    functionName: FUNCTION,
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

// Invocations overlap up to the function's concurrency: the engine never sends more.
let buffered = Buffer.alloc(0);
chan.on("data", (chunk) => {
  buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
  while (buffered.length >= 8) {
    const metaLen = buffered.readUInt32BE(0);
    const bodyLen = buffered.readUInt32BE(4);
    if (buffered.length < 8 + metaLen + bodyLen) break;
    const meta = JSON.parse(buffered.subarray(8, 8 + metaLen).toString());
    const body = buffered.subarray(8 + metaLen, 8 + metaLen + bodyLen);
    buffered = buffered.subarray(8 + metaLen + bodyLen);
    serve(meta, body);
  }
});
chan.on("end", () => process.exit(0));
if (handler) send({ t: "ready" });

//! A long-lived instance of a `python3` or `node` function: a sandbox running skiff's
//! bootstrap, which loads the handler once and then serves invocations over the framed
//! channel (its stdin is our end's peer; stdout and stderr are a log pipe).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use skiff_cgroups::{Limits, Slot};
use skiff_sandbox::template::Template;
use skiff_sandbox::{Child, ExitStatus, Spec};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::oneshot;

use crate::engine::Engine;
use crate::fn_templates::{FunctionTemplate, TemplateUse};
use crate::protocol::{self, Message};
use crate::registry::{Function, Network, Runtime};

pub(crate) const PYTHON_BOOTSTRAP: &str = include_str!("bootstrap/python.py");
pub(crate) const NODE_BOOTSTRAP: &str = include_str!("bootstrap/node.js");
/// Runs the python bootstrap from its compiled form (see
/// `Templates::python_bootstrap_code`): the first bytes on the channel, as many as the
/// next argument says, which it takes off the command line first. Nothing else comes on
/// the channel before the instance's `ready`, so the buffered read cannot take more. Read
/// from the channel, not the command line: python decodes each argument char by char
/// (~2 ms for the ~60 KB of hex it took there).
const PYTHON_LOAD_CODE: &str =
    "import marshal, sys; exec(marshal.loads(sys.stdin.buffer.read(int(sys.argv.pop(1)))))";

/// Largest response body (and log frame) an instance may send.
pub const MAX_OUTPUT: usize = 6 << 20;
/// Log lines kept in one invocation's record.
const MAX_RECORD_LOG_LINES: usize = 100;

/// What an instance answered.
pub enum Reply {
    Response {
        status: u16,
        headers: BTreeMap<String, String>,
        body: Vec<u8>,
    },
    /// The handler raised or rejected: its traceback or stack; or a wasm request
    /// trapped (500) or ran out of time (504).
    HandlerError(String, u16),
    /// The instance died before answering: why.
    Crashed(String),
    /// No answer within the call's timeout: the instance was killed.
    TimedOut,
}

/// One call's request, as the engine sends it.
pub struct Call<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a BTreeMap<String, String>,
    pub body: &'a [u8],
    pub timeout: Duration,
    /// A wasm session hook instead of `handle`.
    pub export: Option<&'a str>,
}

/// A wasm worker's part in a session, and the session's directory (its `/work`).
#[derive(Clone)]
pub struct SessionRole {
    pub primary: bool,
    pub dir: std::path::PathBuf,
}

struct Pending {
    reply: oneshot::Sender<(Reply, Vec<String>)>,
    request_id: String,
    logs: Vec<String>,
}

pub struct Instance {
    pub id: String,
    pub function: String,
    pub pid: i32,
    pub cgroup_slot: usize,
    /// A session's primary worker (holds the session's state).
    pub primary: bool,
    pub started: SystemTime,
    /// Spawn to `ready`: what a cold start cost.
    pub init: Duration,
    child: Child,
    /// The template to teach after the first reply ([`Template::learn_from`]).
    teaches: Mutex<Option<Arc<Template>>>,
    /// The function's own template it was forked from: kept from eviction while we live.
    _template: Option<TemplateUse>,
    slot: Slot,
    netns_slot: Option<usize>,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_call: AtomicU64,
    dead: AtomicBool,
    /// Not yet served: the first call's record counts the cold start.
    fresh: AtomicBool,
    /// Calls in flight and the last time one ended; changed under the function's lock.
    pub inflight: AtomicU32,
    pub served: AtomicU64,
    pub last_used: Mutex<Instant>,
    /// How long past a call's timeout the engine still waits: a wasm worker stops the
    /// request itself at the limit and lives on; others are killed at it.
    grace: Duration,
}

/// Why a start failed: the function's own (its import raised, the interpreter died), or
/// the platform's.
pub enum StartError {
    Init(String),
    Platform(anyhow::Error),
}

impl From<anyhow::Error> for StartError {
    fn from(e: anyhow::Error) -> StartError {
        StartError::Platform(e)
    }
}

/// The sandbox side of a start, done on a blocking thread.
struct Spawned {
    child: Child,
    /// The template it was forked from, if that has not yet learnt from an instance.
    teaches: Option<Arc<Template>>,
    slot: Slot,
    netns_slot: Option<usize>,
    chan: StdUnixStream,
    log: OwnedFd,
    template: Option<TemplateUse>,
}

/// What a sandbox is started as.
#[derive(Clone, Copy, PartialEq)]
enum Purpose {
    Instance,
    /// The function's own template (see `crate::fn_templates`).
    FunctionTemplate,
}

/// How a plain start runs an instance.
struct PlainCommand {
    argv: Vec<String>,
    /// Bytes on its channel before anything else.
    preload: Option<Arc<[u8]>>,
}

/// How to start an instance of `f` plainly, whose environment's root is `root`.
fn plain_command(
    engine: &Engine,
    f: &Function,
    root: &Path,
    role: Option<&SessionRole>,
    purpose: Purpose,
) -> Result<PlainCommand> {
    let mut preload = None;
    let argv = match f.runtime {
        // -I -S: no user site, no site.py (the bootstrap sets the path itself): ~3 ms less.
        Runtime::Python3 => {
            let mut argv = ["/usr/bin/python3", "-I", "-S", "-c"]
                .map(String::from)
                .to_vec();
            preload = engine.templates.python_bootstrap_code(root);
            match &preload {
                Some(code) => argv.extend([PYTHON_LOAD_CODE.into(), code.len().to_string()]),
                None => argv.push(PYTHON_BOOTSTRAP.into()),
            }
            argv.extend([f.handler.clone(), f.scale.concurrency.to_string()]);
            if purpose == Purpose::FunctionTemplate {
                argv.push("--function-template".into());
            }
            argv
        }
        Runtime::Node => vec![
            "/usr/bin/node".into(),
            "-e".into(),
            NODE_BOOTSTRAP.into(),
            f.handler.clone(),
        ],
        Runtime::Wasm => {
            let concurrency = f.scale.concurrency.max(1);
            let mut argv = vec![
                "/usr/bin/skiff".into(),
                "worker".into(),
                "--module".into(),
                format!("/code/{}", skiff_builder::compiled_name(&f.handler)),
                "--concurrency".into(),
                concurrency.to_string(),
                "--memory".into(),
                wasm_request_memory(f.memory_bytes, concurrency).to_string(),
            ];
            if let (Some(role), Some(session)) = (role, &f.session) {
                let part = if role.primary { "primary" } else { "secondary" };
                argv.extend(["--session".into(), part.into()]);
                argv.extend([
                    "--durability".into(),
                    format!("{:?}", session.durability).to_lowercase(),
                ]);
                argv.extend([
                    "--locking".into(),
                    format!("{:?}", session.locking).to_lowercase(),
                ]);
            }
            argv
        }
        other => bail!("runtime {other:?} has no long-lived instances"),
    };
    Ok(PlainCommand { argv, preload })
}

/// Threads a wasm worker needs beyond `limits.pids` (guests cannot make any): one per
/// request it runs, and in a session's primary one per connection from a secondary's
/// request in flight, plus a few of its own.
fn platform_threads(f: &Function) -> u64 {
    if f.runtime != Runtime::Wasm {
        return 0;
    }
    let per_worker = u64::from(f.scale.concurrency.max(1)) + 1;
    let workers = u64::from(f.scale.max_instances.max(1)) + 1;
    workers * per_worker + 8
}

/// Linear memory each wasm request may use: half the worker's memory limit, shared by
/// its instances (plus one for hooks), so one greedy request cannot get the worker (and
/// its session's state) killed by the kernel.
fn wasm_request_memory(worker_bytes: u64, concurrency: u32) -> u64 {
    const PAGE: u64 = 64 << 10;
    (worker_bytes / 2 / (u64::from(concurrency) + 1) / PAGE).max(16) * PAGE
}

/// Starts a sandbox of `f`: forked from `template` (the function's own) when given,
/// else from its runtime's template or plainly.
fn spawn_sandbox(
    engine: &Engine,
    f: &Function,
    id: &str,
    role: Option<&SessionRole>,
    purpose: Purpose,
    template: Option<&Arc<FunctionTemplate>>,
) -> Result<Spawned> {
    let limits = Limits {
        memory_bytes: f.memory_bytes,
        cpus: f.cpus,
        pids: f.pids + platform_threads(f),
    };
    let (slot, entry) = engine.cgroups.acquire(id, &limits)?;
    if let Some(template) = template {
        return fork_from_function_template(engine, f, id, template, slot, &entry).or_else(|e| {
            // Its own template is the function's code: one that misbehaves is given up
            // for this version, which starts as functions without one do.
            eprintln!(
                "skiff: warning: {e:#}; {} starts without its template",
                f.name
            );
            engine.fn_templates.give_up(f);
            spawn_sandbox(engine, f, id, role, purpose, None)
        });
    }
    let netns = match f.network {
        Network::None => match engine.netns()?.acquire(id) {
            Ok(claimed) => Some(claimed),
            Err(e) => {
                let _ = engine.cgroups.release(slot.index);
                return Err(e);
            }
        },
        Network::Host => None,
    };
    let release = |slot: &Slot, netns: &Option<(usize, OwnedFd)>| {
        let _ = engine.cgroups.release(slot.index);
        if let Some((n, _)) = netns {
            let _ = engine.netns().map(|p| p.release(*n));
        }
    };
    let (ours, theirs) = StdUnixStream::pair().context("socketpair")?;
    let (log_r, log_w) = crate::invoke::pipe();
    let root = engine.env_root(&f.env);
    // The command line is for the plain path only: set below if it is taken.
    let mut spec = Spec::new(id, root.clone(), engine.dev_template.clone(), vec![]);
    spec.cwd = "/code".into();
    spec.work = role.map(|r| r.dir.clone());
    spec.env.push(format!("SKIFF_FUNCTION={}", f.name));
    spec.env
        .extend(f.vars.iter().map(|(k, v)| format!("{k}={v}")));
    spec.stdio = [theirs.as_raw_fd(), log_w.as_raw_fd(), log_w.as_raw_fd()];
    let netns_slot = netns.as_ref().map(|(n, _)| *n);
    spec.netns = netns.as_ref().map(|(_, fd)| fd.try_clone()).transpose()?;
    let started = match from_template(engine, f, &spec, &entry, purpose) {
        Some(Ok((child, template))) => Ok((child, template.wants_lesson().then_some(template))),
        fallback => {
            if let Some(Err(e)) = fallback {
                eprintln!(
                    "skiff: warning: template start of {} failed, starting it plainly: {e:#}",
                    f.name
                );
            }
            let command = plain_command(engine, f, &root, role, purpose).and_then(|command| {
                // Into the socket's buffer now (~30 KB; it holds ~200 KB), read at start.
                if let Some(bytes) = command.preload {
                    (&ours).write_all(&bytes).context("write the bootstrap")?;
                }
                Ok(command.argv)
            });
            match command {
                Ok(argv) => {
                    spec.argv = argv;
                    let child = engine.spawner.spawn(&spec, &entry);
                    child.map(|child| (child, None)).map_err(|e| e.message)
                }
                Err(e) => Err(format!("{e:#}")),
            }
        }
    };
    match started {
        Ok((child, teaches)) => Ok(Spawned {
            child,
            teaches,
            slot,
            netns_slot,
            chan: ours,
            log: log_r,
            template: None,
        }),
        Err(message) => {
            release(&slot, &netns);
            bail!("cannot start an instance of {}: {message}", f.name)
        }
    }
}

/// A python3 or node instance forked from its runtime's template, when templates are
/// on (with the template it came from); `None` for the plain path.
fn from_template(
    engine: &Engine,
    f: &Function,
    spec: &Spec,
    entry: &skiff_cgroups::Entry,
    purpose: Purpose,
) -> Option<Result<(Child, Arc<Template>)>> {
    if !engine.use_templates {
        return None;
    }
    let as_template = purpose == Purpose::FunctionTemplate;
    engine
        .templates
        .fork(&engine.data, f, spec, entry, as_template)
}

/// An instance forked from the function's own template, in the cgroup slot `slot`
/// (released here if the fork fails).
fn fork_from_function_template(
    engine: &Engine,
    f: &Function,
    id: &str,
    template: &Arc<FunctionTemplate>,
    slot: Slot,
    entry: &skiff_cgroups::Entry,
) -> Result<Spawned> {
    let index = slot.index;
    let forked = StdUnixStream::pair()
        .context("socketpair")
        .and_then(|(ours, theirs)| {
            let (log_r, log_w) = crate::invoke::pipe();
            let (child, used) = template.fork(&theirs, &log_w, &ours, entry)?;
            Ok(Spawned {
                child,
                teaches: None,
                slot,
                netns_slot: None,
                chan: ours,
                log: log_r,
                template: Some(used),
            })
        });
    forked.map_err(|e| {
        let _ = engine.cgroups.release(index);
        e.context(format!("cannot fork an instance of {} ({id})", f.name))
    })
}

/// Starts `f`'s own template (see `crate::fn_templates`) and waits until it has
/// imported what its handler imports.
pub async fn start_function_template(
    engine: &Arc<Engine>,
    f: &Function,
) -> Result<FunctionTemplate> {
    let began = Instant::now();
    let id = format!(
        "{}{}",
        skiff_pool::SERVE_OWNER_PREFIX,
        crate::invocations::new_id()
    );
    let spawned = {
        let (engine, f, id) = (engine.clone(), f.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            spawn_sandbox(&engine, &f, &id, None, Purpose::FunctionTemplate, None)
        })
        .await
        .context("spawn task")??
    };
    spawned.chan.set_nonblocking(true).context("channel")?;
    let mut chan = tokio::net::UnixStream::from_std(spawned.chan).context("channel")?;
    let limit = Duration::from_millis(f.timeout_ms).max(Duration::from_secs(30));
    let first = tokio::time::timeout(limit, protocol::read(&mut chan, MAX_OUTPUT)).await;
    if !matches!(first, Ok(Ok(Some((Message::Ready, _))))) {
        let how = reap_and_release(
            engine,
            &spawned.child,
            None,
            &spawned.slot,
            spawned.netns_slot,
        )
        .await;
        let output = drain(&spawned.log);
        bail!("the template did not start: {how}\n{}", output.trim_end());
    }
    let control = chan.into_std().context("channel")?;
    control.set_nonblocking(false).context("channel")?;
    // A template answers at once; one that does not is broken, not busy.
    control
        .set_read_timeout(Some(Duration::from_secs(10)))
        .context("channel")?;
    tokio::spawn(read_logs(engine.clone(), f.name.clone(), spawned.log));
    Ok(FunctionTemplate::new(
        id,
        f,
        spawned.child,
        spawned.slot,
        spawned.netns_slot,
        control,
        began.elapsed(),
    ))
}

impl Instance {
    /// Starts an instance and waits until its handler is loaded. `on_exit` runs once
    /// when the instance is gone (crashed, killed, or stopped).
    pub async fn start(
        engine: &Arc<Engine>,
        f: &Function,
        role: Option<SessionRole>,
        on_exit: impl FnOnce(&Arc<Instance>) + Send + 'static,
    ) -> Result<Arc<Instance>, StartError> {
        let began = Instant::now();
        let id = format!(
            "{}{}",
            skiff_pool::SERVE_OWNER_PREFIX,
            crate::invocations::new_id()
        );
        let template = if role.is_none() && engine.fn_templates.wanted(engine, f) {
            engine.fn_templates.get(engine, f).await
        } else {
            None
        };
        let spawned = {
            let (engine, f, id, role) = (engine.clone(), f.clone(), id.clone(), role.clone());
            tokio::task::spawn_blocking(move || {
                let purpose = Purpose::Instance;
                spawn_sandbox(&engine, &f, &id, role.as_ref(), purpose, template.as_ref())
            })
            .await
            .context("spawn task")??
        };
        spawned.chan.set_nonblocking(true).context("channel")?;
        let chan = tokio::net::UnixStream::from_std(spawned.chan).context("channel")?;
        let (reader, writer) = chan.into_split();
        // A reply is one frame in three parts: read through a buffer, it costs one
        // system call, not three.
        let mut reader = tokio::io::BufReader::new(reader);
        let init_limit = Duration::from_millis(f.timeout_ms).max(Duration::from_secs(10));
        let first = tokio::time::timeout(init_limit, protocol::read(&mut reader, MAX_OUTPUT)).await;
        // (message, whether the exit status adds to it)
        let failure = match first {
            Ok(Ok(Some((Message::Ready, _)))) => None,
            Ok(Ok(Some((Message::InitError, body)))) => {
                Some((String::from_utf8_lossy(&body).trim_end().to_owned(), false))
            }
            Ok(Ok(None)) => Some((
                "the instance exited before loading its handler".into(),
                true,
            )),
            Ok(Ok(Some(_))) => Some(("the instance spoke before loading its handler".into(), true)),
            Ok(Err(e)) => Some((format!("bad first frame: {e}"), true)),
            Err(_) => Some((
                format!(
                    "the handler did not load within {} ms",
                    init_limit.as_millis()
                ),
                false,
            )),
        };
        if let Some((message, with_status)) = failure {
            let how = reap_and_release(
                engine,
                &spawned.child,
                spawned.template.as_ref(),
                &spawned.slot,
                spawned.netns_slot,
            )
            .await;
            // Keep the instance's own output: an interpreter that failed before the
            // bootstrap ran (a missing library, a bad flag) says why there.
            let output = drain(&spawned.log);
            let mut text = message;
            for extra in [
                output.trim_end(),
                if with_status { how.as_str() } else { "" },
            ] {
                if !extra.is_empty() {
                    text = format!("{text}\n{extra}");
                }
            }
            return Err(StartError::Init(text));
        }
        let instance = Arc::new(Instance {
            id,
            function: f.name.clone(),
            pid: spawned.child.pid,
            cgroup_slot: spawned.slot.index,
            primary: role.is_some_and(|r| r.primary),
            started: SystemTime::now(),
            init: began.elapsed(),
            child: spawned.child,
            teaches: Mutex::new(spawned.teaches),
            _template: spawned.template,
            slot: spawned.slot,
            netns_slot: spawned.netns_slot,
            writer: tokio::sync::Mutex::new(writer),
            pending: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            fresh: AtomicBool::new(true),
            inflight: AtomicU32::new(0),
            served: AtomicU64::new(0),
            last_used: Mutex::new(Instant::now()),
            grace: if f.runtime == Runtime::Wasm {
                Duration::from_secs(1)
            } else {
                Duration::ZERO
            },
        });
        tokio::spawn(read_logs(engine.clone(), f.name.clone(), spawned.log));
        let (engine2, me) = (engine.clone(), instance.clone());
        tokio::spawn(async move {
            let why = me.serve_replies(&engine2, &mut reader).await;
            me.dead.store(true, Ordering::SeqCst);
            let _ = me.child.kill(libc::SIGKILL);
            let origin = me._template.as_ref();
            let exit = reap_and_release(&engine2, &me.child, origin, &me.slot, me.netns_slot).await;
            let why = why.unwrap_or(exit);
            for (_, p) in me.pending.lock().unwrap().drain() {
                let _ = p.reply.send((Reply::Crashed(why.clone()), p.logs));
            }
            on_exit(&me);
        });
        Ok(instance)
    }

    /// Reads frames until the channel ends; returns why, when the instance broke the
    /// protocol (otherwise its exit status tells).
    async fn serve_replies(
        self: &Arc<Self>,
        engine: &Arc<Engine>,
        reader: &mut tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    ) -> Option<String> {
        loop {
            let (message, body) = match protocol::read(reader, MAX_OUTPUT).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(e) => return Some(e.to_string()),
            };
            match message {
                Message::Log { id, stream } => {
                    let text = String::from_utf8_lossy(&body);
                    let mut pending = self.pending.lock().unwrap();
                    let call = id.and_then(|id| pending.get_mut(&id));
                    let request_id = call.as_ref().map(|c| c.request_id.clone());
                    engine
                        .logs
                        .append(&self.function, request_id.as_deref(), &stream, &text);
                    if let Some(call) = call {
                        let room = MAX_RECORD_LOG_LINES.saturating_sub(call.logs.len());
                        call.logs.extend(text.lines().take(room).map(str::to_owned));
                    }
                }
                Message::Result {
                    id,
                    status,
                    headers,
                } => {
                    self.answer(
                        id,
                        Reply::Response {
                            status,
                            headers,
                            body,
                        },
                    );
                    self.teach();
                }
                Message::Error { id, status } => self.answer(
                    id,
                    Reply::HandlerError(
                        String::from_utf8_lossy(&body).trim_end().to_owned(),
                        status.unwrap_or(500),
                    ),
                ),
                Message::Fetch {
                    fetch,
                    address,
                    name,
                } => {
                    let (engine, me) = (engine.clone(), self.clone());
                    tokio::spawn(async move {
                        let value = engine.read_published(address, name).await;
                        let frame = protocol::encode(
                            &protocol::Control {
                                op: "fetched",
                                id: fetch,
                                found: value.is_some(),
                            },
                            value.as_deref().unwrap_or_default(),
                        );
                        let _ = me.writer.lock().await.write_all(&frame).await;
                    });
                }
                Message::Ready | Message::InitError => {
                    return Some("the instance restarted its protocol".into())
                }
            }
        }
    }

    fn answer(&self, id: u64, reply: Reply) {
        if let Some(p) = self.pending.lock().unwrap().remove(&id) {
            let _ = p.reply.send((reply, p.logs));
        }
    }

    /// A new call id, and where its reply (with the logs of `request_id`) will arrive.
    fn expect_reply(&self, request_id: &str) -> (u64, oneshot::Receiver<(Reply, Vec<String>)>) {
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(
            id,
            Pending {
                reply: tx,
                request_id: request_id.to_owned(),
                logs: Vec::new(),
            },
        );
        (id, rx)
    }

    /// Sends one invocation and waits for its reply, at most `call.timeout`; past it,
    /// kills the instance ([`Reply::TimedOut`]). The call's log lines come with the
    /// reply, those printed before a timeout or a crash included.
    pub async fn call(&self, call: &Call<'_>) -> (Reply, Vec<String>) {
        let (id, mut rx) = self.expect_reply(call.request_id);
        if self.dead.load(Ordering::SeqCst) {
            self.pending.lock().unwrap().remove(&id);
            return (Reply::Crashed("the instance is gone".into()), Vec::new());
        }
        let frame = protocol::encode(
            &protocol::Request {
                id,
                request_id: call.request_id,
                method: call.method,
                path: call.path,
                query: call.query,
                headers: call.headers,
                timeout_ms: call.timeout.as_millis() as u64,
                export: call.export,
            },
            call.body,
        );
        let sent = async {
            let mut writer = self.writer.lock().await;
            writer.write_all(&frame).await
        };
        let result = tokio::time::timeout(call.timeout + self.grace, async {
            // A write error means the instance is dying: its reply says why.
            let _ = sent.await;
            (&mut rx).await
        })
        .await;
        match result {
            Ok(Ok(reply)) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                reply
            }
            Ok(Err(_)) => (Reply::Crashed("the instance is gone".into()), Vec::new()),
            Err(_) => {
                // Its exit path reads the channel to its end, then hands this call the
                // lines it logged (bounded: a reader stuck elsewhere must not hold us).
                self.kill();
                let logs = match tokio::time::timeout(Duration::from_secs(2), rx).await {
                    Ok(Ok((_, logs))) => logs,
                    _ => self
                        .pending
                        .lock()
                        .unwrap()
                        .remove(&id)
                        .map(|p| p.logs)
                        .unwrap_or_default(),
                };
                (Reply::TimedOut, logs)
            }
        }
    }

    /// Sends a control operation to a wasm worker and waits (up to `limit`) for its
    /// answer: `Ok(body)`, or `Err(why)`.
    pub async fn control(&self, op: &str, body: &[u8], limit: Duration) -> Result<Vec<u8>, String> {
        let (id, rx) = self.expect_reply("");
        let frame = protocol::encode(
            &protocol::Control {
                op,
                id,
                found: false,
            },
            body,
        );
        let _ = self.writer.lock().await.write_all(&frame).await;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok((
                Reply::Response {
                    status: 200, body, ..
                },
                _,
            ))) => Ok(body),
            Ok(Ok((Reply::Response { status, .. }, _))) => Err(format!("status {status}")),
            Ok(Ok((Reply::HandlerError(why, _) | Reply::Crashed(why), _))) => Err(why),
            Ok(Ok((Reply::TimedOut, _))) => Err("timed out".into()),
            Ok(Err(_)) => Err("the worker is gone".into()),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                Err(format!("no answer within {} ms", limit.as_millis()))
            }
        }
    }

    /// After the first reply: what this start touched, for its template's next spares.
    fn teach(self: &Arc<Self>) {
        let Some(template) = self.teaches.lock().unwrap().take() else {
            return;
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            // One stopped meanwhile (scaled to zero) leaves the lesson to the next.
            if let Err(e) = template.learn_from(&me.child) {
                if !me.is_dead() {
                    eprintln!(
                        "skiff: warning: a template could not learn from {}: {e:#}",
                        me.id
                    );
                }
            }
        });
    }

    /// The cold start this instance's first call pays, once.
    pub fn take_cold_start(&self) -> Option<Duration> {
        self.fresh
            .swap(false, Ordering::Relaxed)
            .then_some(self.init)
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Stops the instance; its reader notices and runs the exit path. It counts as dead
    /// from now on, so no call is given to it while it dies.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.child.kill(libc::SIGKILL);
    }

    pub fn memory_bytes(&self, engine: &Engine) -> u64 {
        engine.cgroups.memory_usage(self.cgroup_slot).unwrap_or(0)
    }
}

/// Kills the instance, reaps it, releases its cgroup and network slots; returns how it
/// ended, in words.
async fn reap_and_release(
    engine: &Arc<Engine>,
    child: &Child,
    origin: Option<&TemplateUse>,
    slot: &Slot,
    netns: Option<usize>,
) -> String {
    let _ = child.kill(libc::SIGKILL);
    let mut status = wait_exit(child).await;
    if let (None, Some(origin)) = (status, origin) {
        // A fork's status is its template's to reap.
        let origin = origin.clone();
        status = tokio::task::spawn_blocking(move || origin.exit_status())
            .await
            .ok()
            .flatten();
    }
    let oom = engine.cgroups.oom_killed(slot);
    release_slots(engine, slot.index, netns).await;
    if oom {
        return "the function ran out of memory (killed by the kernel's OOM killer)".into();
    }
    match status {
        Some(ExitStatus::Exited(c)) => format!("the instance exited with {c}"),
        Some(ExitStatus::Signaled(s)) => format!("the instance was killed by signal {s}"),
        None => "the instance vanished".into(),
    }
}

/// Frees a cgroup slot (and a network namespace) once what ran there has ended.
pub async fn release_slots(engine: &Arc<Engine>, slot: usize, netns: Option<usize>) {
    let engine = engine.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Err(e) = engine.cgroups.release(slot) {
            eprintln!("skiff: warning: cannot release cgroup slot {slot}: {e:#}");
        }
        if let Some(n) = netns {
            let _ = engine.netns().map(|p| p.release(n));
        }
    })
    .await;
}

/// Whatever the instance wrote to its log pipe before it exited (at most 64 KiB).
fn drain(log: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(log.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(log.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    while out.len() < 64 << 10 {
        // SAFETY: reading into a valid buffer from a descriptor we own.
        let n = unsafe { libc::read(log.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n as usize]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Waits (without a thread) until the child exits, then reaps it.
/// Waits for `child` to end: its status when it is ours to reap, `None` for a fork of a
/// function template (its template reaps it).
pub async fn wait_exit(child: &Child) -> Option<ExitStatus> {
    use std::os::fd::AsFd;
    // SAFETY: the pidfd belongs to `child`, which outlives this borrow.
    let fd = unsafe {
        AsyncFd::register_with_interest(child.pidfd.as_fd(), tokio::io::Interest::READABLE)
    }
    .ok()?;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // Not our child: its pidfd turns readable when it ends.
            Err(_) => {
                let _ready = fd.readable().await.ok()?;
                return None;
            }
        }
        let mut ready = fd.readable().await.ok()?;
        ready.clear_ready();
    }
}

/// Longest log line kept; the rest of a longer one is dropped.
const MAX_LINE: usize = 16 << 10;

/// The instance's stdout and stderr outside any handler (the interpreter's own
/// messages, native code, child processes): into the function's log, line by line.
async fn read_logs(engine: Arc<Engine>, function: String, log: OwnedFd) {
    use tokio::io::AsyncReadExt;
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(log) else {
        return;
    };
    let mut line = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        for piece in chunk[..n].split_inclusive(|&b| b == b'\n') {
            if line.len() < MAX_LINE {
                line.extend_from_slice(&piece[..piece.len().min(MAX_LINE - line.len())]);
            }
            if piece.ends_with(b"\n") {
                let text = String::from_utf8_lossy(&line);
                engine
                    .logs
                    .append(&function, None, "output", text.trim_end());
                line.clear();
            }
        }
    }
}

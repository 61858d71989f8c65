//! `skiff worker`: the wasm host inside a sandbox. It speaks skiff's framed protocol on
//! its stdin (a socket to the daemon) like the python3 and node bootstraps, and runs
//! each request in a fresh wasm instance on a thread of its own, up to its concurrency.
//!
//! A session's primary holds the session's state ([`skiff_session::Space`]) and serves
//! it to secondaries over `state.sock` in the session's directory; a secondary reaches
//! it there ([`skiff_session::Remote`]). A function without sessions has no state, or,
//! for side-by-side measurement, keeps it in Redis (`SKIFF_STATE_REDIS`).

mod channel;
mod redis_state;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use skiff_session::{Durability, Error as StateError, Locking, Mode, Remote, Space, State};
use skiff_wasm::{Host, Published, Sizing};

use channel::{Channel, Out};

/// What the worker holds of its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No session: stateless (or Redis-backed).
    None,
    Primary,
    Secondary,
}

pub struct Options {
    /// The module compiled at deploy.
    pub module: PathBuf,
    pub concurrency: u32,
    /// Linear memory per request.
    pub memory_bytes: u64,
    pub role: Role,
    /// The session's directory (checkpoint, log, `state.sock`).
    pub state_dir: PathBuf,
    pub durability: Durability,
    pub locking: Locking,
}

/// The primary's state socket, in the session's directory.
pub const STATE_SOCKET: &str = "state.sock";

/// A frame from the daemon: an invocation, or a control operation (`op`).
#[derive(Deserialize)]
struct Incoming {
    id: u64,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    timeout_ms: u64,
    /// A session hook instead of `handle`.
    #[serde(default)]
    export: Option<String>,
    #[serde(default)]
    found: bool,
}

/// Runs until the daemon closes the channel. Errors before `ready` are reported to the
/// daemon as the start's failure.
pub fn run(options: Options) -> Result<()> {
    let channel = Arc::new(Channel::stdin()?);
    match start(&options, &channel) {
        Ok(worker) => worker.serve(&channel),
        Err(e) => {
            channel.send(&Out::InitError, format!("{e:#}").as_bytes());
            Err(e)
        }
    }
}

struct Worker {
    host: Arc<Host>,
    state: Arc<dyn State>,
    space: Option<Arc<Space>>,
    published: Arc<DaemonLinks>,
    jobs: mpsc::Sender<Job>,
}

struct Job {
    id: u64,
    export: String,
    input: Vec<u8>,
    deadline: Instant,
}

fn start(options: &Options, channel: &Arc<Channel>) -> Result<Worker> {
    let host = Arc::new(Host::load(
        &options.module,
        Sizing {
            instances: options.concurrency + 1,
            memory_bytes: options.memory_bytes,
        },
    )?);
    let mut space = None;
    let state: Arc<dyn State> = match options.role {
        Role::Primary => {
            let opened = Arc::new(
                Space::open(&options.state_dir, options.durability, options.locking)
                    .context("restoring the session's state")?,
            );
            let socket = options.state_dir.join(STATE_SOCKET);
            let _ = std::fs::remove_file(&socket);
            let listener = UnixListener::bind(&socket)
                .with_context(|| format!("listening on {}", socket.display()))?;
            skiff_session::serve(opened.clone(), listener)
                .context("serving the state to secondaries")?;
            space = Some(opened.clone());
            opened
        }
        Role::Secondary => {
            let socket = options.state_dir.join(STATE_SOCKET);
            Arc::new(
                Remote::connect(&socket)
                    .with_context(|| format!("reaching the primary at {}", socket.display()))?,
            )
        }
        Role::None => match std::env::var("SKIFF_STATE_REDIS") {
            Ok(address) => Arc::new(redis_state::RedisState::connect(&address)?),
            Err(_) => Arc::new(NoState),
        },
    };
    let published = Arc::new(DaemonLinks {
        channel: channel.clone(),
        waiting: Mutex::new(HashMap::new()),
        next: Mutex::new(1),
    });
    let (jobs, queue) = mpsc::channel::<Job>();
    let queue = Arc::new(Mutex::new(queue));
    for n in 0..options.concurrency + 1 {
        let (queue, host, state, published, channel) = (
            queue.clone(),
            host.clone(),
            state.clone(),
            published.clone(),
            channel.clone(),
        );
        thread::Builder::new()
            .name(format!("request-{n}"))
            .spawn(move || loop {
                let job = match queue.lock().unwrap().recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                execute(&host, &state, &published, &channel, job);
            })?;
    }
    channel.send(&Out::Ready, b"");
    Ok(Worker {
        host,
        state,
        space,
        published,
        jobs,
    })
}

fn execute(
    host: &Host,
    state: &Arc<dyn State>,
    published: &Arc<DaemonLinks>,
    channel: &Channel,
    job: Job,
) {
    let outcome = host.run(skiff_wasm::Request {
        export: &job.export,
        input: job.input,
        txn: job.id,
        deadline: job.deadline,
        state: state.clone(),
        published: published.clone(),
    });
    for (stream, text) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        if !text.is_empty() {
            channel.send(
                &Out::Log {
                    id: Some(job.id),
                    stream,
                },
                text,
            );
        }
    }
    match outcome.failure {
        None => channel.send(
            &Out::Result {
                id: job.id,
                status: 200,
                headers: BTreeMap::new(),
            },
            &outcome.output,
        ),
        Some(why) => {
            let status = if outcome.timed_out { 504 } else { 500 };
            channel.send(&Out::Error { id: job.id, status }, why.as_bytes())
        }
    }
}

impl Worker {
    fn serve(self, channel: &Channel) -> Result<()> {
        while let Some((meta, body)) = channel.recv()? {
            let incoming: Incoming =
                serde_json::from_slice(&meta).context("a frame the worker does not know")?;
            match incoming.op.as_deref() {
                None => {
                    // The worker stops a request itself, just before the daemon would
                    // give up on it: the worker (and the session) live on.
                    let limit = Duration::from_millis(incoming.timeout_ms.max(1));
                    let job = Job {
                        id: incoming.id,
                        export: incoming.export.unwrap_or_else(|| "handle".into()),
                        input: body,
                        deadline: Instant::now() + limit,
                    };
                    self.jobs
                        .send(job)
                        .context("the request threads are gone")?;
                }
                Some("fetched") => self
                    .published
                    .answer(incoming.id, incoming.found.then_some(body)),
                Some("checkpoint") => self.reply(channel, incoming.id, self.checkpoint()),
                Some("dump") => self.reply(channel, incoming.id, self.dump()),
                Some("get") => match self.space().map(|space| space.get(&body)) {
                    Ok(Some(value)) => self.reply(channel, incoming.id, Ok(value)),
                    Ok(None) => channel.send(
                        &Out::Result {
                            id: incoming.id,
                            status: 404,
                            headers: BTreeMap::new(),
                        },
                        b"",
                    ),
                    Err(e) => self.reply(channel, incoming.id, Err(e)),
                },
                Some(other) => bail!("unknown operation {other:?}"),
            }
        }
        // The daemon closed the channel: let running requests end, then leave.
        drop(self.jobs);
        drop((self.host, self.state));
        Ok(())
    }

    fn reply(&self, channel: &Channel, id: u64, result: Result<Vec<u8>>) {
        match result {
            Ok(body) => channel.send(
                &Out::Result {
                    id,
                    status: 200,
                    headers: BTreeMap::new(),
                },
                &body,
            ),
            Err(e) => channel.send(&Out::Error { id, status: 500 }, format!("{e:#}").as_bytes()),
        }
    }

    fn space(&self) -> Result<&Space> {
        self.space
            .as_deref()
            .context("only a session's primary worker holds its state")
    }

    fn checkpoint(&self) -> Result<Vec<u8>> {
        let space = self.space()?;
        let began = Instant::now();
        space.checkpoint().context("writing the checkpoint")?;
        Ok(serde_json::to_vec(&serde_json::json!({
            "keys": space.len(),
            "bytes": space.bytes(),
            "ms": began.elapsed().as_secs_f64() * 1e3,
        }))?)
    }

    /// The state for operators: keys and values as text where they are UTF-8, else
    /// base64 (marked).
    fn dump(&self) -> Result<Vec<u8>> {
        let entries: Vec<_> = self
            .space()?
            .entries()
            .into_iter()
            .map(|(k, v)| serde_json::json!({ "key": text(&k), "value": text(&v), "bytes": v.len() }))
            .collect();
        Ok(serde_json::to_vec(&entries)?)
    }
}

fn text(bytes: &[u8]) -> serde_json::Value {
    use base64::Engine as _;
    match std::str::from_utf8(bytes) {
        Ok(s) => s.into(),
        Err(_) => {
            serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) })
        }
    }
}

/// A function without sessions: every state call says so.
struct NoState;

impl State for NoState {
    fn read(&self, _: u64, _: &[u8], _: Mode, _: Instant) -> Result<Option<Vec<u8>>, StateError> {
        Err(no_session())
    }
    fn write(&self, _: u64, _: &[u8], _: &[u8], _: Mode, _: Instant) -> Result<(), StateError> {
        Err(no_session())
    }
    fn delete(&self, _: u64, _: &[u8], _: Instant) -> Result<bool, StateError> {
        Err(no_session())
    }
    fn finish(&self, _: u64) {}
}

fn no_session() -> StateError {
    StateError::Unavailable("the function has no session".into())
}

/// Values other sessions published, fetched through the daemon (which restores the
/// publisher if it was checkpointed): the address stays valid across restores.
struct DaemonLinks {
    channel: Arc<Channel>,
    waiting: Mutex<HashMap<u64, mpsc::Sender<Option<Vec<u8>>>>>,
    next: Mutex<u64>,
}

impl DaemonLinks {
    fn answer(&self, fetch: u64, value: Option<Vec<u8>>) {
        if let Some(tx) = self.waiting.lock().unwrap().remove(&fetch) {
            let _ = tx.send(value);
        }
    }
}

impl Published for DaemonLinks {
    fn read(
        &self,
        address: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, StateError> {
        let fetch = {
            let mut next = self.next.lock().unwrap();
            *next += 1;
            *next
        };
        let (tx, rx) = mpsc::channel();
        self.waiting.lock().unwrap().insert(fetch, tx);
        self.channel.send(
            &Out::Fetch {
                fetch,
                address,
                name,
            },
            b"",
        );
        let got = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        self.waiting.lock().unwrap().remove(&fetch);
        got.map_err(|_| StateError::Unavailable("the publisher did not answer in time".into()))
    }
}

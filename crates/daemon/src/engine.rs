//! The engine: deployed functions, their warm instances and the scheduling around them
//! (cold starts, `max_instances`, a bounded queue, keep-alive and scale to zero,
//! `min_instances`, timeouts, crashes), and one sandbox per request for `binary`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use serde_json::json;
use skiff_cgroups::CgroupPool;
use skiff_sandbox::netns::NetnsPool;
use skiff_sandbox::RemoteSpawner;
use tokio::sync::{oneshot, Semaphore};

use crate::instance::{Call, Instance, Reply, SessionRole, StartError};
use crate::invocations::{Invocations, Record, Status};
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::registry::{Function, Network, Registry, Runtime};
use skiff_pool::SERVE_OWNER_PREFIX;

mod session_pools;

pub struct Engine {
    pub data: PathBuf,
    pub spawner: RemoteSpawner,
    pub cgroups: CgroupPool,
    netns: OnceLock<NetnsPool>,
    pub dev_template: PathBuf,
    pub registry: Registry,
    pub logs: Logs,
    pub invocations: Invocations,
    pub metrics: Metrics,
    functions: Mutex<HashMap<String, Arc<FnPool>>>,
    /// Live sessions by id: each a pool of its own, the primary first.
    sessions: Mutex<HashMap<String, Arc<FnPool>>>,
    /// Per session: held while its primary starts or while it closes, so a restore
    /// never reads a checkpoint that is still being written.
    session_gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Versions replaced or removed whose instances may still be ending: shutdown waits
    /// for them too, so their slots are released.
    retired: Mutex<Vec<std::sync::Weak<FnPool>>>,
    pub hints: crate::sessions::Sessions,
    pub templates: crate::templates::Templates,
    /// Templates of python3 functions with packages, one per function.
    pub fn_templates: crate::fn_templates::FunctionTemplates,
    /// Cold starts of python3 fork from a template (else: the interpreter starts).
    pub use_templates: bool,
}

/// One deployed version of a function and what runs for it.
pub struct FnPool {
    pub function: Function,
    state: Mutex<State>,
    /// `binary`: sandboxes running, bounded by `max_instances`, and requests waiting.
    binary_slots: Arc<Semaphore>,
    binary_waiting: AtomicUsize,
    /// Set for one session's pool.
    session: Option<SessionPool>,
}

/// What a session's pool knows of its session.
pub struct SessionPool {
    pub id: String,
    dir: PathBuf,
    gate: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct State {
    instances: Vec<Arc<Instance>>,
    /// Instances being started: for a caller that will use it, or for the queue.
    starting: usize,
    starting_for_queue: usize,
    waiters: VecDeque<Waiter>,
    /// Replaced by a new deploy or removed: instances end as they become idle.
    retired: bool,
}

/// A request waiting for room on an instance.
struct Waiter {
    tx: oneshot::Sender<Result<Lease, String>>,
    /// An accepted async call: it waits as long as it takes, beyond the queue's bound.
    patient: bool,
}

/// A call's hold on one unit of an instance's concurrency, given back when dropped:
/// also when the HTTP client goes away and its handler's future is dropped mid-call, or
/// when a lease handed to a queued request is never received.
pub struct Lease {
    fp: Arc<FnPool>,
    engine: Arc<Engine>,
    instance: Option<Arc<Instance>>,
}

impl Lease {
    fn new(fp: &Arc<FnPool>, engine: &Arc<Engine>, instance: Arc<Instance>) -> Lease {
        Lease {
            fp: fp.clone(),
            engine: engine.clone(),
            instance: Some(instance),
        }
    }

    fn instance(&self) -> &Arc<Instance> {
        self.instance.as_ref().expect("an armed lease")
    }

    /// The instance, without giving the unit back (the caller does, under its lock).
    fn disarm(mut self) -> Arc<Instance> {
        self.instance.take().expect("an armed lease")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(instance) = self.instance.take() {
            self.fp.release(&self.engine, &instance);
        }
    }
}

/// An HTTP request for a function, as the engine passes it on.
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// What the caller answers.
pub struct Response {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// An error answer's message, which the invocation's record keeps.
    pub error: Option<String>,
}

impl Response {
    /// A JSON `{"error": message}` answer.
    fn error(status: u16, message: impl Into<String>) -> Response {
        let message = message.into();
        Response {
            status,
            headers: BTreeMap::from([("content-type".into(), "application/json".into())]),
            body: serde_json::to_vec(&json!({ "error": message })).unwrap(),
            error: Some(message),
        }
    }
}

#[derive(Serialize)]
pub struct InstanceInfo {
    pub id: String,
    pub function: String,
    pub pid: i32,
    pub cgroup_slot: usize,
    pub inflight: u32,
    pub served: u64,
    pub idle_ms: u64,
    pub init_ms: f64,
    pub memory_bytes: u64,
    pub started: String,
    /// A session's worker: the session's id, and whether it is its primary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
}

impl Engine {
    pub fn new(
        data: PathBuf,
        spawner: RemoteSpawner,
        keep_records: Duration,
        use_templates: bool,
        template_memory: u64,
    ) -> Result<(Engine, Vec<(Record, crate::invocations::StoredRequest)>)> {
        let (invocations, unfinished) = Invocations::open(&data, keep_records)?;
        let dev_template = skiff_sandbox::devices::ensure(&data)?;
        let engine = Engine {
            registry: Registry::open(&data)?,
            cgroups: CgroupPool::open(&data)?,
            netns: OnceLock::new(),
            logs: Logs::open(&data)?,
            invocations,
            metrics: Metrics::default(),
            functions: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            session_gates: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            hints: crate::sessions::Sessions::open(&data)?,
            templates: crate::templates::Templates::new(dev_template.clone()),
            fn_templates: crate::fn_templates::FunctionTemplates::new(template_memory),
            dev_template,
            use_templates,
            data,
            spawner,
        };
        engine.reclaim_previous_daemon()?;
        Ok((engine, unfinished))
    }

    /// A daemon killed with SIGKILL leaves claims on cgroup (and netns) slots whose
    /// instances died with it (they have a parent-death signal): free them. Only one
    /// daemon serves a data directory (the caller holds its lock), so every `serve-`
    /// claim is a leftover.
    fn reclaim_previous_daemon(&self) -> Result<()> {
        for claim in self.cgroups.claims()? {
            if claim.owner.starts_with(SERVE_OWNER_PREFIX) {
                self.cgroups.empty(claim.slot)?;
                self.cgroups.unclaim(claim.slot)?;
            }
        }
        if self.data.join("pool").join("netns").exists() {
            for claim in self.netns()?.claims()? {
                if claim.owner.starts_with(SERVE_OWNER_PREFIX) {
                    self.netns()?.release(claim.slot)?;
                }
            }
        }
        Ok(())
    }

    /// The root directory of the environment `env`.
    pub fn env_root(&self, env: &str) -> PathBuf {
        self.data.join("envs").join(env).join("root")
    }

    pub fn netns(&self) -> Result<&NetnsPool> {
        if let Some(pool) = self.netns.get() {
            return Ok(pool);
        }
        let pool = NetnsPool::open(&self.data)?;
        Ok(self.netns.get_or_init(|| pool))
    }

    /// The function's pool, loaded from the registry on first use.
    pub fn function(&self, name: &str) -> Option<Arc<FnPool>> {
        let mut functions = self.functions.lock().unwrap();
        if let Some(fp) = functions.get(name) {
            return Some(fp.clone());
        }
        let f = self.registry.get(name)?;
        let fp = FnPool::new(f);
        functions.insert(name.to_owned(), fp.clone());
        Some(fp)
    }

    /// Makes `fp` the function's current version; the one it replaces retires.
    pub fn install(self: &Arc<Self>, fp: Arc<FnPool>) {
        self.close_sessions_of(&fp.function.name);
        self.fn_templates
            .forget_unless(&fp.function.name, &fp.function.env);
        let old = self
            .functions
            .lock()
            .unwrap()
            .insert(fp.function.name.clone(), fp);
        if let Some(old) = old {
            self.retire(&old);
        }
    }

    pub fn uninstall(self: &Arc<Self>, name: &str) {
        self.close_sessions_of(name);
        self.fn_templates.forget(name);
        let old = self.functions.lock().unwrap().remove(name);
        if let Some(old) = old {
            self.retire(&old);
        }
    }

    fn retire(&self, old: &Arc<FnPool>) {
        old.retire();
        let mut retired = self.retired.lock().unwrap();
        retired.retain(|w| w.strong_count() > 0);
        retired.push(Arc::downgrade(old));
    }

    pub fn pools(&self) -> Vec<Arc<FnPool>> {
        self.functions.lock().unwrap().values().cloned().collect()
    }

    pub fn instances(&self) -> Vec<InstanceInfo> {
        let mut all = Vec::new();
        let sessions: Vec<_> = self.sessions.lock().unwrap().values().cloned().collect();
        for fp in self.pools().into_iter().chain(sessions) {
            for i in fp.state.lock().unwrap().instances.iter() {
                all.push(InstanceInfo {
                    id: i.id.clone(),
                    function: i.function.clone(),
                    pid: i.pid,
                    cgroup_slot: i.cgroup_slot,
                    inflight: i.inflight.load(Ordering::Relaxed),
                    served: i.served.load(Ordering::Relaxed),
                    idle_ms: i.last_used.lock().unwrap().elapsed().as_millis() as u64,
                    init_ms: i.init.as_secs_f64() * 1e3,
                    memory_bytes: i.memory_bytes(self),
                    started: humantime::format_rfc3339_millis(i.started).to_string(),
                    session: fp.session.as_ref().map(|s| s.id.clone()),
                    role: fp.session.as_ref().map(
                        |_| {
                            if i.primary {
                                "primary"
                            } else {
                                "secondary"
                            }
                        },
                    ),
                });
            }
        }
        for t in self.fn_templates.all() {
            all.push(InstanceInfo {
                id: t.id.clone(),
                function: t.function.clone(),
                pid: t.child.pid,
                cgroup_slot: t.slot.index,
                inflight: 0,
                served: 0,
                idle_ms: t.idle().as_millis() as u64,
                init_ms: t.init.as_secs_f64() * 1e3,
                memory_bytes: t.memory_bytes(self),
                started: humantime::format_rfc3339_millis(t.started).to_string(),
                session: None,
                role: Some("template"),
            });
        }
        all.sort_by(|a, b| (&a.function, &a.id).cmp(&(&b.function, &b.id)));
        all
    }

    /// Invokes `fp` with `request`, filling `record`.
    pub async fn invoke(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
        record: &mut Record,
    ) -> Response {
        let began = Instant::now();
        self.metrics.inflight.fetch_add(1, Ordering::Relaxed);
        let response = if fp.function.runtime == Runtime::Binary {
            self.invoke_binary(fp, request, record).await
        } else if fp.function.session.is_some() {
            self.invoke_session(fp, request, record).await
        } else {
            self.invoke_instance(fp, request, record, None).await
        };
        self.metrics.inflight.fetch_sub(1, Ordering::Relaxed);
        if record.status == Status::Queued && fp.is_retired() {
            // An async call whose version was replaced before it started: it stays
            // queued, for the caller to run on the new version.
            return response;
        }
        record.duration_ms = began.elapsed().as_secs_f64() * 1e3;
        record.end = Some(crate::invocations::now_rfc3339());
        record.http_status = Some(response.status);
        record.error = response.error.clone();
        // The function's own answers succeed (a 404 of its own included); the
        // platform's (a full queue, a crash, a timeout) and the function's errors fail.
        record.status = if response.error.is_none() && response.status < 500 {
            Status::Succeeded
        } else {
            Status::Failed
        };
        let cold = record
            .cold_start
            .then(|| Duration::from_secs_f64(record.init_ms / 1e3));
        self.metrics
            .record(&fp.function.name, response.status, began.elapsed(), cold);
        response
    }

    /// Runs `request` on an instance of `fp`: `handle`, or the wasm export `export`.
    async fn invoke_instance(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
        record: &mut Record,
        export: Option<&str>,
    ) -> Response {
        let waited = Instant::now();
        let lease = match self.acquire(fp, record.is_async).await {
            Ok(lease) => lease,
            Err((status, message)) => {
                return Response::error(status, message);
            }
        };
        self.started(record);
        let instance = lease.instance();
        if let Some(init) = instance.take_cold_start() {
            record.cold_start = true;
            record.init_ms = init.as_secs_f64() * 1e3;
        }
        record.queue_ms = (waited.elapsed().as_secs_f64() * 1e3 - record.init_ms).max(0.0);
        record.instance = Some(instance.id.clone());
        let timeout = Duration::from_millis(fp.function.timeout_ms);
        let call = Call {
            request_id: &record.id,
            method: &request.method,
            path: &request.path,
            query: &request.query,
            headers: &request.headers,
            body: &request.body,
            timeout,
            export,
        };
        let (reply, logs) = instance.call(&call).await;
        record.logs = logs;
        let response = match reply {
            Reply::Response {
                status,
                headers,
                body,
            } => Response {
                status,
                headers,
                body,
                error: None,
            },
            // The record keeps the trace (and the crash's cause) without the
            // answer's preamble.
            Reply::HandlerError(trace, 504) => Response::error(504, trace),
            Reply::HandlerError(trace, status) => Response {
                error: Some(trace.clone()),
                ..Response::error(status, format!("the function raised an error:\n{trace}"))
            },
            Reply::Crashed(why) => Response {
                error: Some(why.clone()),
                ..Response::error(502, format!("the function crashed: {why}"))
            },
            Reply::TimedOut => {
                let message = format!("the function timed out after {} ms", timeout.as_millis());
                Response::error(504, message)
            }
        };
        drop(lease);
        response
    }

    /// An accepted async call got its instance or sandbox: its record says it runs.
    fn started(&self, record: &mut Record) {
        if record.is_async {
            record.status = Status::Running;
            if let Err(err) = self.invocations.put(record, None) {
                eprintln!(
                    "skiff: warning: cannot store invocation {}: {err}",
                    record.id
                );
            }
        }
    }

    /// A warm instance with room, a new one, or a place in the queue. A `patient`
    /// caller (an accepted async call) is never refused for a full queue and waits as
    /// long as it takes.
    async fn acquire(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        patient: bool,
    ) -> Result<Lease, (u16, String)> {
        let queue_wait = Duration::from_millis(fp.function.timeout_ms);
        loop {
            let waiter = {
                let mut st = fp.state.lock().unwrap();
                if st.retired {
                    return Err((503, "the function was redeployed or removed; retry".into()));
                }
                if let Some(i) = fp.pick(&st) {
                    i.inflight.fetch_add(1, Ordering::Relaxed);
                    return Ok(Lease::new(fp, self, i));
                }
                if fp.may_start(&st) && st.waiters.len() >= fp.room_coming(&st) {
                    st.starting += 1;
                    None
                } else if patient
                    || st.waiters.iter().filter(|w| !w.patient).count()
                        < fp.function.scale.queue as usize
                {
                    let (tx, rx) = oneshot::channel();
                    st.waiters.push_back(Waiter { tx, patient });
                    Some(rx)
                } else {
                    return Err((
                        429,
                        format!(
                            "{}: all {} instances are busy and {} requests are queued",
                            fp.function.name,
                            fp.function.scale.max_instances,
                            fp.function.scale.queue
                        ),
                    ));
                }
            };
            let Some(rx) = waiter else {
                // The start runs on its own task: a caller that goes away mid-start
                // must not strand the reservation (the lease it leaves behind is
                // dropped, giving the new instance to the pool).
                let (tx, rx) = oneshot::channel();
                let (fp, engine) = (fp.clone(), self.clone());
                tokio::spawn(async move {
                    let started = fp.start_instance(&engine, false).await;
                    let _ = tx.send(started.map(|i| Lease::new(&fp, &engine, i)));
                });
                return match rx.await {
                    Ok(Ok(lease)) => Ok(lease),
                    Ok(Err(message)) => Err((502, message)),
                    Err(_) => Err((500, "the instance's start was abandoned".into())),
                };
            };
            let waited = if patient {
                Ok(rx.await)
            } else {
                tokio::time::timeout(queue_wait, rx).await
            };
            match waited {
                Ok(Ok(Ok(lease))) => return Ok(lease),
                Ok(Ok(Err(message))) => return Err((502, message)),
                // The queue was dropped (a redeploy): look again.
                Ok(Err(_)) => continue,
                Err(_) => {
                    return Err((
                        503,
                        format!(
                            "{}: no instance became free within {} ms",
                            fp.function.name,
                            queue_wait.as_millis()
                        ),
                    ))
                }
            }
        }
    }

    async fn invoke_binary(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
        record: &mut Record,
    ) -> Response {
        let waited = Instant::now();
        let permit = match fp.binary_slots.clone().try_acquire_owned() {
            Ok(p) => p,
            // An accepted async call waits for a sandbox as long as it takes.
            Err(_) if record.is_async => match fp.binary_slots.clone().acquire_owned().await {
                Ok(p) => p,
                Err(_) => return Response::error(503, "the function's sandboxes are closed"),
            },
            Err(_) => {
                if fp.binary_waiting.fetch_add(1, Ordering::SeqCst)
                    >= fp.function.scale.queue as usize
                {
                    fp.binary_waiting.fetch_sub(1, Ordering::SeqCst);
                    return Response::error(
                        429,
                        format!("{}: the queue is full", fp.function.name),
                    );
                }
                let wait = Duration::from_millis(fp.function.timeout_ms);
                let got = tokio::time::timeout(wait, fp.binary_slots.clone().acquire_owned()).await;
                fp.binary_waiting.fetch_sub(1, Ordering::SeqCst);
                match got {
                    Ok(Ok(p)) => p,
                    _ => {
                        return Response::error(
                            503,
                            format!("{}: no sandbox became free in time", fp.function.name),
                        )
                    }
                }
            }
        };
        record.queue_ms = waited.elapsed().as_secs_f64() * 1e3;
        self.started(record);
        let netns = match fp.function.network {
            Network::None => match self
                .netns()
                .and_then(|p| p.acquire(&format!("{SERVE_OWNER_PREFIX}{}", record.id)))
            {
                Ok(claimed) => Some(claimed),
                Err(e) => return Response::error(503, format!("no network namespace free: {e:#}")),
            },
            Network::Host => None,
        };
        let job = crate::invoke::Job {
            env_root: self.env_root(&fp.function.env),
            dev_template: self.dev_template.clone(),
            function: fp.function.clone(),
            body: request.body.clone(),
            env: crate::invoke::request_env(request),
            netns: netns.as_ref().and_then(|(_, fd)| fd.try_clone().ok()),
        };
        let engine = self.clone();
        // The sandbox's slot and network namespace are held by the blocking task: they
        // stay taken while it runs, even if this caller goes away.
        let ran = tokio::task::spawn_blocking(move || {
            let ran = crate::invoke::run(&engine.spawner, &engine.cgroups, job);
            drop(permit);
            if let Some((slot, _)) = netns {
                let _ = engine.netns().map(|p| p.release(slot));
            }
            ran
        })
        .await;
        let Ok(ran) = ran else {
            return Response::error(500, "the invocation's thread panicked");
        };
        record.cold_start = true;
        record.init_ms = ran.start.as_secs_f64() * 1e3;
        let stderr = String::from_utf8_lossy(&ran.stderr);
        if !stderr.is_empty() {
            self.logs
                .append(&fp.function.name, Some(&record.id), "stderr", &stderr);
            record.logs = stderr.lines().take(100).map(str::to_owned).collect();
        }
        use crate::invoke::Outcome;
        let (status, message) = match ran.outcome {
            Outcome::Ok(out) => {
                return Response {
                    status: 200,
                    headers: BTreeMap::new(),
                    body: out,
                    error: None,
                }
            }
            Outcome::Crashed(m) => (502, m),
            Outcome::TimedOut => (
                504,
                format!("the function timed out after {} ms", fp.function.timeout_ms),
            ),
            Outcome::Overloaded(m) => (503, m),
            Outcome::Failed(m) => (500, m),
        };
        Response::error(status, message)
    }

    /// Every second: idle instances past keep-alive end (down to `min_instances`), and
    /// functions below `min_instances` get started.
    pub async fn keep_alive_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            for fp in self.pools() {
                fp.expire_idle();
                fp.fill_minimum(&self);
            }
            self.expire_sessions();
        }
    }

    /// Stops every instance and waits (up to 5 s) until they are reaped and their
    /// slots released (daemon shutdown).
    pub async fn stop_all(self: &Arc<Self>) {
        self.close_all_sessions().await;
        let mut pools = self.pools();
        pools.extend(
            self.retired
                .lock()
                .unwrap()
                .iter()
                .filter_map(|w| w.upgrade()),
        );
        for fp in &pools {
            fp.retire();
            for i in fp.state.lock().unwrap().instances.iter() {
                i.kill();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && pools
                .iter()
                .any(|fp| !fp.state.lock().unwrap().instances.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.templates.clear();
        self.fn_templates.clear().await;
    }

    /// Queue depth and instances, per function, for `/metrics`.
    pub fn gauges(&self) -> Vec<(String, usize, usize)> {
        self.pools()
            .iter()
            .map(|fp| {
                let st = fp.state.lock().unwrap();
                let queued = st.waiters.len() + fp.binary_waiting.load(Ordering::Relaxed);
                // Only binary invocations take the semaphore's permits.
                let binary_running = (fp.function.scale.max_instances.max(1) as usize)
                    .saturating_sub(fp.binary_slots.available_permits());
                let running = st.instances.len() + binary_running;
                (fp.function.name.clone(), running, queued)
            })
            .collect()
    }
}

impl FnPool {
    pub fn new(function: Function) -> Arc<FnPool> {
        FnPool::with_session(function, None)
    }

    fn with_session(function: Function, session: Option<SessionPool>) -> Arc<FnPool> {
        let slots = function.scale.max_instances.max(1) as usize;
        Arc::new(FnPool {
            function,
            state: Mutex::new(State::default()),
            binary_slots: Arc::new(Semaphore::new(slots)),
            binary_waiting: AtomicUsize::new(0),
            session,
        })
    }

    pub fn is_retired(&self) -> bool {
        self.state.lock().unwrap().retired
    }

    /// The instance with room that was used last (so the others go idle and expire);
    /// in a session, the first with room, the primary before secondaries (bin-packing:
    /// state calls in the primary need no RPC).
    fn pick(&self, st: &State) -> Option<Arc<Instance>> {
        let room = self.function.scale.concurrency.max(1);
        let mut open = st
            .instances
            .iter()
            .filter(|i| !i.is_dead() && i.inflight.load(Ordering::Relaxed) < room);
        if self.session.is_some() {
            return open.next().cloned();
        }
        open.max_by_key(|i| *i.last_used.lock().unwrap()).cloned()
    }

    /// Calls the instances starting now will take besides the ones they start for: a
    /// request that fits there waits for them rather than starting one more (with
    /// `concurrency` above 1, a burst would otherwise start an instance per request).
    fn room_coming(&self, st: &State) -> usize {
        let per_instance = self.function.scale.concurrency.max(1) as usize;
        let for_callers = st.starting - st.starting_for_queue;
        for_callers * (per_instance - 1) + st.starting_for_queue * per_instance
    }

    /// Whether another instance may start now: below `max_instances`, and in a session
    /// only once its primary is up (secondaries need it).
    fn may_start(&self, st: &State) -> bool {
        let total = st.instances.len() + st.starting;
        if self.session.is_some() && !st.instances.iter().any(|i| !i.is_dead()) {
            return st.starting == 0;
        }
        total < self.function.scale.max_instances as usize
    }

    /// Starts an instance (a slot in `starting` was reserved by the caller). For a
    /// caller (`for_queue` false) it comes back busy with one call; for the queue it
    /// goes to the waiters.
    pub async fn start_instance(
        self: &Arc<Self>,
        engine: &Arc<Engine>,
        for_queue: bool,
    ) -> Result<Arc<Instance>, String> {
        let weak = Arc::downgrade(self);
        let engine_for_exit = engine.clone();
        let role = self.session.as_ref().map(|s| SessionRole {
            primary: !self
                .state
                .lock()
                .unwrap()
                .instances
                .iter()
                .any(|i| !i.is_dead()),
            dir: s.dir.clone(),
        });
        // A primary restores the session: not while an earlier one still checkpoints.
        let _gate = match (&self.session, &role) {
            (Some(s), Some(r)) if r.primary => Some(s.gate.clone().lock_owned().await),
            _ => None,
        };
        let started = Instance::start(engine, &self.function, role, move |gone| {
            if let Some(fp) = weak.upgrade() {
                fp.forget(&engine_for_exit, gone);
            }
        })
        .await;
        let mut st = self.state.lock().unwrap();
        st.starting -= 1;
        if for_queue {
            st.starting_for_queue -= 1;
        }
        match started {
            Ok(i) => {
                if st.retired {
                    i.kill();
                    return Err("the function was redeployed or removed; retry".into());
                }
                if self.session.is_some()
                    && !i.primary
                    && !st.instances.iter().any(|j| j.primary && !j.is_dead())
                {
                    i.kill();
                    return Err("the session's primary worker ended; retry".into());
                }
                if !for_queue {
                    i.inflight.fetch_add(1, Ordering::Relaxed);
                } else if st.waiters.is_empty() {
                    // Started ahead (a deploy, min_instances): nobody waited for it.
                    let _ = i.take_cold_start();
                }
                st.instances.push(i.clone());
                self.dispatch(engine, &mut st);
                Ok(i)
            }
            Err(e) => {
                let message = match e {
                    StartError::Init(m) => format!("the function failed to start: {m}"),
                    StartError::Platform(e) => format!("cannot start an instance: {e:#}"),
                };
                if for_queue {
                    if let Some(w) = st.waiters.pop_front() {
                        let _ = w.tx.send(Err(message.clone()));
                    }
                }
                self.dispatch(engine, &mut st);
                Err(message)
            }
        }
    }

    /// A call ended on `instance`.
    fn release(self: &Arc<Self>, engine: &Arc<Engine>, instance: &Arc<Instance>) {
        let mut st = self.state.lock().unwrap();
        instance.inflight.fetch_sub(1, Ordering::Relaxed);
        *instance.last_used.lock().unwrap() = Instant::now();
        if st.retired && instance.inflight.load(Ordering::Relaxed) == 0 {
            instance.kill();
        }
        self.dispatch(engine, &mut st);
    }

    /// Hands free room to waiting requests, and starts instances for those no free
    /// room or starting instance will serve.
    fn dispatch(self: &Arc<Self>, engine: &Arc<Engine>, st: &mut State) {
        while !st.waiters.is_empty() {
            let Some(i) = self.pick(st) else { break };
            let waiter = st.waiters.pop_front().expect("not empty");
            i.inflight.fetch_add(1, Ordering::Relaxed);
            if let Err(Ok(lease)) = waiter.tx.send(Ok(Lease::new(self, engine, i))) {
                // That request gave up waiting.
                lease.disarm().inflight.fetch_sub(1, Ordering::Relaxed);
            }
        }
        st.waiters.retain(|w| !w.tx.is_closed());
        while !st.retired && st.waiters.len() > self.room_coming(st) && self.may_start(st) {
            self.start_in_background(engine, st);
        }
    }

    /// Starts an instance on a task of its own; it joins the pool (and the queue's
    /// front, if anyone waits) when ready.
    fn start_in_background(self: &Arc<Self>, engine: &Arc<Engine>, st: &mut State) {
        st.starting += 1;
        st.starting_for_queue += 1;
        let (fp, engine) = (self.clone(), engine.clone());
        tokio::spawn(async move {
            let _ = fp.start_instance(&engine, true).await;
        });
    }

    /// An instance is gone (crashed, timed out, expired): forget it, and serve the queue.
    fn forget(self: &Arc<Self>, engine: &Arc<Engine>, gone: &Arc<Instance>) {
        let mut st = self.state.lock().unwrap();
        st.instances.retain(|i| !Arc::ptr_eq(i, gone));
        if gone.primary {
            // Secondaries reach the state through the primary: the session starts over
            // (the next primary restores it).
            for i in st.instances.iter() {
                i.kill();
            }
        }
        self.dispatch(engine, &mut st);
    }

    /// Starts one idle instance now (a deploy's check that the function loads); the
    /// error says why it does not.
    pub async fn prewarm(self: &Arc<Self>, engine: &Arc<Engine>) -> Result<(), String> {
        {
            let mut st = self.state.lock().unwrap();
            st.starting += 1;
            st.starting_for_queue += 1;
        }
        self.start_instance(engine, true).await.map(|_| ())
    }

    fn expire_idle(&self) {
        let keep = Duration::from_millis(self.function.scale.keep_alive_ms);
        let st = self.state.lock().unwrap();
        let mut alive = st.instances.iter().filter(|i| !i.is_dead()).count();
        for i in st.instances.iter() {
            if alive <= self.function.scale.min_instances as usize {
                break;
            }
            if i.inflight.load(Ordering::Relaxed) == 0
                && !i.is_dead()
                && i.last_used.lock().unwrap().elapsed() > keep
            {
                i.kill();
                alive -= 1;
            }
        }
    }

    fn fill_minimum(self: &Arc<Self>, engine: &Arc<Engine>) {
        if self.function.runtime == Runtime::Binary {
            return;
        }
        let mut st = self.state.lock().unwrap();
        let min = self.function.scale.min_instances as usize;
        while !st.retired && st.instances.len() + st.starting < min {
            self.start_in_background(engine, &mut st);
        }
    }

    /// Stops the idle instances now (scale to zero on demand) and waits (up to 5 s)
    /// until they are gone; returns how many were stopped.
    pub async fn stop_idle(&self) -> usize {
        let idle: Vec<Arc<Instance>> = {
            let st = self.state.lock().unwrap();
            st.instances
                .iter()
                .filter(|i| i.inflight.load(Ordering::Relaxed) == 0)
                .cloned()
                .collect()
        };
        for i in &idle {
            i.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self
                .state
                .lock()
                .unwrap()
                .instances
                .iter()
                .any(|i| idle.iter().any(|j| Arc::ptr_eq(i, j)))
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        idle.len()
    }

    /// No new calls; idle instances end now, busy ones when their calls end.
    pub fn retire(&self) {
        let mut st = self.state.lock().unwrap();
        st.retired = true;
        st.waiters.clear();
        for i in st.instances.iter() {
            if i.inflight.load(Ordering::Relaxed) == 0 {
                i.kill();
            }
        }
    }
}

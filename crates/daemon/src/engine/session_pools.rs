//! Sessions (XFaaS §3): a request of a function with `session:` is routed by its
//! session's id to that session's own pool of wasm workers: the primary (which holds
//! the state) first, secondaries when it is full. Idle past keep-alive, a session is
//! checkpointed and its workers end; the next request restores it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use skiff_manifest::SessionKey;

use super::{Engine, FnPool, Request, Response, SessionPool, State};
use crate::invocations::Record;
use crate::sessions::SESSION_HEADER;

/// How long a closing session waits for its running requests before it checkpoints.
const CLOSE_WAIT: Duration = Duration::from_secs(30);
/// How long a checkpoint (or another control operation) may take.
const CONTROL_LIMIT: Duration = Duration::from_secs(60);

#[derive(Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub function: String,
    /// Workers running (0: checkpointed on disk only).
    pub workers: usize,
    pub inflight: u32,
    pub idle_ms: Option<u64>,
    pub disk_bytes: u64,
}

impl FnPool {
    /// The function's `session:` (only session functions come here).
    fn session_config(&self) -> &crate::registry::Session {
        self.function.session.as_ref().expect("a session function")
    }

    fn for_session(function: &crate::registry::Function, session: SessionPool) -> Arc<FnPool> {
        let mut function = function.clone();
        let config = function.session.as_ref().expect("a session function");
        function.scale.concurrency = config.max_concurrency;
        function.scale.keep_alive_ms = config.keep_alive_ms;
        function.scale.min_instances = 0;
        // Workers of one session beyond the node's CPUs add no parallelism, only context
        // switches and RPC hops to the primary (measured: 4 workers on 2 CPUs served a
        // hot key at half the rate of 1); at least one secondary stays possible.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        function.scale.max_instances = function.scale.max_instances.min(cpus.max(2));
        FnPool::with_session(function, Some(session))
    }

    fn primary(&self) -> Option<Arc<crate::instance::Instance>> {
        let st = self.state.lock().unwrap();
        st.instances
            .iter()
            .find(|i| i.primary && !i.is_dead())
            .cloned()
    }
}

impl Engine {
    /// Routes a request to its session (made or restored as needed) and runs it there.
    pub(super) async fn invoke_session(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
        record: &mut Record,
    ) -> Response {
        let id = match self.session_of(fp, request).await {
            Ok(id) => id,
            Err(refused) => return refused,
        };
        record.session = Some(id.clone());
        let hint = self.hints.hint(&id);
        // A closing session's pool refuses new calls; its successor restores it.
        for _ in 0..100 {
            let pool = match self.session_pool(fp, &id) {
                Ok(pool) => pool,
                Err(e) => return Response::error(500, format!("{e:#}")),
            };
            let mut response = self.invoke_instance(&pool, request, record, None).await;
            if response.status == 503 && pool.is_retired() {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            response.headers.insert(SESSION_HEADER.into(), hint);
            return response;
        }
        Response::error(503, "the session kept closing; retry")
    }

    /// The session a request names: by its hint (which must be genuine and of this
    /// function), else by the key the function's rule finds in it.
    async fn session_of(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
    ) -> Result<String, Response> {
        let name = &fp.function.name;
        let from_key = self
            .session_key(fp, request)
            .await?
            .map(|key| self.hints.id(name, &key));
        let Some(hint) = request.headers.get(SESSION_HEADER) else {
            let rule = &fp.session_config().key;
            return from_key.ok_or_else(|| {
                Response::error(
                    400,
                    format!("{name} needs a session: the request has no {rule} and no {SESSION_HEADER} header"),
                )
            });
        };
        let forged = || {
            Response::error(
                403,
                format!("the {SESSION_HEADER} hint is not valid for {name}"),
            )
        };
        let id = self.hints.verify(hint).ok_or_else(forged)?;
        if from_key.as_ref().is_some_and(|k| *k != id) {
            return Err(Response::error(
                403,
                format!("the {SESSION_HEADER} hint names another session than the request's key"),
            ));
        }
        match self.owner_of(&id) {
            Some(owner) if owner != *name => Err(forged()),
            _ => Ok(id),
        }
    }

    /// The request's session key by the function's rule; `None` when it has none.
    async fn session_key(
        self: &Arc<Self>,
        fp: &Arc<FnPool>,
        request: &Request,
    ) -> Result<Option<Vec<u8>>, Response> {
        Ok(match &fp.session_config().key {
            SessionKey::Header(h) => request
                .headers
                .get(&h.to_ascii_lowercase())
                .map(|v| v.as_bytes().to_vec()),
            SessionKey::Query(q) => request
                .query
                .split('&')
                .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
                .find(|(k, _)| k == q)
                .map(|(_, v)| v.as_bytes().to_vec()),
            SessionKey::Json(pointer) => serde_json::from_slice::<serde_json::Value>(&request.body)
                .ok()
                .and_then(|body| body.pointer(pointer).cloned())
                .map(|v| match v {
                    serde_json::Value::String(s) => s.into_bytes(),
                    other => other.to_string().into_bytes(),
                }),
            SessionKey::Wasm(export) => {
                // The hook runs like any request of the function, outside any session.
                let mut record =
                    Record::new(crate::invocations::new_id(), &fp.function.name, false);
                let answer = self
                    .invoke_instance(fp, request, &mut record, Some(export))
                    .await;
                if answer.status != 200 {
                    let why = answer
                        .error
                        .unwrap_or_else(|| format!("status {}", answer.status));
                    return Err(Response::error(
                        answer.status.max(500),
                        format!("the session hook {export} failed: {why}"),
                    ));
                }
                (!answer.body.is_empty()).then_some(answer.body)
            }
        })
    }

    /// The live pool of session `id`, made on first use.
    fn session_pool(&self, fp: &Arc<FnPool>, id: &str) -> anyhow::Result<Arc<FnPool>> {
        let mut sessions = self.sessions.lock().unwrap();
        if let Some(pool) = sessions.get(id) {
            if !pool.is_retired() {
                return Ok(pool.clone());
            }
        }
        let dir = self.hints.prepare(id, &fp.function.name)?;
        let gate = self
            .session_gates
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default()
            .clone();
        let pool = FnPool::for_session(
            &fp.function,
            SessionPool {
                id: id.to_owned(),
                dir,
                gate,
            },
        );
        sessions.insert(id.to_owned(), pool.clone());
        self.metrics.sessions_opened.fetch_add(1, Ordering::Relaxed);
        Ok(pool)
    }

    /// Sessions idle past their keep-alive close (checkpoint, then their workers end).
    pub(super) fn expire_sessions(self: &Arc<Self>) {
        let pools: Vec<_> = self.sessions.lock().unwrap().values().cloned().collect();
        for pool in pools {
            let keep = Duration::from_millis(pool.function.scale.keep_alive_ms);
            let idle = {
                let mut st = pool.state.lock().unwrap();
                let idle = !st.retired
                    && st.starting == 0
                    && st.waiters.is_empty()
                    && st.instances.iter().all(|i| {
                        i.inflight.load(Ordering::Relaxed) == 0
                            && i.last_used.lock().unwrap().elapsed() > keep
                    });
                // Retired under the same lock: no call can slip in before the close.
                st.retired |= idle;
                idle
            };
            if idle {
                let engine = self.clone();
                tokio::spawn(async move { engine.close_session(&pool, true).await });
            }
        }
    }

    /// Ends a session's workers: waits for running calls, checkpoints the primary's
    /// state (when `checkpoint`), stops them all, and forgets the pool. Returns the
    /// checkpoint's failure, if any.
    async fn close_session(&self, pool: &Arc<FnPool>, checkpoint: bool) -> Result<(), String> {
        let session = pool.session.as_ref().expect("a session pool");
        let gate = session.gate.clone();
        let _closing = gate.lock().await;
        pool.state.lock().unwrap().retired = true;
        let began = Instant::now();
        while began.elapsed() < CLOSE_WAIT
            && pool
                .state
                .lock()
                .unwrap()
                .instances
                .iter()
                .any(|i| i.inflight.load(Ordering::Relaxed) > 0)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut result = Ok(());
        if checkpoint {
            if let Some(primary) = pool.primary() {
                result = primary
                    .control("checkpoint", b"", CONTROL_LIMIT)
                    .await
                    .map(|_| ());
                match &result {
                    Ok(()) => self
                        .metrics
                        .session_checkpoints
                        .fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!(
                            "skiff: warning: checkpoint of session {} failed: {e}",
                            session.id
                        );
                        self.metrics
                            .session_checkpoint_failures
                            .fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }
        let instances: Vec<_> = pool.state.lock().unwrap().instances.clone();
        for i in &instances {
            i.kill();
        }
        while began.elapsed() < CLOSE_WAIT + Duration::from_secs(5)
            && !pool.state.lock().unwrap().instances.is_empty()
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut sessions = self.sessions.lock().unwrap();
        if sessions
            .get(&session.id)
            .is_some_and(|p| Arc::ptr_eq(p, pool))
        {
            sessions.remove(&session.id);
        }
        result
    }

    /// A redeploy or removal: the function's sessions checkpoint and end (the new
    /// version restores them).
    pub(super) fn close_sessions_of(self: &Arc<Self>, function: &str) {
        let pools: Vec<_> = self
            .sessions
            .lock()
            .unwrap()
            .values()
            .filter(|p| p.function.name == function)
            .cloned()
            .collect();
        for pool in pools {
            let engine = self.clone();
            tokio::spawn(async move { engine.close_session(&pool, true).await });
        }
    }

    /// Daemon shutdown: every session checkpoints.
    pub(super) async fn close_all_sessions(self: &Arc<Self>) {
        let pools: Vec<_> = self.sessions.lock().unwrap().values().cloned().collect();
        let closing: Vec<_> = pools
            .into_iter()
            .map(|pool| {
                let engine = self.clone();
                tokio::spawn(async move { engine.close_session(&pool, true).await })
            })
            .collect();
        for c in closing {
            let _ = c.await;
        }
    }

    /// A value published by the session at `address` (its hint), restoring that session
    /// if it is not running.
    /// Boxed: a worker's fetch may start instances whose own fetches come back here.
    pub fn read_published(
        self: Arc<Self>,
        address: String,
        name: String,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Vec<u8>>> + Send>> {
        Box::pin(async move { self.published_value(&address, &name).await })
    }

    async fn published_value(self: &Arc<Self>, address: &str, name: &str) -> Option<Vec<u8>> {
        let id = self.hints.verify(address)?;
        let function = self.hints.function_of(&id)?;
        let fp = self.function(&function)?;
        fp.function.session.as_ref()?;
        for _ in 0..100 {
            let pool = self.session_pool(&fp, &id).ok()?;
            // A lease makes sure the primary runs (a restore, if it was checkpointed).
            let Ok(lease) = self.acquire(&pool, false).await else {
                if pool.is_retired() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                return None;
            };
            let primary = pool.primary()?;
            let key = skiff_wasm::published_key(name.as_bytes());
            let value = primary.control("get", &key, CONTROL_LIMIT).await.ok();
            drop(lease);
            return value;
        }
        None
    }

    /// Live sessions and those checkpointed on disk.
    pub fn session_infos(&self) -> Vec<SessionInfo> {
        let live = self.sessions.lock().unwrap().clone();
        self.hints
            .on_disk()
            .into_iter()
            .map(|(id, function)| {
                let (workers, inflight, idle_ms) = match live.get(&id) {
                    Some(pool) => {
                        let st: &State = &pool.state.lock().unwrap();
                        (
                            st.instances.len(),
                            st.instances
                                .iter()
                                .map(|i| i.inflight.load(Ordering::Relaxed))
                                .sum(),
                            st.instances
                                .iter()
                                .map(|i| i.last_used.lock().unwrap().elapsed().as_millis() as u64)
                                .min(),
                        )
                    }
                    None => (0, 0, None),
                };
                SessionInfo {
                    disk_bytes: self.hints.disk_bytes(&id),
                    id,
                    function,
                    workers,
                    inflight,
                    idle_ms,
                }
            })
            .collect()
    }

    /// Live sessions and their workers, for `/metrics`.
    pub fn session_gauges(&self) -> (usize, usize) {
        let sessions = self.sessions.lock().unwrap();
        let workers = sessions
            .values()
            .map(|p| p.state.lock().unwrap().instances.len())
            .sum();
        (sessions.len(), workers)
    }

    /// The function session `id` belongs to: its live pool's, else what its directory
    /// says (no file read per request of a running session).
    fn owner_of(&self, id: &str) -> Option<String> {
        let live = self
            .sessions
            .lock()
            .unwrap()
            .get(id)
            .map(|p| p.function.name.clone());
        live.or_else(|| self.hints.function_of(id))
    }

    /// The running primary of session `id`, started (restored) if needed, with a lease
    /// that keeps the session open while an operator looks at it.
    async fn open_primary(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<(super::Lease, Arc<crate::instance::Instance>), (u16, String)> {
        let function = self
            .hints
            .function_of(id)
            .ok_or_else(|| (404, format!("no session {id}")))?;
        let fp = self.function(&function).ok_or_else(|| {
            (
                404,
                format!("session {id}'s function {function} is not deployed"),
            )
        })?;
        let pool = self
            .session_pool(&fp, id)
            .map_err(|e| (500, format!("{e:#}")))?;
        let lease = self.acquire(&pool, false).await?;
        let primary = pool
            .primary()
            .ok_or_else(|| (503, "the session's primary ended".to_string()))?;
        Ok((lease, primary))
    }

    /// Runs control operation `op` on session `id`'s primary (restoring the session if
    /// needed): `dump` for an operator's look at its state, `checkpoint` to write it now.
    pub async fn session_control(
        self: &Arc<Self>,
        id: &str,
        op: &str,
    ) -> Result<Vec<u8>, (u16, String)> {
        let (lease, primary) = self.open_primary(id).await?;
        let answer = primary
            .control(op, b"", CONTROL_LIMIT)
            .await
            .map_err(|e| (500, e));
        if op == "checkpoint" && answer.is_ok() {
            self.metrics
                .session_checkpoints
                .fetch_add(1, Ordering::Relaxed);
        }
        drop(lease);
        answer
    }

    /// Closes a live session now (checkpoint, workers end), as keep-alive would.
    pub async fn close_session_now(&self, id: &str) -> Result<(), (u16, String)> {
        if self.hints.function_of(id).is_none() {
            return Err((404, format!("no session {id}")));
        }
        let live = self.sessions.lock().unwrap().get(id).cloned();
        match live {
            Some(pool) => self.close_session(&pool, true).await.map_err(|e| (500, e)),
            None => Ok(()),
        }
    }

    /// Deletes a session: its workers end and its state is gone.
    pub async fn delete_session(self: &Arc<Self>, id: &str) -> Result<(), (u16, String)> {
        if self.hints.function_of(id).is_none() {
            return Err((404, format!("no session {id}")));
        }
        let live = self.sessions.lock().unwrap().get(id).cloned();
        if let Some(pool) = live {
            let _ = self.close_session(&pool, false).await;
        }
        let gate = self.session_gates.lock().unwrap().get(id).cloned();
        let _held = match &gate {
            Some(g) => Some(g.lock().await),
            None => None,
        };
        self.hints
            .dir(id)
            .and_then(std::fs::remove_dir_all)
            .map_err(|e| (500, format!("removing the session's files: {e}")))
    }
}

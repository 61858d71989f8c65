//! `skiff serve`: one process answering HTTP/1.1 on a Unix socket and on TCP, with the
//! function registry, the store, logs and invocation records in the data directory (no
//! outside service). The HTTP layer here only translates: scheduling lives in
//! [`engine`], sandboxes come from a [`RemoteSpawner`] forked before the async runtime.

mod engine;
mod fn_templates;
mod instance;
mod invocations;
mod invoke;
mod logs;
mod metrics;
mod names;
mod openapi;
mod protocol;
mod registry;
mod sessions;
mod templates;

pub use registry::remove_scratch;
pub use sessions::SESSION_HEADER;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, RawPathParams, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;
use skiff_sandbox::RemoteSpawner;
use skiff_store::Store;

use engine::{Engine, FnPool};
use invocations::{Record, Status, StoredRequest};
use registry::{Function, Runtime};

/// A body's size limit, named in its 413.
#[derive(Clone, Copy)]
struct Limit {
    bytes: usize,
    what: &'static str,
}

/// Largest deploy (a tar of the function's directory) and invocation body.
const DEPLOY_LIMIT: Limit = Limit {
    bytes: 256 << 20,
    what: "a deploy",
};
const BODY_LIMIT: Limit = Limit {
    bytes: 6 << 20,
    what: "an invocation",
};
/// How long a request's head may take to arrive (slowloris), and how long its body may
/// go without a byte.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_IDLE: Duration = Duration::from_secs(10);
/// Connections waiting to be accepted, per socket (the kernel caps it at somaxconn).
const ACCEPT_BACKLOG: i32 = 4096;

pub struct Config {
    pub data: PathBuf,
    pub socket: PathBuf,
    pub listen: SocketAddr,
    /// How long invocation records are kept.
    pub keep_records: Duration,
    /// python3 cold starts fork from a template process (else the interpreter starts).
    pub templates: bool,
    /// Threads that serve HTTP and dispatch calls.
    pub threads: usize,
    /// Bytes idle function templates may hold together.
    pub template_memory: u64,
}

/// Which listener a request came in on: deploying a host path is for the Unix socket
/// (whose permissions say who may), never for TCP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Unix,
    Tcp,
}

/// An error answered as JSON `{"error": ...}` with its status.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn not_found(name: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no function named {name:?}"))
}

fn too_large(limit: Limit) -> ApiError {
    ApiError(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the body is larger than the {} MiB limit of {}",
            limit.bytes >> 20,
            limit.what
        ),
    )
}

/// A body that stalled: 408, and the connection closes (its body was not read to end).
fn body_stalled() -> ApiError {
    ApiError(
        StatusCode::REQUEST_TIMEOUT,
        format!("no byte of the body arrived for {} s", BODY_IDLE.as_secs()),
    )
}

/// Whether `e` (or what caused it) is a body that stalled.
fn is_stalled(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<BodyStalled>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// An invocation's body that could not be read (too large, stalled, cut off) as a JSON
/// error.
fn body_error(e: BytesRejection) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(BODY_LIMIT)
    } else if is_stalled(&e) {
        body_stalled()
    } else {
        ApiError(status, e.body_text())
    }
}

/// The error a stalled body gives its reader.
#[derive(Debug)]
struct BodyStalled;

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no byte of the body arrived for {} s",
            BODY_IDLE.as_secs()
        )
    }
}

impl std::error::Error for BodyStalled {}

/// A request body that fails with [`BodyStalled`] when no frame comes for [`BODY_IDLE`].
struct IdleBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl axum::body::HttpBody for IdleBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + BODY_IDLE;
                this.deadline.as_mut().reset(next);
                Poll::Ready(frame)
            }
            Poll::Pending => match std::future::Future::poll(this.deadline.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyStalled)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Every request, before its handler: a declared length past the route's limit is
/// refused before a byte of the body is read (so `Expect: 100-continue` gets no
/// `100 Continue`), and the body must keep arriving.
async fn guard_body(request: Request, next: Next) -> Response {
    let limit = if request.method() == Method::POST && request.uri().path() == "/v1/functions" {
        DEPLOY_LIMIT
    } else {
        BODY_LIMIT
    };
    let declared = request
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit.bytes as u64) {
        return too_large(limit).into_response();
    }
    if axum::body::HttpBody::is_end_stream(request.body()) {
        return next.run(request).await;
    }
    let request = request.map(|inner| {
        Body::new(IdleBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(BODY_IDLE)),
        })
    });
    next.run(request).await
}

/// Every route's path parameters (a function's name, an invocation's or a session's
/// id) are names, checked here once for all routes; only the path a function is
/// invoked with (`rest`) is the function's own business.
async fn check_names(params: RawPathParams, request: Request, next: Next) -> Response {
    for (key, value) in &params {
        if key != "rest" {
            let kind = match key {
                "name" => "function name",
                "id" => "id",
                other => other,
            };
            if let Err(message) = names::check(kind, value) {
                return ApiError(StatusCode::BAD_REQUEST, message).into_response();
            }
        }
    }
    next.run(request).await
}

/// Runs the daemon until SIGINT or SIGTERM. `spawner` was forked while the caller was
/// still single-threaded.
pub fn serve(config: Config, spawner: RemoteSpawner) -> Result<()> {
    std::fs::create_dir_all(&config.data)
        .with_context(|| format!("cannot create {}", config.data.display()))?;
    let lock_path = config.data.join(skiff_pool::SERVE_LOCK);
    let _lock = skiff_pool::try_lock_file(&lock_path)?.with_context(|| {
        format!(
            "another skiff serve is using {} (it holds {})",
            config.data.display(),
            lock_path.display()
        )
    })?;
    // Deploys a crash interrupted (this daemon holds the lock: none is running).
    remove_scratch(&config.data, false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (engine, unfinished) = Engine::new(
            config.data.clone(),
            spawner,
            config.keep_records,
            config.templates,
            config.template_memory,
        )?;
        let engine = Arc::new(engine);
        tokio::spawn(engine.clone().keep_alive_loop());
        for (record, request) in unfinished {
            resume_async(&engine, record, request);
        }
        if let Some(dir) = config.socket.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(&config.socket);
        let unix = tokio::net::UnixListener::bind(&config.socket)
            .with_context(|| format!("cannot listen on {}", config.socket.display()))?;
        let tcp = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        // A longer accept queue than the default 1024: a burst of a thousand clients
        // connecting at once must wait in it, not have SYNs dropped (a 1 s retry).
        for fd in [unix.as_raw_fd(), tcp.as_raw_fd()] {
            // SAFETY: listen(2) again on our own listening socket only resizes its queue.
            unsafe { libc::listen(fd, ACCEPT_BACKLOG) };
        }
        eprintln!(
            "skiff: serving on {} and http://{} (data {})",
            config.socket.display(),
            config.listen,
            config.data.display()
        );
        let shutdown = || async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        let on_unix = serve_on(unix, router(engine.clone(), Via::Unix), shutdown());
        let on_tcp = serve_on(tcp, router(engine.clone(), Via::Tcp), shutdown());
        tokio::join!(on_unix, on_tcp);
        let _ = std::fs::remove_file(&config.socket);
        engine.stop_all().await;
        Ok(())
    })
}

/// Serves HTTP/1.1 on `listener` until `shutdown`, then lets the open connections
/// finish. A request's head must arrive within [`HEADER_TIMEOUT`] (also the longest
/// an idle keep-alive connection stays open).
async fn serve_on<L: axum::serve::Listener>(
    mut listener: L,
    router: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop, stopping) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let connection = builder
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop.send(());
    drop(stopping);
    stop.closed().await;
}

fn router(engine: Arc<Engine>, via: Via) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route("/v1/functions", get(list).post(deploy))
        .route("/v1/functions/{name}", get(describe).delete(remove))
        .route("/v1/functions/{name}/logs", get(logs))
        .route(
            "/v1/functions/{name}/instances",
            axum::routing::delete(stop_instances),
        )
        .route("/v1/instances", get(instances))
        .route("/v1/invocations", get(list_invocations))
        .route("/v1/invocations/{id}", get(get_invocation))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{id}", delete(delete_session))
        .route("/v1/sessions/{id}/state", get(session_state))
        .route("/v1/sessions/{id}/checkpoint", post(checkpoint_session))
        .route("/v1/sessions/{id}/close", post(close_session))
        .route("/fn/{name}", any(invoke))
        .route("/fn/{name}/{*rest}", any(invoke_path))
        .route("/function/{name}", any(invoke))
        .route("/function/{name}/{*rest}", any(invoke_path))
        .route("/async/{name}", post(invoke_async))
        .route("/async/{name}/{*rest}", post(invoke_async_path))
        .route("/async-function/{name}", post(invoke_async))
        .route("/async-function/{name}/{*rest}", post(invoke_async_path))
        .route_layer(axum::middleware::from_fn(check_names))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(BODY_LIMIT.bytes))
        .layer(axum::middleware::from_fn(guard_body))
        .layer(Extension(via))
        .with_state(engine)
}

/// Liveness, and which data directory this daemon serves (`skiff ps` checks it).
async fn healthz(State(e): State<Arc<Engine>>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "data": e.data }))
}

async fn metrics(State(e): State<Arc<Engine>>) -> impl IntoResponse {
    let functions = e.registry.list().map_or(0, |l| l.len());
    (
        [("content-type", "text/plain; version=0.0.4")],
        e.metrics.render(functions, &e.gauges(), e.session_gauges()) + &e.fn_templates.metrics(&e),
    )
}

async fn list_sessions(State(e): State<Arc<Engine>>) -> impl IntoResponse {
    Json(e.session_infos())
}

/// A session answer's body (JSON the worker made), or its error.
fn session_answer(answer: Result<Vec<u8>, (u16, String)>) -> Result<impl IntoResponse, ApiError> {
    let body = answer.map_err(|(status, message)| {
        ApiError(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message,
        )
    })?;
    Ok(([("content-type", "application/json")], body))
}

/// `GET /v1/sessions/ID/state`: the session's keys and values, for operators.
async fn session_state(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    session_answer(e.session_control(&id, "dump").await)
}

/// `POST /v1/sessions/ID/checkpoint`: write the session's checkpoint now.
async fn checkpoint_session(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    session_answer(e.session_control(&id, "checkpoint").await)
}

/// `POST /v1/sessions/ID/close`: checkpoint, then the workers end (as on idle); the
/// next request restores the session.
async fn close_session(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    session_answer(e.close_session_now(&id).await.map(|()| Vec::new()))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/sessions/ID`: the session's workers end and its state is removed.
async fn delete_session(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    session_answer(e.delete_session(&id).await.map(|()| Vec::new()))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list(State(e): State<Arc<Engine>>) -> Result<Json<Vec<Function>>, ApiError> {
    e.registry.list().map(Json).map_err(internal)
}

async fn describe(
    State(e): State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let f = e.registry.get(&name).ok_or_else(|| not_found(&name))?;
    let instances: Vec<_> = e
        .instances()
        .into_iter()
        .filter(|i| i.function == name)
        .collect();
    let mut value = serde_json::to_value(f).map_err(internal)?;
    value["instances"] = serde_json::to_value(instances).map_err(internal)?;
    Ok(Json(value))
}

async fn remove(
    State(e): State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    let lock = e.registry.lock(&name);
    let _held = lock.lock().await;
    match e.registry.remove(&name) {
        Ok(true) => {
            e.uninstall(&name);
            e.logs.remove(&name);
            Ok(StatusCode::NO_CONTENT)
        }
        Ok(false) => Err(not_found(&name)),
        Err(err) => Err(internal(err)),
    }
}

#[derive(Deserialize)]
struct DeployQuery {
    /// A directory on the daemon's host to deploy instead of a tar body.
    path: Option<PathBuf>,
}

/// `POST /v1/functions`: a tar (or gzipped tar) of the function's directory, or
/// `?path=DIR` (Unix socket only). The body goes to a scratch file as it arrives, is
/// unpacked as hostile input and built; for python3/node one instance starts, so a
/// function that cannot load is refused with its error rather than deployed. Deploys
/// and removals of one name run one at a time; whatever fails leaves no scratch.
async fn deploy(
    State(e): State<Arc<Engine>>,
    Extension(via): Extension<Via>,
    Query(query): Query<DeployQuery>,
    body: Body,
) -> Result<(StatusCode, Json<Function>), ApiError> {
    if query.path.is_some() && via == Via::Tcp {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "deploying a path on the host is only allowed over the Unix socket".into(),
        ));
    }
    let scratch = e.registry.scratch();
    match query.path {
        Some(dir) => {
            let out = scratch.body.clone();
            tokio::task::spawn_blocking(move || tar_host_dir(&dir, &out))
                .await
                .map_err(internal)??
        }
        None => spool(body, &scratch.body).await?,
    }
    let (e2, scratch) = (e.clone(), Arc::new(scratch));
    let s2 = scratch.clone();
    let manifest = tokio::task::spawn_blocking(move || unpack(&e2, &s2))
        .await
        .map_err(internal)??;
    let lock = e.registry.lock(&manifest.name.0);
    let _held = lock.lock().await;
    let (e2, s2) = (e.clone(), scratch.clone());
    let f = tokio::task::spawn_blocking(move || build(&e2, &s2.dir, manifest))
        .await
        .map_err(internal)??;
    let fp = FnPool::new(f.clone());
    if f.runtime != Runtime::Binary {
        if let Err(message) = fp.prewarm(&e).await {
            fp.retire();
            e.fn_templates.forget_version(&f.name, &f.env);
            let message = hide_paths(&e, &scratch.dir, &message);
            return Err(ApiError(StatusCode::BAD_REQUEST, message));
        }
    }
    let (e2, f2) = (e.clone(), f.clone());
    let installed = tokio::task::spawn_blocking(move || -> Result<()> {
        let target = e2.registry.source_dir(&f2.name)?;
        let _ = std::fs::remove_dir_all(&target);
        std::fs::rename(&scratch.dir, &target)?;
        e2.registry.put(&f2)
    })
    .await
    .map_err(internal)?;
    if let Err(err) = installed {
        fp.retire();
        return Err(internal(err));
    }
    e.install(fp);
    Ok((StatusCode::CREATED, Json(f)))
}

/// Writes a deploy's body to `path` as it arrives, up to the deploy limit.
async fn spool(body: Body, path: &std::path::Path) -> Result<(), ApiError> {
    use tokio::io::AsyncWriteExt;
    use tokio_stream::StreamExt;
    let mut file = tokio::fs::File::create(path).await.map_err(internal)?;
    let mut stream = body.into_data_stream();
    let mut written = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            if is_stalled(&e) {
                body_stalled()
            } else {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("the body was cut off: {e}"),
                )
            }
        })?;
        written += chunk.len();
        if written > DEPLOY_LIMIT.bytes {
            return Err(too_large(DEPLOY_LIMIT));
        }
        file.write_all(&chunk).await.map_err(internal)?;
    }
    file.flush().await.map_err(internal)
}

/// A tar of the host directory `dir` at `out` (a deploy by path, over the Unix socket).
fn tar_host_dir(dir: &std::path::Path, out: &std::path::Path) -> Result<(), ApiError> {
    if !dir.is_absolute() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("{} is not an absolute path", dir.display()),
        ));
    }
    let file = std::fs::File::create(out).map_err(internal)?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir).map_err(|err| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("cannot read {}: {err}", dir.display()),
        )
    })?;
    tar.into_inner()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .map_err(internal)?;
    Ok(())
}

/// Unpacks the deploy's archive into its scratch directory; returns its manifest.
fn unpack(e: &Engine, scratch: &registry::Scratch) -> Result<skiff_manifest::Manifest, ApiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let bad = |message: String| ApiError(StatusCode::BAD_REQUEST, message);
    skiff_builder::unpack::unpack(
        &scratch.body,
        &scratch.dir,
        &skiff_builder::unpack::FUNCTION_LIMITS,
    )
    .map_err(|err| {
        bad(format!(
            "the body is not a tar of the function's directory: {}",
            hide_paths(e, &scratch.dir, &format!("{err:#}"))
        ))
    })?;
    // Not through a symlink: what it points to is not the deployer's to read.
    let mut text = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(scratch.dir.join(skiff_manifest::FILE_NAME))
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ELOOP) => bad("skiff.yaml is a symlink; it must be a file".into()),
            _ => bad("the function has no skiff.yaml".into()),
        })?;
    // Errors name the file as the user knows it, not our scratch copy.
    skiff_manifest::Manifest::parse(&text, skiff_manifest::FILE_NAME)
        .map_err(|err| bad(err.to_string()))
}

/// `text` without the host paths of the deploy's scratch directory and the data
/// directory: errors are for the deployer, who knows neither.
fn hide_paths(e: &Engine, scratch: &std::path::Path, text: &str) -> String {
    text.replace(&format!("{}/", scratch.display()), "")
        .replace(&scratch.display().to_string(), ".")
        .replace(&e.data.display().to_string(), "DATA")
}

/// Builds the unpacked function in `dir` (the manifest read from it).
fn build(
    e: &Engine,
    dir: &std::path::Path,
    manifest: skiff_manifest::Manifest,
) -> Result<Function, ApiError> {
    let store = Store::open(&e.data).map_err(internal)?;
    let built = skiff_builder::build(&store, dir, &mut |_| {}).map_err(|err| {
        ApiError(
            StatusCode::BAD_REQUEST,
            hide_paths(e, dir, &format!("{err:#}")),
        )
    })?;
    Ok(Function {
        name: manifest.name.0.clone(),
        runtime: manifest.runtime,
        handler: manifest.handler,
        env: built.id,
        memory_bytes: manifest.limits.memory.0,
        cpus: manifest.limits.cpu.0,
        pids: manifest.limits.pids.0,
        timeout_ms: manifest.limits.timeout.0.as_millis() as u64,
        vars: manifest.env,
        network: manifest.network,
        scale: registry::Scale::from(&manifest.scale),
        session: manifest.session.as_ref().map(registry::Session::from),
        deployed_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    })
}

async fn instances(State(e): State<Arc<Engine>>) -> Json<Vec<engine::InstanceInfo>> {
    Json(e.instances())
}

/// `DELETE /v1/functions/NAME/instances`: scale to zero now (idle instances stop; busy
/// ones finish their calls).
async fn stop_instances(
    State(e): State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let fp = e.function(&name).ok_or_else(|| not_found(&name))?;
    let stopped = fp.stop_idle().await;
    Ok(Json(json!({ "stopped": stopped })))
}

#[derive(Deserialize)]
struct ListQuery {
    function: Option<String>,
    limit: Option<usize>,
}

async fn list_invocations(
    State(e): State<Arc<Engine>>,
    Query(q): Query<ListQuery>,
) -> Json<Vec<Record>> {
    Json(
        e.invocations
            .list(q.function.as_deref(), q.limit.unwrap_or(100)),
    )
}

async fn get_invocation(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Record>, ApiError> {
    e.invocations.get(&id).map(Json).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no invocation {id:?} (records are kept for a while, then dropped)"),
        )
    })
}

#[derive(Deserialize)]
struct LogsQuery {
    tail: Option<usize>,
    invocation: Option<String>,
    follow: Option<bool>,
}

/// A function's log as JSON lines; `follow=true` keeps the response open and streams
/// new lines as they are written.
async fn logs(
    State(e): State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    if e.registry.get(&name).is_none() {
        return Err(not_found(&name));
    }
    let lines = e
        .logs
        .read(&name, q.invocation.as_deref(), q.tail.unwrap_or(100));
    let mut text = String::new();
    for line in &lines {
        text.push_str(&serde_json::to_string(line).map_err(internal)?);
        text.push('\n');
    }
    if !q.follow.unwrap_or(false) {
        return Ok(([("content-type", "application/x-ndjson")], text).into_response());
    }
    let file = e.logs.file(&name).ok_or_else(|| not_found(&name))?;
    let start = std::fs::metadata(&file).map_or(0, |m| m.len());
    let invocation = q.invocation.clone();
    let stream = follow(text, file, start, invocation);
    Ok((
        [("content-type", "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The backlog, then whatever is appended to `file` after `offset` (polled every
/// 200 ms, as `tail -f` does), filtered to one invocation if given.
fn follow(
    backlog: String,
    file: PathBuf,
    offset: u64,
    invocation: Option<String>,
) -> tokio_stream::wrappers::ReceiverStream<Result<Bytes, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        if tx.send(Ok(Bytes::from(backlog))).await.is_err() {
            return;
        }
        let mut offset = offset;
        let mut partial = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if tx.is_closed() {
                return;
            }
            let Ok(mut f) = tokio::fs::File::open(&file).await else {
                continue;
            };
            let len = f.metadata().await.map_or(0, |m| m.len());
            if len < offset {
                // Rotated: start over on the new file.
                offset = 0;
            }
            if len == offset {
                continue;
            }
            let mut chunk = Vec::new();
            if f.seek(std::io::SeekFrom::Start(offset)).await.is_err()
                || f.read_to_end(&mut chunk).await.is_err()
            {
                continue;
            }
            offset += chunk.len() as u64;
            partial.extend_from_slice(&chunk);
            let cut = partial
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            let complete: Vec<u8> = partial.drain(..cut).collect();
            let mut out = Vec::new();
            for line in complete.split_inclusive(|&b| b == b'\n') {
                let wanted = invocation.as_ref().is_none_or(|id| {
                    serde_json::from_slice::<logs::Line>(line)
                        .is_ok_and(|l| l.invocation.as_deref() == Some(id))
                });
                if wanted {
                    out.extend_from_slice(line);
                }
            }
            if !out.is_empty() && tx.send(Ok(Bytes::from(out))).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The request as the engine passes it on.
fn request_of(
    path: String,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> engine::Request {
    engine::Request {
        method: method.to_string(),
        path,
        query: uri.query().unwrap_or("").to_owned(),
        headers: headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        body: body.to_vec(),
    }
}

async fn invoke_path(
    state: State<Arc<Engine>>,
    UrlPath((name, rest)): UrlPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    invoke_with(state, name, format!("/{rest}"), method, uri, headers, body).await
}

async fn invoke(
    state: State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    invoke_with(state, name, "/".into(), method, uri, headers, body).await
}

async fn invoke_with(
    State(e): State<Arc<Engine>>,
    name: String,
    path: String,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return body_error(rejection).into_response(),
    };
    let Some(fp) = e.function(&name) else {
        return not_found(&name).into_response();
    };
    let request = request_of(path, &method, &uri, &headers, body);
    let mut record = Record::new(invocations::new_id(), &name, false);
    let response = e.invoke(&fp, &request, &mut record).await;
    let _ = e.invocations.put(&record, None);
    let mut out = Response::new(Body::from(response.body));
    *out.status_mut() = StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (k, v) in &response.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::try_from(k.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            out.headers_mut().insert(k, v);
        }
    }
    let h = out.headers_mut();
    h.insert(
        "x-skiff-invocation-id",
        HeaderValue::try_from(record.id.as_str()).expect("hex id"),
    );
    if record.cold_start {
        h.insert("x-skiff-cold-start", HeaderValue::from_static("true"));
    }
    out
}

async fn invoke_async_path(
    state: State<Arc<Engine>>,
    UrlPath((name, rest)): UrlPath<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, HeaderMap, Json<serde_json::Value>), ApiError> {
    invoke_async_with(state, name, format!("/{rest}"), uri, headers, body)
}

async fn invoke_async(
    state: State<Arc<Engine>>,
    UrlPath(name): UrlPath<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, HeaderMap, Json<serde_json::Value>), ApiError> {
    invoke_async_with(state, name, "/".into(), uri, headers, body)
}

/// `POST /async/NAME`: 202 with the invocation's id once it is on disk; it runs in the
/// background, `GET /v1/invocations/ID` has its status and result, and an
/// `X-Callback-Url` header (OpenFaaS's) receives the result as a POST.
fn invoke_async_with(
    State(e): State<Arc<Engine>>,
    name: String,
    path: String,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, HeaderMap, Json<serde_json::Value>), ApiError> {
    let body = body.map_err(body_error)?;
    if e.registry.get(&name).is_none() {
        return Err(not_found(&name));
    }
    let mut record = Record::new(invocations::new_id(), &name, true);
    if let Some(url) = headers.get("x-callback-url").and_then(|v| v.to_str().ok()) {
        if !url.starts_with("http://") {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("X-Callback-Url {url:?}: only http:// URLs are supported"),
            ));
        }
        record.callback_url = Some(url.to_owned());
    }
    let request = request_of(path, &Method::POST, &uri, &headers, body);
    let stored = StoredRequest {
        method: request.method.clone(),
        path: request.path.clone(),
        query: request.query.clone(),
        headers: request.headers.clone(),
        body_base64: base64_encode(&request.body),
    };
    e.invocations
        .put(&record, Some(&stored))
        .map_err(internal)?;
    let id = record.id.clone();
    resume_async(&e, record, stored);
    let mut h = HeaderMap::new();
    h.insert(
        "x-call-id",
        HeaderValue::try_from(id.as_str()).expect("hex id"),
    );
    h.insert(
        "location",
        HeaderValue::try_from(format!("/v1/invocations/{id}")).expect("ascii"),
    );
    Ok((
        StatusCode::ACCEPTED,
        h,
        Json(json!({ "id": id, "status": "queued" })),
    ))
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Runs an accepted async invocation in the background (also those a previous
/// daemon accepted and did not finish). It waits for room as long as it takes: an
/// accepted call is never refused for a full queue.
fn resume_async(e: &Arc<Engine>, mut record: Record, stored: StoredRequest) {
    let e = e.clone();
    tokio::spawn(async move {
        use base64::Engine as _;
        let request = engine::Request {
            method: stored.method,
            path: stored.path,
            query: stored.query,
            headers: stored.headers,
            body: base64::engine::general_purpose::STANDARD
                .decode(&stored.body_base64)
                .unwrap_or_default(),
        };
        // Queued until it has its instance or sandbox (the engine marks it running
        // then); one a previous daemon was running starts over.
        record.status = Status::Queued;
        let mut tried: Option<Arc<FnPool>> = None;
        let response = loop {
            match e.function(&record.function) {
                // A version that could not start it is being replaced (or the daemon
                // stops, and the call waits on disk for the next one).
                Some(fp) if tried.as_ref().is_some_and(|t| Arc::ptr_eq(t, &fp)) => return,
                Some(fp) => {
                    let response = e.invoke(&fp, &request, &mut record).await;
                    if record.status != Status::Queued {
                        break response;
                    }
                    tried = Some(fp);
                }
                None => {
                    record.status = Status::Failed;
                    record.error = Some("the function was removed before it ran".into());
                    record.http_status = Some(404);
                    record.end = Some(invocations::now_rfc3339());
                    break engine::Response {
                        status: 404,
                        headers: BTreeMap::new(),
                        body: Vec::new(),
                        error: record.error.clone(),
                    };
                }
            }
        };
        record.set_result(&response.body);
        record.result_headers = response.headers.clone();
        if let Err(err) = e.invocations.put(&record, None) {
            eprintln!(
                "skiff: warning: cannot store invocation {}: {err}",
                record.id
            );
        }
        if let Some(url) = record.callback_url.clone() {
            if let Err(err) = callback(&url, &record, &response).await {
                e.logs.append(
                    &record.function,
                    Some(&record.id),
                    "skiff",
                    &format!("callback to {url} failed: {err:#}"),
                );
            }
        }
    });
}

/// POSTs an async invocation's result to its callback URL (OpenFaaS's headers).
async fn callback(url: &str, record: &Record, response: &engine::Response) -> Result<()> {
    use http_body_util::Full;
    let uri: Uri = url.parse().context("bad callback URL")?;
    let host = uri
        .host()
        .context("the callback URL has no host")?
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .context("timed out connecting")??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header("host", uri.authority().map_or(host, |a| a.to_string()))
        .header("x-call-id", &record.id)
        .header("x-function-name", &record.function)
        .header("x-function-status", response.status.to_string());
    for (k, v) in &response.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Full::new(Bytes::from(response.body.clone())))?;
    tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .context("timed out")??;
    Ok(())
}

/// The default socket, overridable by `--socket` / `SKIFF_SOCKET`.
pub const DEFAULT_SOCKET: &str = "/run/skiff/skiff.sock";
/// The default TCP address, overridable by `--listen` / `SKIFF_LISTEN`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

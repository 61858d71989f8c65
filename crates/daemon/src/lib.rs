//! `skiff serve`: one process answering HTTP/1.1 on a Unix socket and on TCP, with the
//! function registry and the store in the data directory (no outside service).
//!
//! This first cut deploys functions (a tar of the function's directory), lists,
//! describes and deletes them, and invokes `binary` functions, one sandbox per request.
//! Sandboxes come from a [`RemoteSpawner`] forked before the async runtime starts.

mod invoke;
mod metrics;
mod openapi;
mod registry;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use metrics::Metrics;
use serde_json::json;
use skiff_cgroups::CgroupPool;
use skiff_sandbox::RemoteSpawner;
use skiff_store::Store;
use std::sync::atomic::Ordering;

use registry::{Function, Registry};

/// Largest deploy (a tar of the function's directory) and invocation body.
const MAX_DEPLOY: usize = 256 << 20;
const MAX_BODY: usize = 6 << 20;

pub struct Config {
    pub data: PathBuf,
    pub socket: PathBuf,
    pub listen: SocketAddr,
}

struct Daemon {
    data: PathBuf,
    spawner: RemoteSpawner,
    registry: Registry,
    pool: CgroupPool,
    metrics: Metrics,
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

/// Runs the daemon until SIGINT or SIGTERM. `spawner` was forked while the caller was
/// still single-threaded.
pub fn serve(config: Config, spawner: RemoteSpawner) -> Result<()> {
    let daemon = Arc::new(Daemon {
        registry: Registry::open(&config.data)?,
        pool: CgroupPool::open(&config.data)?,
        data: config.data.clone(),
        spawner,
        metrics: Metrics::default(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let app = router(daemon);
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
        let on_unix = axum::serve(unix, app.clone()).with_graceful_shutdown(shutdown());
        let on_tcp = axum::serve(tcp, app).with_graceful_shutdown(shutdown());
        let (a, b) = tokio::join!(on_unix, on_tcp);
        let _ = std::fs::remove_file(&config.socket);
        a.context("unix socket")?;
        b.context("tcp")?;
        Ok(())
    })
}

fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(json!({ "status": "ok" })) }),
        )
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route(
            "/v1/functions",
            get(list)
                .post(deploy)
                .layer(DefaultBodyLimit::max(MAX_DEPLOY)),
        )
        .route("/v1/functions/{name}", get(describe).delete(remove))
        .route("/fn/{name}", any(invoke))
        .route("/fn/{name}/{*rest}", any(invoke_path))
        .route("/function/{name}", any(invoke))
        .route("/function/{name}/{*rest}", any(invoke_path))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(daemon)
}

async fn metrics(State(d): State<Arc<Daemon>>) -> impl IntoResponse {
    let functions = d.registry.list().map_or(0, |l| l.len());
    (
        [("content-type", "text/plain; version=0.0.4")],
        d.metrics.render(functions),
    )
}

async fn list(State(d): State<Arc<Daemon>>) -> Result<Json<Vec<Function>>, ApiError> {
    d.registry.list().map(Json).map_err(internal)
}

async fn describe(
    State(d): State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Function>, ApiError> {
    d.registry
        .get(&name)
        .map(Json)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no function named {name:?}")))
}

async fn remove(
    State(d): State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    match d.registry.remove(&name) {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no function named {name:?}"),
        )),
        Err(e) => Err(internal(e)),
    }
}

/// `POST /v1/functions` with a tar of the function's directory.
async fn deploy(
    State(d): State<Arc<Daemon>>,
    body: Bytes,
) -> Result<(StatusCode, Json<Function>), ApiError> {
    let d2 = d.clone();
    let f = tokio::task::spawn_blocking(move || deploy_blocking(&d2, &body))
        .await
        .map_err(internal)??;
    Ok((StatusCode::CREATED, Json(f)))
}

fn deploy_blocking(d: &Daemon, tar_bytes: &[u8]) -> Result<Function, ApiError> {
    let incoming = d.registry.incoming_dir();
    let result = (|| {
        std::fs::create_dir_all(&incoming).map_err(internal)?;
        tar::Archive::new(tar_bytes)
            .unpack(&incoming)
            .map_err(|e| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not a tar of the function's directory: {e}"),
                )
            })?;
        let bad = |e: anyhow::Error| ApiError(StatusCode::BAD_REQUEST, format!("{e:#}"));
        // Errors name the file as the user knows it, not our scratch copy.
        let text =
            std::fs::read_to_string(incoming.join(skiff_manifest::FILE_NAME)).map_err(|_| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    "the function has no skiff.yaml".into(),
                )
            })?;
        let manifest = skiff_manifest::Manifest::parse(&text, skiff_manifest::FILE_NAME)
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
        let store = Store::open(&d.data).map_err(internal)?;
        let built = skiff_builder::build(&store, &incoming, &mut |_| {}).map_err(bad)?;
        let name = manifest.name.0.clone();
        let target = d.registry.source_dir(&name);
        let _ = std::fs::remove_dir_all(&target);
        std::fs::rename(&incoming, &target).map_err(internal)?;
        let f = Function {
            name,
            runtime: format!("{:?}", manifest.runtime).to_lowercase(),
            handler: manifest.handler,
            env: built.id,
            memory_bytes: manifest.limits.memory.0,
            cpus: manifest.limits.cpu.0,
            pids: manifest.limits.pids.0,
            timeout_ms: manifest.limits.timeout.0.as_millis() as u64,
            deployed_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        d.registry.put(&f).map_err(internal)?;
        Ok(f)
    })();
    let _ = std::fs::remove_dir_all(&incoming);
    result
}

async fn invoke_path(
    state: State<Arc<Daemon>>,
    UrlPath((name, rest)): UrlPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/{rest}");
    invoke_with(state, name, path, method, uri, headers, body).await
}

async fn invoke(
    state: State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    invoke_with(state, name, "/".into(), method, uri, headers, body).await
}

/// The request as a `binary` function sees it: environment variables beside the body
/// on stdin (the CGI convention FRE's event handlers follow).
fn request_env(method: &Method, path: &str, uri: &Uri, headers: &HeaderMap) -> Vec<String> {
    let mut env = vec![
        format!("SKIFF_METHOD={method}"),
        format!("SKIFF_PATH={path}"),
        format!("SKIFF_QUERY={}", uri.query().unwrap_or("")),
    ];
    for (name, value) in headers {
        if let Ok(value) = value.to_str() {
            let key = name.as_str().to_ascii_uppercase().replace('-', "_");
            env.push(format!("SKIFF_HEADER_{key}={value}"));
        }
    }
    env
}

async fn invoke_with(
    State(d): State<Arc<Daemon>>,
    name: String,
    path: String,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(f) = d.registry.get(&name) else {
        return ApiError(StatusCode::NOT_FOUND, format!("no function named {name:?}"))
            .into_response();
    };
    if f.runtime != "binary" {
        let message = format!(
            "runtime {}: invocation is not implemented yet; binary functions are",
            f.runtime
        );
        return ApiError(StatusCode::NOT_IMPLEMENTED, message).into_response();
    }
    let env = request_env(&method, &path, &uri, &headers);
    let started = std::time::Instant::now();
    let daemon = d.clone();
    d.metrics.inflight.fetch_add(1, Ordering::Relaxed);
    let outcome = tokio::task::spawn_blocking(move || {
        let dev_template = match skiff_sandbox::devices::ensure(&daemon.data) {
            Ok(dev) => dev,
            Err(e) => {
                return (
                    invoke::Outcome::Failed(format!("{e:#}")),
                    Default::default(),
                )
            }
        };
        let job = invoke::Job {
            env_root: daemon.data.join("envs").join(&f.env).join("root"),
            dev_template,
            function: f,
            body: body.to_vec(),
            env,
        };
        invoke::run(&daemon.spawner, &daemon.pool, job)
    })
    .await;
    d.metrics.inflight.fetch_sub(1, Ordering::Relaxed);
    let (response, cold_start) = match outcome {
        Ok((invoke::Outcome::Ok(out), start)) => {
            ((StatusCode::OK, out).into_response(), Some(start))
        }
        Ok((invoke::Outcome::Crashed(m), start)) => (
            ApiError(StatusCode::BAD_GATEWAY, m).into_response(),
            Some(start),
        ),
        Ok((invoke::Outcome::TimedOut, start)) => (
            ApiError(StatusCode::GATEWAY_TIMEOUT, "the function timed out".into()).into_response(),
            Some(start),
        ),
        Ok((invoke::Outcome::Overloaded(m), _)) => (
            ApiError(StatusCode::SERVICE_UNAVAILABLE, m).into_response(),
            None,
        ),
        Ok((invoke::Outcome::Failed(m), _)) => (
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, m).into_response(),
            None,
        ),
        Err(e) => (internal(e).into_response(), None),
    };
    d.metrics.record(
        &name,
        response.status().as_u16(),
        started.elapsed(),
        cold_start,
    );
    response
}

/// The default socket, overridable by `--socket` / `SKIFF_SOCKET`.
pub const DEFAULT_SOCKET: &str = "/run/skiff/skiff.sock";
/// The default TCP address, overridable by `--listen` / `SKIFF_LISTEN`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

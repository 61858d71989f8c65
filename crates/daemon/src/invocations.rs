//! A record per invocation, like OpenWhisk's activation record: kept in memory for
//! `--keep-records` (and at most [`MAX_RECORDS`]), listed by function. Asynchronous
//! invocations are also on disk (`DATA/invocations/<id>.json`, with the request beside
//! it until it has run), so an accepted one is neither lost nor forgotten when the
//! daemon restarts: unfinished ones run again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

const MAX_RECORDS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub function: String,
    #[serde(rename = "async")]
    pub is_async: bool,
    pub status: Status,
    /// The HTTP status answered (or, for an async invocation, the function's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    pub start: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    pub cold_start: bool,
    /// Milliseconds: the instance's start (cold starts only), waiting for an instance,
    /// and the whole invocation.
    pub init_ms: f64,
    pub queue_ms: f64,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// An async invocation's response: text, or base64 when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_base64: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub result_headers: BTreeMap<String, String>,
    /// The session's id (a MAC of its key; never the key itself).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<String>,
}

impl Record {
    pub fn new(id: String, function: &str, is_async: bool) -> Record {
        Record {
            id,
            function: function.to_owned(),
            is_async,
            status: if is_async {
                Status::Queued
            } else {
                Status::Running
            },
            http_status: None,
            start: now_rfc3339(),
            end: None,
            cold_start: false,
            init_ms: 0.0,
            queue_ms: 0.0,
            duration_ms: 0.0,
            instance: None,
            error: None,
            logs: Vec::new(),
            callback_url: None,
            result: None,
            result_base64: None,
            result_headers: BTreeMap::new(),
            session: None,
        }
    }

    pub fn set_result(&mut self, body: &[u8]) {
        match std::str::from_utf8(body) {
            Ok(text) => self.result = Some(text.to_owned()),
            Err(_) => {
                self.result_base64 = Some(base64::engine::general_purpose::STANDARD.encode(body))
            }
        }
    }
}

/// An async request as it is kept until it has run.
#[derive(Serialize, Deserialize)]
pub struct StoredRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: BTreeMap<String, String>,
    pub body_base64: String,
}

pub struct Invocations {
    dir: PathBuf,
    keep: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    order: VecDeque<(SystemTime, String)>,
    by_id: HashMap<String, Record>,
}

impl Invocations {
    /// Opens the store; returns it with the async requests that had not finished.
    pub fn open(
        data: &Path,
        keep: Duration,
    ) -> std::io::Result<(Invocations, Vec<(Record, StoredRequest)>)> {
        let dir = data.join("invocations");
        std::fs::create_dir_all(&dir)?;
        let store = Invocations {
            dir,
            keep,
            inner: Mutex::new(Inner::default()),
        };
        let mut unfinished = Vec::new();
        let mut loaded = Vec::new();
        for entry in std::fs::read_dir(&store.dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
            {
                // A write that a crash interrupted (see `write_synced`).
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Ok(record) = serde_json::from_slice::<Record>(&std::fs::read(&path)?) else {
                continue;
            };
            let modified = entry_time(&path);
            if matches!(record.status, Status::Queued | Status::Running) {
                match store
                    .request_path(&record.id)
                    .and_then(std::fs::read)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                {
                    Some(request) => unfinished.push((record.clone(), request)),
                    None => continue,
                }
            }
            loaded.push((modified, record));
        }
        loaded.sort_by_key(|(t, _)| *t);
        let mut inner = store.inner.lock().unwrap();
        for (t, record) in loaded {
            inner.order.push_back((t, record.id.clone()));
            inner.by_id.insert(record.id.clone(), record);
        }
        drop(inner);
        Ok((store, unfinished))
    }

    fn record_path(&self, id: &str) -> std::io::Result<PathBuf> {
        crate::names::inside(&self.dir, id, ".json")
    }

    fn request_path(&self, id: &str) -> std::io::Result<PathBuf> {
        crate::names::inside(&self.dir, id, ".request")
    }

    /// Keeps `record`; async ones reach the disk (fsynced) before this returns, so an
    /// acknowledged async invocation survives a crash. Call it on the daemon's runtime:
    /// the disk writes give up the thread's other work while they wait.
    pub fn put(&self, record: &Record, request: Option<&StoredRequest>) -> std::io::Result<()> {
        if record.is_async {
            tokio::task::block_in_place(|| -> std::io::Result<()> {
                if let Some(request) = request {
                    write_synced(
                        &self.request_path(&record.id)?,
                        &serde_json::to_vec(request)?,
                    )?;
                }
                write_synced(&self.record_path(&record.id)?, &serde_json::to_vec(record)?)?;
                if !matches!(record.status, Status::Queued | Status::Running) {
                    let _ = std::fs::remove_file(self.request_path(&record.id)?);
                }
                Ok(())
            })?;
        }
        let now = SystemTime::now();
        let mut inner = self.inner.lock().unwrap();
        if inner
            .by_id
            .insert(record.id.clone(), record.clone())
            .is_none()
        {
            inner.order.push_back((now, record.id.clone()));
        }
        while let Some((t, id)) = inner.order.front().cloned() {
            let expired = now.duration_since(t).unwrap_or_default() > self.keep;
            if !(expired || inner.order.len() > MAX_RECORDS) {
                break;
            }
            inner.order.pop_front();
            if let Some(old) = inner.by_id.remove(&id) {
                if old.is_async {
                    for path in [self.record_path(&id), self.request_path(&id)] {
                        let _ = path.and_then(std::fs::remove_file);
                    }
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.inner.lock().unwrap().by_id.get(id).cloned()
    }

    /// The newest `limit` records, of one function if given, newest first.
    pub fn list(&self, function: Option<&str>, limit: usize) -> Vec<Record> {
        let inner = self.inner.lock().unwrap();
        inner
            .order
            .iter()
            .rev()
            .filter_map(|(_, id)| inner.by_id.get(id))
            .filter(|r| function.is_none_or(|f| r.function == f))
            .take(limit)
            .cloned()
            .collect()
    }
}

fn entry_time(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(UNIX_EPOCH)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("record")
    ));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(path.parent().expect("records live in a directory"))?.sync_all()
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// An unguessable invocation id: 16 hex digits, SipHash under a random key (drawn
/// once per process) of a counter; no system call per invocation.
pub fn new_id() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", KEY.get_or_init(Default::default).hash_one(n))
}

//! Shared set-up for the tests that drive `skiff serve` (tests/serve.rs and
//! tests/sessions.rs): a real daemon on the test's data directory, raw HTTP/1.1 over TCP
//! and the Unix socket, deploys of the fixtures in tests/functions/, and the checks that
//! a stopped daemon left nothing behind. Each test file adds its own requests to
//! `Daemon` and `Response` in an `impl` of its own.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{stderr, Data, SKIFF};

/// How long any one HTTP exchange with the daemon may take before the test gives up.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// An HTTP response as the tests read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The message of a JSON error answer, `{"error": "..."}`, checked to be one.
    pub fn error(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "HTTP {} error is not JSON: {}",
            self.status,
            self.text()
        );
        let v = self.json();
        v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("HTTP {}: no \"error\" in {v}", self.status))
            .to_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "HTTP {}: the body is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Sends `request` and reads the whole answer. The request is written on its own
/// thread: a server refusing a large body answers (and closes) before reading it all.
pub fn exchange(
    mut reader: impl Read,
    mut writer: impl Write + Send,
    request: &[u8],
) -> std::io::Result<Response> {
    let mut raw = Vec::new();
    let read = std::thread::scope(|s| {
        s.spawn(move || {
            let _ = writer.write_all(request);
        });
        reader.read_to_end(&mut raw)
    });
    // A reset after the answer (the unread rest of a refused body) is no failure.
    match parse_response(&raw) {
        Some(response) => Ok(response),
        None => Err(read.err().unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no HTTP response: {:?}", String::from_utf8_lossy(&raw)),
            )
        })),
    }
}

fn parse_response(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.get(9..12)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        if body.len() < len {
            return None;
        }
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        let chunk = data.get(eol + 2..eol + 2 + size)?;
        out.extend_from_slice(chunk);
        data = data.get(eol + 4 + size..)?;
    }
}

/// One HTTP/1.1 exchange with the daemon listening on `port` over TCP.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let writer = stream.try_clone()?;
    exchange(stream, writer, &request_bytes(method, path, headers, body))
}

/// A `skiff serve` on the test's data directory, listening on `socket` and on TCP `port`.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub port: u16,
}

impl Daemon {
    pub fn start(data: &Data) -> Daemon {
        Daemon::start_with(data, &[])
    }

    /// With more `skiff serve` flags.
    pub fn start_with(data: &Data, flags: &[&str]) -> Daemon {
        let socket = data.dir.join("skiff.sock");
        // A free port: bind to port 0, note it, let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(SKIFF)
            .arg("--data-dir")
            .arg(&data.dir)
            .arg("--socket")
            .arg(&socket)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(flags)
            .spawn()
            .unwrap();
        let mut daemon = Daemon {
            child,
            socket,
            port,
        };
        // It listens on the socket first, then on TCP.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&daemon.socket).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        {
            assert!(
                daemon.child.try_wait().unwrap().is_none(),
                "skiff serve exited"
            );
            assert!(Instant::now() < deadline, "skiff serve did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon
    }

    /// `skiff --data-dir DIR --socket SOCKET ARGS`, talking to this daemon.
    pub fn cli(&self, data: &Data, args: &[&str]) -> Output {
        data.cmd()
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A raw HTTP/1.1 request over TCP.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        http(self.port, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path} over TCP: {e}"))
    }

    /// The function templates `GET /v1/instances` lists.
    pub fn templates(&self) -> Vec<Value> {
        let all = self.get("/v1/instances").json();
        all.as_array()
            .unwrap()
            .iter()
            .filter(|i| i["role"] == "template")
            .cloned()
            .collect()
    }

    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    /// Stops the daemon as an operator does (SIGTERM) and checks that it exits cleanly
    /// within `limit`.
    pub fn stop_within(mut self, limit: Duration) {
        // SAFETY: plain kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "skiff serve did not stop within {} s of SIGTERM",
                limit.as_secs()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "skiff serve ended with {status} on SIGTERM"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A test that failed half-way: SIGTERM first, so the daemon ends its instances
        // and workers and frees their slots, then SIGKILL if it does not stop.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: plain kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Once the daemon has stopped: no slot claimed, nothing in the pool's cgroups, no skiff
/// process on the data directory. (The pool's own mounts, its /dev template and run
/// directory, stay until `gc --pools`: `Data`'s drop checks those.)
pub fn assert_nothing_left(data: &Data) {
    assert_eq!(
        data.slots_in_use(),
        0,
        "cgroup slots are still claimed after the daemon stopped"
    );
    assert_eq!(
        data.pool_processes(),
        Vec::<i32>::new(),
        "processes left in the pool's cgroups"
    );
    assert_eq!(
        data.skiff_processes(),
        Vec::<(i32, String)>::new(),
        "skiff processes left on the data directory"
    );
}

/// Polls `f` every 20 ms until it returns something, at most `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A function directory in tests/functions.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/functions")
        .join(name)
}

/// `skiff deploy DIR`, which must succeed. A wasm function's directory must hold its
/// module, which scripts/build-wasm.sh builds.
pub fn deploy_dir(daemon: &Daemon, data: &Data, dir: &Path) {
    let manifest = std::fs::read_to_string(dir.join("skiff.yaml")).unwrap_or_default();
    if manifest.lines().any(|l| l.trim() == "runtime: wasm") {
        let module = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "wasm"));
        assert!(
            module,
            "{} has no .wasm module: run `bash scripts/build-wasm.sh` first",
            dir.display()
        );
    }
    let out = daemon.cli(data, &["deploy", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "deploy {}: {}",
        dir.display(),
        stderr(&out)
    );
}

/// `skiff deploy` of a fixture, which must succeed.
pub fn deploy(daemon: &Daemon, data: &Data, name: &str) {
    deploy_dir(daemon, data, &fixture(name));
}

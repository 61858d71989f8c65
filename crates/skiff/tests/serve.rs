//! `skiff serve` end to end: deploy, list, invoke over the Unix socket and TCP, JSON
//! errors with the right status, and a daemon killed with SIGKILL and restarted.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use common::{stderr, stdout, Data, SKIFF};

struct Daemon {
    child: Child,
    socket: PathBuf,
    port: u16,
}

impl Daemon {
    fn start(data: &Data) -> Daemon {
        let socket = data.dir.join("skiff.sock");
        // A free port: bind to port 0, note it, let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(SKIFF)
            .arg("--data")
            .arg(&data.dir)
            .arg("--socket")
            .arg(&socket)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "skiff serve did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket,
            port,
        }
    }

    fn cli(&self, data: &Data, args: &[&str]) -> Output {
        data.cmd()
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A raw HTTP/1.1 request over TCP: (status, body).
    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        (status, body)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn function(data: &Data, name: &str, manifest: &str, c_source: Option<&str>) -> PathBuf {
    let dir = data.dir.join("fn").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("skiff.yaml"), manifest).unwrap();
    if let Some(src) = c_source {
        std::fs::write(dir.join("main.c"), src).unwrap();
        let cc = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(dir.join("main"))
            .arg(dir.join("main.c"))
            .status()
            .unwrap();
        assert!(cc.success());
    }
    dir
}

fn echo(data: &Data) -> PathBuf {
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/echo-binary/echo.c"),
    )
    .unwrap();
    function(
        data,
        "echo",
        "name: echo\nruntime: binary\nhandler: ./main\n",
        Some(&src),
    )
}

#[test]
fn deploy_list_and_invoke_over_both_sockets() {
    let data = Data::new("serve-basic", 8);
    let daemon = Daemon::start(&data);
    let out = daemon.cli(&data, &["deploy", echo(&data).to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&daemon.cli(&data, &["ls"])).contains("echo"));
    let out = daemon.cli(&data, &["invoke", "echo", "-d", "over the socket"]);
    assert_eq!(stdout(&out), "over the socket", "{}", stderr(&out));
    assert_eq!(
        daemon.http("POST", "/fn/echo", "over tcp"),
        (200, "over tcp".to_owned())
    );
    assert_eq!(
        daemon.http("POST", "/function/echo", "openfaas alias"),
        (200, "openfaas alias".to_owned())
    );
    assert_eq!(
        daemon.http("GET", "/healthz", ""),
        (200, "{\"status\":\"ok\"}".to_owned())
    );
    let (status, body) = daemon.http("POST", "/fn/missing", "");
    assert_eq!(status, 404);
    assert!(body.contains("\"error\""), "{body}");
    assert_eq!(data.slots_in_use(), 0, "an invocation kept its sandbox");
}

#[test]
fn broken_crashing_and_hanging_functions_get_clear_errors() {
    let data = Data::new("serve-errors", 8);
    let daemon = Daemon::start(&data);
    let bad = function(
        &data,
        "bad",
        "name: bad\nruntime: binary\nhandler: ./main\nlimts: {}\n",
        None,
    );
    let out = daemon.cli(&data, &["deploy", bad.to_str().unwrap()]);
    assert!(
        stderr(&out).contains("skiff.yaml:4:1: unknown field `limts`"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("HTTP 400"), "{}", stderr(&out));

    let hang = "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n";
    let hanging = function(
        &data,
        "hang",
        "name: hang\nruntime: binary\nhandler: ./main\nlimits:\n  timeout: 500ms\n",
        Some(hang),
    );
    assert!(daemon
        .cli(&data, &["deploy", hanging.to_str().unwrap()])
        .status
        .success());
    let started = Instant::now();
    let (status, body) = daemon.http("POST", "/fn/hang", "");
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let crash = "#include <stdlib.h>\nint main(void) { return 3; }\n";
    let crashing = function(
        &data,
        "crash",
        "name: crash\nruntime: binary\nhandler: ./main\n",
        Some(crash),
    );
    assert!(daemon
        .cli(&data, &["deploy", crashing.to_str().unwrap()])
        .status
        .success());
    let (status, body) = daemon.http("POST", "/fn/crash", "");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("exited with 3"), "{body}");

    // The next call after a crash works, and others were never affected.
    assert!(daemon
        .cli(&data, &["deploy", echo(&data).to_str().unwrap()])
        .status
        .success());
    assert_eq!(
        daemon.http("POST", "/fn/echo", "still fine"),
        (200, "still fine".to_owned())
    );
    assert_eq!(data.slots_in_use(), 0);
}

#[test]
fn functions_survive_a_daemon_killed_with_sigkill() {
    let data = Data::new("serve-restart", 8);
    let mut daemon = Daemon::start(&data);
    assert!(daemon
        .cli(&data, &["deploy", echo(&data).to_str().unwrap()])
        .status
        .success());
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    drop(daemon);
    let daemon = Daemon::start(&data);
    let out = daemon.cli(&data, &["invoke", "echo", "-d", "after restart"]);
    assert_eq!(stdout(&out), "after restart", "{}", stderr(&out));
    let out = daemon.cli(&data, &["rm", "echo"]);
    assert!(out.status.success());
    assert_eq!(daemon.http("POST", "/fn/echo", "").0, 404);
}

#[test]
fn requests_reach_the_function_and_metrics_count_them() {
    let data = Data::new("serve-metrics", 8);
    let daemon = Daemon::start(&data);
    let script = "#include <stdio.h>\n#include <stdlib.h>\nint main(void) { printf(\"%s %s %s %s\", getenv(\"SKIFF_METHOD\"), getenv(\"SKIFF_PATH\"), getenv(\"SKIFF_QUERY\"), getenv(\"SKIFF_HEADER_HOST\")); return 0; }\n";
    let dir = function(
        &data,
        "env",
        "name: env\nruntime: binary\nhandler: ./main\n",
        Some(script),
    );
    assert!(daemon
        .cli(&data, &["deploy", dir.to_str().unwrap()])
        .status
        .success());
    assert_eq!(
        daemon.http("PUT", "/fn/env/a/b?x=1", ""),
        (200, "PUT /a/b x=1 x".to_owned())
    );
    assert_eq!(daemon.http("POST", "/fn/missing", "").0, 404);
    let (status, metrics) = daemon.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    for line in [
        "skiff_functions 1",
        "skiff_invocations_total{function=\"env\",status=\"2xx\"} 1",
        "skiff_cold_start_seconds_count{function=\"env\"} 1",
        "skiff_invocation_seconds_count{function=\"env\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
    let (status, api) = daemon.http("GET", "/openapi.json", "");
    assert_eq!(status, 200);
    let api: serde_json::Value = serde_json::from_str(&api).unwrap();
    for path in [
        "/v1/functions",
        "/v1/functions/{name}",
        "/fn/{name}",
        "/function/{name}",
        "/metrics",
        "/healthz",
    ] {
        assert!(
            api["paths"].get(path).is_some(),
            "{path} missing from openapi.json"
        );
    }
}

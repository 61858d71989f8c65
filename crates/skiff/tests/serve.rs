//! `skiff serve` end to end: deploy, list, invoke over the Unix socket and TCP, JSON
//! errors with the right status, python3 and node instances (the handler contract,
//! isolation, queueing, keep-alive), async invocations with callbacks, and a daemon
//! killed with SIGKILL and restarted. Real daemon, real sandboxes, real HTTP; the
//! python3 and node fixtures are in tests/functions/.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::daemon::{
    assert_nothing_left, deploy, deploy_dir, exchange, fixture, http, request_bytes, wait_for,
    Daemon, Response, IO_TIMEOUT,
};
use common::{pid_alive, stderr, stdout, wait_gone, Data};

impl Daemon {
    /// A raw HTTP/1.1 request over TCP: (status, body).
    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let r = self.request(method, path, &[], body.as_bytes());
        (r.status, r.text())
    }

    /// A raw HTTP/1.1 request over the Unix socket.
    fn unix_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let stream = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let writer = stream.try_clone().unwrap();
        exchange(stream, writer, &request_bytes(method, path, headers, body))
            .unwrap_or_else(|e| panic!("{method} {path} over the Unix socket: {e}"))
    }

    /// `GET /v1/instances`, only those of `function` (not its template).
    fn instances_of(&self, function: &str) -> Vec<Value> {
        let r = self.get("/v1/instances");
        assert_eq!(r.status, 200, "{}", r.text());
        let all = r.json();
        all.as_array()
            .unwrap_or_else(|| panic!("/v1/instances is not a list: {all}"))
            .iter()
            .filter(|i| i["function"] == function && i["role"] != "template")
            .cloned()
            .collect()
    }

    fn instance_count(&self) -> usize {
        self.get("/v1/instances").json().as_array().unwrap().len()
    }

    /// `GET /v1/invocations/ID`, which must exist.
    fn invocation(&self, id: &str) -> Value {
        let r = self.get(&format!("/v1/invocations/{id}"));
        assert_eq!(r.status, 200, "invocation {id}: {}", r.text());
        r.json()
    }

    /// Stops the daemon as an operator does (SIGTERM) and checks that it exits cleanly.
    fn stop(self) {
        self.stop_within(Duration::from_secs(15));
    }
}

/// A tar of a directory, as `POST /v1/functions` takes it.
/// A tar of a function directory, as `skiff deploy` sends it (symlinks as they are).
fn tar_of(dir: &Path) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir).unwrap();
    tar.into_inner().unwrap()
}

fn function(data: &Data, name: &str, manifest: &str, c_source: Option<&str>) -> PathBuf {
    let dir = data.dir.join("fn").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("skiff.yaml"), manifest).unwrap();
    if let Some(src) = c_source {
        std::fs::write(dir.join("main.c"), src).unwrap();
        common::cc(&dir.join("main.c"), &dir.join("main"));
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
    let health = daemon.get("/healthz");
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(
        health.json(),
        json!({ "status": "ok", "data": data.dir.to_str().unwrap() })
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

/// The python3 and node handler contract, end to end: what the handler sees of the
/// request (event, method, path, query, headers, request id), a `statusCode` answer,
/// TCP, the Unix socket and the CLI, warm and cold calls, the invocation record with
/// the handler's log lines, `skiff logs`, `skiff ps`, and a clean stop and restart.
fn handler_contract(test: &str, name: &str, runtime: &str) {
    let data = Data::new(test, 8);
    let daemon = Daemon::start(&data);
    let out = daemon.cli(&data, &["deploy", fixture(name).to_str().unwrap()]);
    assert!(out.status.success(), "deploy: {}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!("deployed {name} ({runtime} runtime")),
        "{}",
        stdout(&out)
    );
    let ls = stdout(&daemon.cli(&data, &["ls"]));
    assert!(
        ls.lines()
            .any(|l| l.split_whitespace().take(2).eq([name, runtime])),
        "{ls}"
    );

    // Over TCP: method, path, query, a header and a JSON body reach the handler.
    let r = daemon.request(
        "PUT",
        &format!("/fn/{name}/a/b?x=1&y=two"),
        &[("X-Test", "over tcp")],
        br#"{"k": [1, 2]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let id = r
        .header("x-skiff-invocation-id")
        .expect("x-skiff-invocation-id")
        .to_owned();
    // The deploy started one instance (to check that the handler loads): it is warm.
    assert_eq!(r.header("x-skiff-cold-start"), None, "{r:?}");
    assert_eq!(
        r.json(),
        json!({
            "event": {"k": [1, 2]},
            "method": "PUT",
            "path": "/a/b",
            "query": "x=1&y=two",
            "header": "over tcp",
            "request_id": id,
        })
    );

    // Over the Unix socket: a body that is not JSON is the event as text.
    let r = daemon.unix_request("POST", &format!("/fn/{name}"), &[], b"plain text");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (
            &v["event"],
            &v["method"],
            &v["path"],
            &v["query"],
            &v["header"]
        ),
        (
            &json!("plain text"),
            &json!("POST"),
            &json!("/"),
            &json!(""),
            &Value::Null
        ),
        "{v}"
    );
    assert_eq!(
        v["request_id"].as_str(),
        r.header("x-skiff-invocation-id"),
        "{v}"
    );
    // No body: no event.
    let v = daemon.get(&format!("/fn/{name}")).json();
    assert_eq!(v["event"], Value::Null, "{v}");

    // The CLI, with -H.
    let out = daemon.cli(
        &data,
        &[
            "invoke",
            name,
            "-d",
            r#"{"via": "cli"}"#,
            "-H",
            "X-Test: from cli",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["event"], json!({"via": "cli"}), "{v}");
    assert_eq!(v["header"], "from cli", "{v}");

    // A statusCode answer sets the status and the headers.
    let r = daemon.get(&format!("/fn/{name}/status"));
    assert_eq!(r.status, 201, "{}", r.text());
    let from = if runtime == "python3" {
        "python"
    } else {
        "node"
    };
    assert_eq!(r.header("x-from-handler"), Some(from), "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), json!({"created": true}));
    // A handler that raises: 500, with its traceback or stack.
    let r = daemon.get(&format!("/fn/{name}/raise"));
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.error().contains(&format!("{name} raised on purpose")),
        "{}",
        r.text()
    );

    // The first call's record, with the lines the handler printed.
    let record = daemon.invocation(&id);
    assert_eq!(record["id"], id.as_str());
    assert_eq!(record["function"], name);
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["http_status"], 200, "{record}");
    assert_eq!(record["cold_start"], false, "{record}");
    assert_eq!(record["async"], false, "{record}");
    let printed = [format!("{name} saw PUT /a/b"), format!("{name} to stderr")];
    for line in &printed {
        assert!(
            record["logs"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x == line.as_str())),
            "{line:?} not in the record's logs: {record}"
        );
    }
    let out = daemon.cli(&data, &["invocation", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["id"], id.as_str());

    // `skiff logs`: every line with its invocation and stream.
    let logs = stdout(&daemon.cli(&data, &["logs", name]));
    for (stream, line) in [("stdout", &printed[0]), ("stderr", &printed[1])] {
        assert!(
            logs.lines()
                .any(|l| l.contains(&format!(" {id} {stream}: {line}"))),
            "{stream} line {line:?} of {id} not in `skiff logs`:\n{logs}"
        );
    }
    let only = stdout(&daemon.cli(&data, &["logs", name, "--invocation", &id]));
    assert_eq!(only.lines().count(), 2, "{only}");
    assert!(only.lines().all(|l| l.contains(&id)), "{only}");

    // `skiff ps` lists the instance.
    let ps = stdout(&daemon.cli(&data, &["ps"]));
    assert!(
        ps.lines()
            .any(|l| l.contains(" idle ") && l.trim_end().ends_with(&format!("function {name}"))),
        "{ps}"
    );

    // A clean stop ends the instance; after a restart the first call is a cold start
    // and the second is served warm by the same instance.
    daemon.stop();
    assert_nothing_left(&data);
    let daemon = Daemon::start(&data);
    let cold = daemon.request("POST", &format!("/fn/{name}"), &[], b"{}");
    assert_eq!(cold.status, 200, "{}", cold.text());
    assert_eq!(cold.header("x-skiff-cold-start"), Some("true"), "{cold:?}");
    let cold = daemon.invocation(cold.header("x-skiff-invocation-id").unwrap());
    assert_eq!(cold["cold_start"], true, "{cold}");
    assert!(cold["init_ms"].as_f64().unwrap() > 0.0, "{cold}");
    let warm = daemon.request("POST", &format!("/fn/{name}"), &[], b"{}");
    assert_eq!(warm.status, 200, "{}", warm.text());
    assert_eq!(warm.header("x-skiff-cold-start"), None, "{warm:?}");
    let warm = daemon.invocation(warm.header("x-skiff-invocation-id").unwrap());
    assert_eq!(warm["cold_start"], false, "{warm}");
    assert_eq!(warm["instance"], cold["instance"], "{warm}\n{cold}");
    // The log outlives the daemon.
    let logs = stdout(&daemon.cli(&data, &["logs", name]));
    assert!(logs.contains(&id), "{logs}");
    // `skiff rm`: not listed, not invocable, its instance ended and its slot free.
    let out = daemon.cli(&data, &["rm", name]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(daemon.get("/v1/functions").json(), json!([]));
    assert_eq!(daemon.get(&format!("/fn/{name}")).status, 404);
    assert_eq!(
        daemon.get(&format!("/v1/functions/{name}/logs")).status,
        404
    );
    wait_for(
        "the removed function's instance to end",
        Duration::from_secs(5),
        || (daemon.instance_count() == 0 && data.slots_in_use() == 0).then_some(()),
    );
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn python3_handler_contract_end_to_end() {
    handler_contract("serve-python", "py-contract", "python3");
}

#[test]
fn node_handler_contract_end_to_end() {
    handler_contract("serve-node", "node-contract", "node");
}

/// The token a py-isolation instance answers with (one per instance).
fn token(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .strip_prefix("ok ")
        .unwrap_or_else(|| panic!("not an instance token: {}", r.text()))
        .to_owned()
}

#[test]
fn a_crashing_hanging_or_greedy_python_function_harms_nothing_else() {
    let data = Data::new("serve-isolation", 8);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-isolation");
    deploy(&daemon, &data, "py-other");
    let mut previous = token(&daemon.get("/fn/py-isolation"));
    for case in ["crash", "hang", "oom", "flood", "raise"] {
        let before = daemon.instances_of("py-isolation");
        assert_eq!(before.len(), 1, "{before:?}");
        let old_pid = before[0]["pid"].as_i64().unwrap() as i32;
        let began = Instant::now();
        let r = daemon.get(&format!("/fn/py-isolation/{case}"));
        let took = began.elapsed();
        // Whether the instance is (must be) replaced.
        let replaced = match case {
            "crash" => {
                assert_eq!(r.status, 502, "{}", r.text());
                assert!(r.error().contains("exited with 3"), "{}", r.text());
                true
            }
            "hang" => {
                assert_eq!(r.status, 504, "{}", r.text());
                assert!(
                    r.error().contains("timed out after 2000 ms"),
                    "{}",
                    r.text()
                );
                assert!(
                    took >= Duration::from_secs(2) && took < Duration::from_secs(5),
                    "a 2 s timeout answered after {took:?}"
                );
                true
            }
            "oom" => {
                assert_eq!(r.status, 502, "{}", r.text());
                assert!(r.error().contains("out of memory"), "{}", r.text());
                true
            }
            "flood" => {
                assert!(r.status == 200 || r.status == 504, "{}", r.text());
                if r.status == 200 {
                    assert_eq!(r.text(), "flooded");
                    // The record keeps a bounded number of lines; the log has them all.
                    let record = daemon.invocation(r.header("x-skiff-invocation-id").unwrap());
                    let lines = record["logs"].as_array().unwrap();
                    assert!(!lines.is_empty() && lines.len() <= 100, "{record}");
                    assert_eq!(lines[0], "flood line 0", "{record}");
                    let tail = stdout(&daemon.cli(&data, &["logs", "py-isolation", "--tail", "1"]));
                    assert!(tail.trim_end().ends_with("flood line 99999"), "{tail}");
                }
                r.status == 504
            }
            "raise" => {
                assert_eq!(r.status, 500, "{}", r.text());
                let error = r.error();
                for part in [
                    "Traceback (most recent call last)",
                    "/code/main.py",
                    "ValueError: raised on purpose",
                ] {
                    assert!(error.contains(part), "{part:?} not in {error}");
                }
                let record = daemon.invocation(r.header("x-skiff-invocation-id").unwrap());
                assert_eq!(record["status"], "failed", "{record}");
                assert!(
                    record["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("ValueError: raised on purpose")),
                    "{record}"
                );
                false
            }
            _ => unreachable!(),
        };
        let health = daemon.get("/healthz");
        assert_eq!(health.status, 200, "after {case}: {}", health.text());
        // The neighbour never noticed.
        assert_eq!(
            daemon.http("GET", "/fn/py-other", ""),
            (200, "other is fine".to_owned()),
            "after {case}"
        );
        if replaced {
            assert!(
                wait_gone(old_pid, Duration::from_secs(5)),
                "the instance that got {case} (pid {old_pid}) is still alive"
            );
            // Wait until the daemon has forgotten it too: a call in between may be
            // handed the dead instance (a_call_right_after_a_timeout_gets_a_fresh_instance).
            wait_for(
                "the old instance to be forgotten",
                Duration::from_secs(5),
                || {
                    daemon
                        .instances_of("py-isolation")
                        .iter()
                        .all(|i| i["pid"] != old_pid)
                        .then_some(())
                },
            );
        }
        let again = daemon.get("/fn/py-isolation");
        let now = token(&again);
        if replaced {
            assert_eq!(
                again.header("x-skiff-cold-start"),
                Some("true"),
                "after {case}: {again:?}"
            );
            assert_ne!(now, previous, "after {case}: the same instance answered");
        } else {
            // A handler's exception or its output costs it nothing: same instance.
            assert_eq!(again.header("x-skiff-cold-start"), None, "after {case}");
            assert_eq!(now, previous, "after {case}: the instance was replaced");
        }
        previous = now;
    }
    // No slot leaked by the instances that died: one per live instance.
    assert_eq!(data.slots_in_use(), daemon.instance_count());
    daemon.stop();
    assert_nothing_left(&data);
}

/// The engine kills an instance whose call timed out (504), and "the next call gets a
/// fresh one". The next call must not be handed the instance being killed.
#[test]
fn a_call_right_after_a_timeout_gets_a_fresh_instance() {
    let data = Data::new("serve-timeout", 8);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-timeout");
    let first = daemon.get("/fn/py-timeout");
    assert_eq!(first.status, 200, "{}", first.text());
    let mut seen = vec![first.text()];
    let mut wrong = Vec::new();
    // A call queued behind one that times out (max_instances: 1): the timeout frees the
    // only instance by killing it, and the queued call is served next.
    let (hung, queued) = std::thread::scope(|s| {
        let hung = s.spawn(|| daemon.get("/fn/py-timeout/hang"));
        std::thread::sleep(Duration::from_millis(300));
        let queued = daemon.get("/fn/py-timeout");
        (hung.join().unwrap(), queued)
    });
    assert_eq!(hung.status, 504, "{}", hung.text());
    if queued.status != 200 || seen.contains(&queued.text()) {
        wrong.push(format!(
            "queued behind the timed-out call: HTTP {} {}",
            queued.status,
            queued.text()
        ));
    }
    seen.push(queued.text());
    // A client that calls again as soon as it gets its 504.
    for attempt in 1..=3 {
        let hung = daemon.get("/fn/py-timeout/hang");
        assert_eq!(hung.status, 504, "{}", hung.text());
        let next = daemon.get("/fn/py-timeout");
        if next.status != 200 || seen.contains(&next.text()) {
            wrong.push(format!(
                "called again right after timeout {attempt}: HTTP {} {}",
                next.status,
                next.text()
            ));
        }
        seen.push(next.text());
    }
    assert!(
        wrong.is_empty(),
        "calls after a timeout were not served by a fresh instance:\n{}",
        wrong.join("\n")
    );
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn a_full_queue_answers_429_and_the_rest_wait_their_turn() {
    let data = Data::new("serve-queue", 8);
    let daemon = Daemon::start(&data);
    // max_instances 1, queue 2, a handler that sleeps 1 s.
    deploy(&daemon, &data, "py-queue");
    let start = std::sync::Barrier::new(7);
    let results: Vec<(Response, Duration)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let began = Instant::now();
                    let r = daemon.get("/fn/py-queue");
                    (r, began.elapsed())
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(Duration::from_millis(500));
        // Meanwhile: one instance, serving, and two requests waiting.
        let running = daemon.instances_of("py-queue");
        assert_eq!(running.len(), 1, "{running:?}");
        assert_eq!(running[0]["inflight"], 1, "{running:?}");
        let ps = stdout(&daemon.cli(&data, &["ps"]));
        assert!(
            ps.lines()
                .any(|l| l.contains(" serving ") && l.trim_end().ends_with("function py-queue")),
            "{ps}"
        );
        let metrics = daemon.get("/metrics").text();
        assert!(
            metrics
                .lines()
                .any(|l| l == "skiff_queue_depth{function=\"py-queue\"} 2"),
            "{metrics}"
        );
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let statuses: Vec<u16> = results.iter().map(|(r, _)| r.status).collect();
    let (served, refused): (Vec<_>, Vec<_>) = results.iter().partition(|(r, _)| r.status == 200);
    assert_eq!(
        served.len(),
        3,
        "1 running + 2 queued expected: {statuses:?}"
    );
    assert_eq!(refused.len(), 3, "{statuses:?}");
    for (r, took) in &refused {
        assert_eq!(r.status, 429, "{statuses:?}: {}", r.text());
        assert!(r.error().contains("busy"), "{}", r.text());
        assert!(*took < Duration::from_millis(900), "a 429 took {took:?}");
    }
    let mut took: Vec<Duration> = served
        .iter()
        .map(|(r, took)| {
            assert_eq!(r.text(), "slept");
            *took
        })
        .collect();
    took.sort();
    // One after the other on the one instance: about 1, 2 and 3 s.
    assert!(
        took[0] >= Duration::from_millis(900) && took[2] >= Duration::from_millis(2800),
        "{took:?}"
    );
    let metrics = daemon.get("/metrics").text();
    for line in [
        "skiff_invocations_total{function=\"py-queue\",status=\"2xx\"} 3",
        "skiff_invocations_total{function=\"py-queue\",status=\"4xx\"} 3",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn idle_instances_scale_to_zero_unless_min_instances_keeps_them() {
    let data = Data::new("serve-keepalive", 8);
    let daemon = Daemon::start(&data);
    // keep_alive 1s; and keep_alive 1s with min_instances 1.
    deploy(&daemon, &data, "py-brief");
    deploy(&daemon, &data, "py-warm");
    let warm_since = Instant::now();
    let warm = daemon.instances_of("py-warm");
    assert_eq!(warm.len(), 1, "{warm:?}");

    let r = daemon.get("/fn/py-brief");
    assert_eq!(r.status, 200, "{}", r.text());
    let invoked = Instant::now();
    let brief = daemon.instances_of("py-brief");
    assert_eq!(brief.len(), 1, "{brief:?}");
    let pid = brief[0]["pid"].as_i64().unwrap() as i32;
    std::thread::sleep(Duration::from_millis(500).saturating_sub(invoked.elapsed()));
    assert_eq!(
        daemon.instances_of("py-brief").len(),
        1,
        "gone before its keep-alive"
    );
    wait_for("py-brief to scale to zero", Duration::from_secs(4), || {
        daemon.instances_of("py-brief").is_empty().then_some(())
    });
    assert!(
        invoked.elapsed() > Duration::from_secs(1),
        "gone after {:?}, before its 1 s keep-alive",
        invoked.elapsed()
    );
    assert!(
        wait_gone(pid, Duration::from_secs(2)),
        "the expired instance (pid {pid}) is still alive"
    );
    assert!(!data.pool_processes().contains(&pid));
    // Its slot is free again: only py-warm's is claimed.
    assert_eq!(data.slots_in_use(), 1);

    // min_instances 1: py-warm's instance outlives its keep-alive, and serves warm.
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(warm_since.elapsed()));
    let still = daemon.instances_of("py-warm");
    assert_eq!(
        still.iter().map(|i| &i["id"]).collect::<Vec<_>>(),
        vec![&warm[0]["id"]],
        "{still:?}"
    );
    let r = daemon.get("/fn/py-warm");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-skiff-cold-start"), None, "{r:?}");
    // Killed from outside, it is replaced.
    let warm_pid = warm[0]["pid"].as_i64().unwrap() as i32;
    assert!(pid_alive(warm_pid));
    // SAFETY: plain kill(2) on the instance's pid, alive (the daemon has not reaped it).
    unsafe { libc::kill(warm_pid, libc::SIGKILL) };
    let replaced = wait_for("a new py-warm instance", Duration::from_secs(5), || {
        let now = daemon.instances_of("py-warm");
        (now.len() == 1 && now[0]["id"] != warm[0]["id"]).then(|| now[0].clone())
    });
    assert_ne!(replaced["pid"], warm[0]["pid"]);
    let r = daemon.get("/fn/py-warm");
    assert_eq!(r.status, 200, "{}", r.text());
    let served = daemon.invocation(r.header("x-skiff-invocation-id").unwrap());
    assert_eq!(served["instance"], replaced["id"], "{served}");

    // py-brief scaled to zero: its next call starts an instance.
    let r = daemon.get("/fn/py-brief");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-skiff-cold-start"), Some("true"), "{r:?}");
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn bad_deploys_and_bad_requests_get_json_errors() {
    let data = Data::new("serve-bad-input", 8);
    let daemon = Daemon::start(&data);
    let deploy_body = |body: &[u8], content_type: &str| {
        daemon.request(
            "POST",
            "/v1/functions",
            &[("content-type", content_type)],
            body,
        )
    };
    // The body of a deploy is a tar of the function's directory: not JSON, not junk,
    // not half a tar.
    let whole = tar_of(&fixture("py-other"));
    for (body, content_type) in [
        (
            &br#"{"name": "py-other", "runtime": "#[..],
            "application/json",
        ),
        (&b"definitely not a tar archive"[..], "application/x-tar"),
        (&whole[..700], "application/x-tar"),
    ] {
        let r = deploy_body(body, content_type);
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(
            r.error().contains("not a tar of the function's directory"),
            "{}",
            r.text()
        );
    }
    let empty = vec![0u8; 1024];
    let r = deploy_body(&empty, "application/x-tar");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("no skiff.yaml"), "{}", r.text());

    // An unknown key, named with its line and column.
    let r = deploy_body(&tar_of(&fixture("py-badkey")), "application/x-tar");
    assert_eq!(r.status, 400, "{}", r.text());
    let error = r.error();
    assert!(
        error.contains("skiff.yaml:5:3") && error.contains("unknown field `max_instance`"),
        "{error}"
    );
    // A handler that does not compile: its SyntaxError, and no function.
    let r = deploy_body(&tar_of(&fixture("py-syntax")), "application/x-tar");
    assert_eq!(r.status, 400, "{}", r.text());
    let error = r.error();
    assert!(
        error.contains("SyntaxError") && error.contains("/code/main.py\", line 1"),
        "{error}"
    );
    let out = daemon.cli(&data, &["deploy", fixture("py-syntax").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("SyntaxError") && stderr(&out).contains("HTTP 400"),
        "{}",
        stderr(&out)
    );
    let listed = daemon.get("/v1/functions");
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json(), json!([]), "failed deploys are listed");
    assert!(!stdout(&daemon.cli(&data, &["ls"])).contains("py-syntax"));
    for path in ["/v1/functions/py-syntax", "/fn/py-syntax"] {
        assert_eq!(daemon.get(path).status, 404, "{path}");
    }
    // The instance that tried to load it is gone and its slot free; no scratch copy.
    assert_eq!(daemon.instance_count(), 0);
    assert_eq!(data.slots_in_use(), 0);
    let scratch: Vec<_> = std::fs::read_dir(data.dir.join("functions"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(scratch.is_empty(), "left in DATA/functions: {scratch:?}");

    // A path on the daemon's host: over the Unix socket only.
    let by_path = format!("/v1/functions?path={}", fixture("py-other").display());
    let r = daemon.request("POST", &by_path, &[], b"");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.error().contains("Unix socket"), "{}", r.text());
    let r = daemon.unix_request("POST", "/v1/functions?path=relative/dir", &[], b"");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("not an absolute path"), "{}", r.text());
    let r = daemon.unix_request("POST", &by_path, &[], b"");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["name"], "py-other");
    // A broken new version is refused and the deployed one keeps serving.
    let broken = data.dir.join("py-other-broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("skiff.yaml"),
        std::fs::read_to_string(fixture("py-other").join("skiff.yaml")).unwrap(),
    )
    .unwrap();
    std::fs::copy(fixture("py-syntax").join("main.py"), broken.join("main.py")).unwrap();
    let r = deploy_body(&tar_of(&broken), "application/x-tar");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("SyntaxError"), "{}", r.text());
    assert_eq!(
        daemon.http("GET", "/fn/py-other", ""),
        (200, "other is fine".to_owned())
    );
    assert_eq!(daemon.instances_of("py-other").len(), 1);

    // Bodies: 6 MiB is allowed, a byte more is 413.
    let limit = vec![b'x'; 6 << 20];
    assert_eq!(
        daemon.http("POST", "/fn/py-other", std::str::from_utf8(&limit).unwrap()),
        (200, "other is fine".to_owned())
    );
    let over = vec![b'x'; (6 << 20) + 1];
    for path in ["/fn/py-other", "/async/py-other"] {
        let r = daemon.request("POST", path, &[], &over);
        assert_eq!(r.status, 413, "{path}: {}", r.text());
        assert!(r.error().contains("6 MiB"), "{}", r.text());
    }

    // Unknown functions, on every route that names one.
    for (method, path) in [
        ("POST", "/fn/nope"),
        ("GET", "/fn/nope/a/b"),
        ("POST", "/function/nope"),
        ("POST", "/async/nope"),
        ("GET", "/v1/functions/nope"),
        ("DELETE", "/v1/functions/nope"),
        ("GET", "/v1/functions/nope/logs"),
    ] {
        let r = daemon.request(method, path, &[], b"{}");
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
        assert!(
            r.error().contains("\"nope\""),
            "{method} {path}: {}",
            r.text()
        );
    }
    let r = daemon.get("/v1/invocations/0123456789abcdef");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.error().contains("0123456789abcdef"));
    // Unknown routes.
    for path in [
        "/nope",
        "/v2/functions",
        "/fn",
        "/v1/functions/py-other/nope",
    ] {
        let r = daemon.get(path);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert_eq!(r.error(), "no such route", "{path}");
    }
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn broken_functions_are_refused_at_deploy_with_validates_message() {
    let data = Data::new("serve-broken", 2);
    let daemon = Daemon::start(&data);
    for broken in common::broken_functions(&data.dir.join("fn")) {
        let r = daemon.request(
            "POST",
            "/v1/functions",
            &[("content-type", "application/x-tar")],
            &tar_of(&broken.dir),
        );
        assert_eq!(r.status, 400, "{:?}: {}", broken.dir, r.text());
        // The same message as `skiff validate`, which names no host path; a link out
        // of the function is refused earlier, as the tarball is unpacked.
        let link_out = std::fs::read_dir(&broken.dir)
            .unwrap()
            .flatten()
            .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.is_absolute()));
        let message = match link_out {
            Some(link) => format!(
                "the body is not a tar of the function's directory: symlink {} points outside the function's directory",
                link.file_name().to_str().unwrap()
            ),
            None => broken.message.to_owned(),
        };
        assert_eq!(r.error(), message);
        let out = daemon.cli(&data, &["deploy", broken.dir.to_str().unwrap()]);
        assert_eq!(
            stderr(&out),
            format!("skiff: error: {message} (HTTP 400)\n")
        );
    }
    // A library only found when the environment is built: named as the sandbox would
    // see the handler, not as the daemon's scratch copy of the function.
    let lib_dir = data.dir.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::write(lib_dir.join("gone.c"), "int gone(void) { return 0; }\n").unwrap();
    let cc = |args: &[&str]| {
        let status = Command::new("cc").current_dir(&lib_dir).args(args).status();
        assert!(status.unwrap().success(), "cc {args:?}");
    };
    cc(&["-shared", "-fPIC", "-o", "libskiffgone.so", "gone.c"]);
    let needs_gone = function(
        &data,
        "needs-gone",
        "name: needs-gone\nruntime: binary\nhandler: ./main\n",
        None,
    );
    std::fs::write(
        lib_dir.join("main.c"),
        "int gone(void);\nint main(void) { return gone(); }\n",
    )
    .unwrap();
    let main = needs_gone.join("main");
    cc(&["-o", main.to_str().unwrap(), "main.c", "-L.", "-lskiffgone"]);
    let out = daemon.cli(&data, &["deploy", needs_gone.to_str().unwrap()]);
    assert_eq!(
        stderr(&out),
        "skiff: error: /code/main needs libskiffgone.so, which is not installed (HTTP 400)\n"
    );

    assert_eq!(daemon.get("/v1/functions").json(), json!([]));
    let scratch: Vec<_> = std::fs::read_dir(data.dir.join("functions"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(scratch.is_empty(), "left in DATA/functions: {scratch:?}");
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn invoke_sends_its_data_as_curl_does() {
    let data = Data::new("serve-invoke-data", 4);
    let daemon = Daemon::start(&data);
    let out = daemon.cli(&data, &["deploy", echo(&data).to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let invoke = |args: &[&str]| {
        let out = daemon.cli(&data, &[&["invoke", "echo"][..], args].concat());
        assert!(out.status.success(), "invoke {args:?}: {}", stderr(&out));
        out.stdout
    };
    assert_eq!(invoke(&["--data", r#"{"name": "x"}"#]), br#"{"name": "x"}"#);
    assert_eq!(invoke(&["-d", "short"]), b"short");
    // A file's bytes as they are, newlines and all.
    let file = data.dir.join("body.bin");
    std::fs::write(&file, b"line one\r\nline two\n\0\xff").unwrap();
    let at_file = format!("@{}", file.display());
    for flag in ["-d", "--data", "--data-binary"] {
        assert_eq!(
            invoke(&[flag, &at_file]),
            b"line one\r\nline two\n\0\xff",
            "{flag}"
        );
    }
    let mut child = data
        .cmd()
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["invoke", "echo", "-d", "@-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "from stdin", "{}", stderr(&out));
    assert_eq!(invoke(&[]), b"");

    // The data directory is --data-dir (or SKIFF_DATA); the old global --data is refused
    // rather than taken for a body or a directory.
    let out = Command::new(common::SKIFF)
        .env("SKIFF_DATA", &data.dir)
        .args(["pool"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&data.pool_name()), "{}", stdout(&out));
    let out = Command::new(common::SKIFF)
        .arg("--data")
        .arg(&data.dir)
        .arg("pool")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stdout(&out));
    assert_eq!(
        stderr(&out),
        "skiff: error: unexpected argument '--data' found; tip: a similar argument exists: \
         '--data-dir' (see `skiff help`)\n"
    );
    daemon.stop();
    assert_nothing_left(&data);
}

#[test]
fn a_daemon_killed_under_load_leaves_nothing_and_resumes_async_work() {
    let data = Data::new("serve-sigkill-load", 16);
    let mut daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-work");
    deploy(&daemon, &data, "py-contract");
    // An async invocation still running when the daemon dies: its call is in the
    // handler (the only py-work instance is busy) and its record is not finished.
    let r = daemon.request("POST", "/async/py-work?sleep=2000", &[], br#"{"n": 42}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    wait_for(
        "the async invocation to run",
        Duration::from_secs(5),
        || {
            (daemon
                .instances_of("py-work")
                .iter()
                .any(|i| i["inflight"] == 1))
            .then_some(())
        },
    );

    // A load on both functions, then SIGKILL in the middle of it.
    let stop = AtomicBool::new(false);
    let port = daemon.port;
    let (instance_pids, daemon_pids, served) = std::thread::scope(|s| {
        let load: Vec<_> = (0..6)
            .map(|n| {
                let stop = &stop;
                s.spawn(move || {
                    let path = if n % 2 == 0 {
                        "/fn/py-work?sleep=150"
                    } else {
                        "/fn/py-contract"
                    };
                    let mut statuses = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        match http(port, "POST", path, &[], b"{}") {
                            Ok(r) => statuses.push(r.status),
                            // The daemon is gone.
                            Err(_) => break,
                        }
                    }
                    statuses
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(800));
        let instances: Vec<i32> = daemon
            .get("/v1/instances")
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["pid"].as_i64().unwrap() as i32)
            .collect();
        let daemon_pids: Vec<i32> = data.skiff_processes().iter().map(|p| p.0).collect();
        assert!(daemon_pids.contains(&(daemon.child.id() as i32)));
        let before_kill = daemon.invocation(&id);
        assert!(
            before_kill["status"] == "queued" || before_kill["status"] == "running",
            "the async invocation ended before the kill: {before_kill}"
        );
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        let served: Vec<u16> = load.into_iter().flat_map(|t| t.join().unwrap()).collect();
        (instances, daemon_pids, served)
    });
    assert!(
        served.len() >= 6 && served.iter().all(|&s| s == 200),
        "the load before the kill: {served:?}"
    );
    // Every instance (several: 6 clients, 1 call per instance at a time) died with it,
    // and so did the daemon's spawner.
    assert!(instance_pids.len() >= 3, "{instance_pids:?}");
    for pid in &instance_pids {
        assert!(
            wait_gone(*pid, Duration::from_secs(5)),
            "instance pid {pid} outlived the daemon"
        );
    }
    for pid in &daemon_pids {
        assert!(
            wait_gone(*pid, Duration::from_secs(5)),
            "daemon process {pid} outlived the SIGKILL"
        );
    }
    assert_eq!(data.pool_processes(), Vec::<i32>::new());
    drop(daemon);

    // Restarted on the same data directory: everything is there and works.
    let daemon = Daemon::start(&data);
    let names: Vec<Value> = daemon
        .get("/v1/functions")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("py-contract"), json!("py-work")]);
    let record = wait_for(
        "the async invocation to finish after the restart",
        Duration::from_secs(15),
        || {
            let record = daemon.invocation(&id);
            match record["status"].as_str().unwrap() {
                "queued" | "running" => None,
                _ => Some(record),
            }
        },
    );
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["http_status"], 200, "{record}");
    let result: Value = serde_json::from_str(record["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({"echo": {"n": 42}, "slept_ms": 2000}));
    let r = daemon.request("POST", "/fn/py-work", &[], br#"{"after": "restart"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["echo"], json!({"after": "restart"}));
    let r = daemon.request("POST", "/fn/py-contract/x", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["path"], "/x");
    // The dead daemon's claims were taken back: one slot per live instance.
    assert_eq!(data.slots_in_use(), daemon.instance_count());
    daemon.stop();
    assert_nothing_left(&data);
}

/// Reads one HTTP request (head and Content-Length body) from `conn` and answers 200.
fn read_request(conn: &mut std::net::TcpStream) -> (String, Vec<(String, String)>, Vec<u8>) {
    conn.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let split = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the callback ended before its head");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = raw[split + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the callback ended before its body");
        body.extend_from_slice(&buf[..n]);
    }
    conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .unwrap();
    (request_line, headers, body)
}

#[test]
fn async_invocations_finish_in_the_background_and_call_back() {
    let data = Data::new("serve-async", 8);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-work");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let authority = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let callback = format!("http://{authority}/done?tag=1");
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let _ = tx.send(read_request(&mut conn));
    });

    let r = daemon.request(
        "POST",
        "/async/py-work/job?sleep=1000",
        &[("X-Callback-Url", &callback)],
        br#"{"x": 1}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let accepted = r.json();
    let id = accepted["id"].as_str().unwrap().to_owned();
    assert_eq!(accepted, json!({"id": id, "status": "queued"}));
    assert_eq!(r.header("x-call-id"), Some(id.as_str()));
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/invocations/{id}").as_str())
    );
    // While its handler runs (the instance is busy with it), the record says so.
    wait_for(
        "the async call to reach its handler",
        Duration::from_secs(5),
        || {
            daemon
                .instances_of("py-work")
                .iter()
                .any(|i| i["inflight"] == 1)
                .then_some(())
        },
    );
    // It says `running` once its record is stored (fsynced), a moment after the lease.
    let asked = Instant::now();
    let mut while_running = daemon.invocation(&id);
    while while_running["status"] == "queued" && asked.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
        while_running = daemon.invocation(&id);
    }
    let record = wait_for("the async invocation", Duration::from_secs(10), || {
        let record = daemon.invocation(&id);
        match record["status"].as_str().unwrap() {
            "queued" | "running" => None,
            _ => Some(record),
        }
    });
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["async"], true, "{record}");
    assert_eq!(record["http_status"], 200, "{record}");
    assert_eq!(record["callback_url"], callback.as_str(), "{record}");
    assert_eq!(record["logs"], json!(["py-work slept 1000 ms"]), "{record}");
    let result: Value = serde_json::from_str(record["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({"echo": {"x": 1}, "slept_ms": 1000}));

    // The callback: a POST of the result, with the invocation's id.
    let (request_line, headers, body) = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("no callback came");
    server.join().unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(request_line, "POST /done?tag=1 HTTP/1.1");
    assert_eq!(header("x-call-id"), Some(id.as_str()), "{headers:?}");
    // Checked last (below), so that everything else is checked either way.
    let callback_host = header("host").map(str::to_owned);
    assert_eq!(header("x-function-name"), Some("py-work"), "{headers:?}");
    assert_eq!(header("x-function-status"), Some("200"), "{headers:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        result,
        "{}",
        String::from_utf8_lossy(&body)
    );

    // The CLI's --async, and `skiff invocation`.
    let out = daemon.cli(
        &data,
        &["invoke", "py-work", "-d", r#"{"y": 2}"#, "--async"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id2 = stdout(&out).trim().to_owned();
    assert!(
        id2.len() == 16 && id2.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id2:?}"
    );
    let shown = wait_for(
        "the CLI's async invocation",
        Duration::from_secs(10),
        || {
            let out = daemon.cli(&data, &["invocation", &id2]);
            assert!(out.status.success(), "{}", stderr(&out));
            let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
            (shown["status"] == "succeeded").then_some(shown)
        },
    );
    let result: Value = serde_json::from_str(shown["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({"echo": {"y": 2}, "slept_ms": 0}));
    // Both listed under the function.
    let listed = daemon.get("/v1/invocations?function=py-work").json();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&id2.as_str()),
        "{ids:?}"
    );

    // Refused up front: a callback that is not http://, a function that does not exist.
    let r = daemon.request(
        "POST",
        "/async/py-work",
        &[("X-Callback-Url", "https://example.com/x")],
        b"",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("X-Callback-Url"), "{}", r.text());
    let r = daemon.request("POST", "/async/nope", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    daemon.stop();
    assert_nothing_left(&data);
    // Last, so that everything above is checked either way. The record of an async
    // invocation whose handler runs says `running`; the callback's Host is the URL's
    // authority, port included (RFC 9112, 3.2: "identical to that authority component").
    let mut wrong = Vec::new();
    if while_running["status"] != "running" {
        wrong.push(format!(
            "GET /v1/invocations/ID while its handler runs: status {} (expected running): \
             {while_running}",
            while_running["status"]
        ));
    }
    if callback_host.as_deref() != Some(authority.as_str()) {
        wrong.push(format!(
            "the callback's Host header is {callback_host:?}, expected {authority:?}"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_request_abandoned_by_its_client_gives_its_instance_back() {
    let data = Data::new("serve-abandon", 8);
    let daemon = Daemon::start(&data);
    // max_instances 1, a handler that sleeps 1 s.
    deploy(&daemon, &data, "py-queue");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    stream
        .write_all(&request_bytes("GET", "/fn/py-queue", &[], b""))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(daemon.instances_of("py-queue")[0]["inflight"], 1);
    // The client goes away mid-call: the handler's future is dropped.
    drop(stream);
    wait_for(
        "the instance to be free again",
        Duration::from_secs(5),
        || (daemon.instances_of("py-queue")[0]["inflight"] == 0).then_some(()),
    );
    let began = Instant::now();
    let r = daemon.get("/fn/py-queue");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// Invokes an escape fixture against `victim` (another instance's host pid) and checks
/// the identity every sandbox must have; returns its report.
fn escape_report(daemon: &Daemon, data: &Data, function: &str, victim: i64) -> Value {
    let r = daemon.request(
        "GET",
        &format!("/fn/{function}?pid={victim}"),
        &[("x-data-dir", data.dir.to_str().unwrap())],
        b"",
    );
    assert_eq!(r.status, 200, "{function}: {}", r.text());
    let v = r.json();
    let report = format!("{function}: {v:#}");
    assert_eq!(v["uid"], 65534, "{report}");
    assert_eq!(v["processes"], json!([1]), "{report}");
    assert_eq!(v["cap_eff"], "0000000000000000", "{report}");
    assert_eq!(v["cap_bnd"], "0000000000000000", "{report}");
    assert_eq!(v["no_new_privs"], "1", "{report}");
    assert_eq!(v["seccomp"], "2", "{report}");
    assert_eq!(v["host_data_dir"], false, "{report}");
    v
}

/// Every one of `attempts` in an escape report was refused.
fn assert_refused(report: &Value, attempts: &[&str]) {
    for attempt in attempts {
        let got = report[attempt].as_str().unwrap_or("missing");
        assert!(got.starts_with("refused"), "{attempt}: {got}\n{report:#}");
    }
}

/// Escape attempts from inside python3 and node instances, on both cold paths: forked
/// from the template and started plainly by the native spawner (the same sandbox entry
/// on every path: see `every_cold_path_enters_the_same_sandbox`). Every attempt must
/// fail, and the identity must be a sandbox's.
#[test]
fn escape_attempts_from_instances_fail_on_both_cold_paths() {
    for path in ["template", "plain"] {
        let data = Data::new(&format!("serve-escape-{path}"), 8);
        let daemon = Daemon::start_with(&data, &["--cold-start", path]);
        deploy(&daemon, &data, "py-other");
        deploy(&daemon, &data, "py-escape");
        // Forked or plain as asked: a template process exists only on the template
        // path (python3's; node's starts with the first node function, below). Its forks share its command line: the instances (as 65534) and the
        // spare it keeps ready (in a PID namespace of its own).
        let host_pid_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let template_proper = |pid: i32| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == host_pid_ns)
                && std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
        };
        let templates = data
            .skiff_processes()
            .iter()
            .filter(|(pid, cmd)| cmd.contains("--template") && template_proper(*pid))
            .count();
        assert_eq!(templates, usize::from(path == "template"), "{path}");
        let victim = daemon.instances_of("py-other")[0]["pid"].as_i64().unwrap();
        let py = escape_report(&daemon, &data, "py-escape", victim);
        assert_eq!(py["pid"], 1, "{path}: {py:#}");
        assert_eq!(py["kcore_bytes"], 0, "{path}: {py:#}");
        assert_refused(
            &py,
            &[
                "mount",
                "unshare_mnt",
                "unshare_user",
                "setuid_root",
                "chroot",
                "write_root",
                "write_code",
                "mknod",
                "sysrq",
                "ptrace_target",
                "kill_target",
            ],
        );
        // The same from node, with what node offers (forked from node's template on the
        // template path).
        deploy(&daemon, &data, "node-escape");
        let node = escape_report(&daemon, &data, "node-escape", victim);
        assert_eq!(
            node["bootstrap_names"],
            json!(["undefined", "undefined", "undefined"]),
            "{path}: {node:#}"
        );
        assert_refused(
            &node,
            &[
                "write_root",
                "write_code",
                "setuid_root",
                "kill_target",
                "sysrq",
            ],
        );
        // The victim is untouched.
        assert_eq!(daemon.get("/fn/py-other/ok").status, 200, "{path}");
        daemon.stop();
        assert_nothing_left(&data);
    }
}

/// The sandbox entry (crates/sandbox/src/entry.c) is the one every cold path takes: the
/// native spawner (plain starts), python's template and node's. An instance's view of
/// its own sandbox (identity, capabilities, no_new_privs, seccomp, limits, every mount
/// and its options, the read-only root, the directory) is the same on all of them, and
/// is a locked-down sandbox's.
#[test]
fn every_cold_path_enters_the_same_sandbox() {
    let mut reports: Vec<(String, Value)> = Vec::new();
    for path in ["template", "plain"] {
        let data = Data::new(&format!("serve-entry-{path}"), 8);
        let daemon = Daemon::start_with(&data, &["--cold-start", path]);
        for function in ["py-entry", "node-entry"] {
            deploy(&daemon, &data, function);
            let r = daemon.request("POST", &format!("/fn/{function}"), &[], b"");
            assert_eq!(r.status, 200, "{function} {path}: {}", r.text());
            // Forked from its runtime's template (whose command line it keeps) or not.
            let pid = daemon.instances_of(function)[0]["pid"].as_i64().unwrap();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
            let forked = cmdline
                .split(|&b| b == 0)
                .any(|arg| arg == b"--template" || arg == b"@template");
            assert_eq!(forked, path == "template", "{function} {path}");
            if forked {
                // The entry's code, inherited from the template: python's as a shared
                // object, node's compiled into its addon (the plain path's is in skiff).
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
                let object = if function == "py-entry" {
                    "skiff_entry"
                } else {
                    "node_template"
                };
                assert!(maps.contains(object), "{function}: no {object} in\n{maps}");
            }
            reports.push((format!("{function} {path}"), r.json()));
        }
        daemon.stop();
        assert_nothing_left(&data);
    }
    let (name, first) = &reports[0];
    for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            first["status"][key], "0000000000000000",
            "{name}: {first:#}"
        );
    }
    assert_eq!(
        first["status"]["Uid"], "65534 65534 65534 65534",
        "{name}: {first:#}"
    );
    assert_eq!(first["status"]["Groups"], "", "{name}: {first:#}");
    assert_eq!(first["status"]["NoNewPrivs"], "1", "{name}: {first:#}");
    assert_eq!(first["status"]["Seccomp"], "2", "{name}: {first:#}");
    assert_eq!(first["root"], "EROFS", "{name}: {first:#}");
    let mounts: Vec<&str> = first["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for expected in ["/ ro,", "/proc/sys ro,", "/tmp rw,", "/dev/shm rw,"] {
        assert!(
            mounts.iter().any(|m| m.starts_with(expected)),
            "{name}: no mount {expected:?} in {mounts:#?}"
        );
    }
    // runc's masks: whichever of its /proc paths this kernel has are covered.
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with("/proc/") && !m.contains(" proc ")),
        "{name}: nothing in /proc is masked: {mounts:#?}"
    );
    for (other, report) in &reports[1..] {
        assert_eq!(report, first, "{other} differs from {name}");
    }
}

/// `skiff gc` beside a running daemon: the daemon's claims are not leftovers, however
/// old; `gc --pools` refuses.
#[test]
fn gc_leaves_a_running_daemons_instances_alone() {
    let data = Data::new("serve-gc", 8);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-other");
    let pid = daemon.instances_of("py-other")[0]["pid"].as_i64().unwrap() as i32;
    // Past gc's grace period for young claims.
    std::thread::sleep(Duration::from_secs(11));
    let out = data.skiff(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        pid_alive(pid),
        "gc killed the daemon's instance: {}",
        stdout(&out)
    );
    assert_eq!(daemon.get("/fn/py-other").status, 200);
    assert_eq!(daemon.instances_of("py-other")[0]["pid"], pid);
    let out = data.skiff(&["gc", "--pools"]);
    assert_eq!(out.status.code(), Some(125), "{}", stdout(&out));
    assert!(stderr(&out).contains("skiff serve"), "{}", stderr(&out));
    daemon.stop();
    assert_nothing_left(&data);
}

/// A python3 function with packages gets a template of its own that has imported them:
/// its instances are forks of it, each in its own cgroup slot, as sandboxed as any
/// instance, drawing their own random numbers; the template is listed, and it goes with
/// its function.
#[test]
fn a_function_with_packages_forks_from_a_template_of_its_own() {
    let data = Data::new("serve-fn-template", 8);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "py-packages");
    let templates = || daemon.templates();
    let listed = templates();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["function"], "py-packages");
    let ps = stdout(&daemon.cli(&data, &["ps"]));
    assert!(ps.contains("template of function py-packages"), "{ps}");
    // Two calls at once: two instances, forked.
    let (a, b) = std::thread::scope(|s| {
        let call = || s.spawn(|| daemon.get("/fn/py-packages?sleep"));
        let (a, b) = (call(), call());
        (a.join().unwrap(), b.join().unwrap())
    });
    let (a, b) = (a.json(), b.json());
    for v in [&a, &b] {
        assert_eq!(v["preloaded"], true, "{v:#}");
        assert_eq!(v["uid"], 65534, "{v:#}");
        assert_eq!(v["cap_eff"], "0000000000000000", "{v:#}");
        assert_eq!(v["seccomp"], "2", "{v:#}");
        assert_eq!(v["no_new_privs"], "1", "{v:#}");
        assert!(v["six"]
            .as_str()
            .unwrap()
            .starts_with("/usr/lib/python3/dist-packages/"));
        // Their channel and nothing else of the template's (the listing's own is 3).
        assert_eq!(v["fds"].as_array().unwrap().len(), 5, "{v:#}");
        // Moved out of the template's cgroup (its namespace's root) into their own.
        assert_ne!(v["cgroup"], "/", "{v:#}");
    }
    assert_ne!(a["pid"], b["pid"]);
    assert_ne!(a["cgroup"], b["cgroup"]);
    assert_ne!(a["random"], b["random"]);
    assert_ne!(a["urandom"], b["urandom"]);
    let metrics = daemon.get("/metrics").text();
    assert!(
        metrics.contains("skiff_function_template_memory_bytes{function=\"py-packages\"}"),
        "{metrics}"
    );
    // A crash of a fork: a 502, its last words kept; the template stays.
    let r = daemon.get("/fn/py-packages?crash");
    assert_eq!(r.status, 502, "{}", r.text());
    let id = r.header("x-skiff-invocation-id").unwrap().to_owned();
    let record = daemon.get(&format!("/v1/invocations/{id}")).json();
    assert_eq!(record["logs"], json!(["last words"]), "{record:#}");
    // Its status comes from its template, which reaps it.
    assert!(r.text().contains("killed by signal 9"), "{}", r.text());
    assert_eq!(templates().len(), 1);
    assert_eq!(daemon.get("/fn/py-packages").status, 200);
    // Removed with its function.
    assert_eq!(
        daemon
            .request("DELETE", "/v1/functions/py-packages", &[], b"")
            .status,
        204
    );
    // Its fork ends with it, and their slots are released a moment later.
    wait_for(
        "the template and its fork to end",
        Duration::from_secs(5),
        || (templates().is_empty() && data.slots_in_use() == 0).then_some(()),
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// Idle function templates past `--template-memory` stop, least recently used first;
/// one whose instances live stays.
#[test]
fn idle_function_templates_past_their_budget_stop() {
    let data = Data::new("serve-fn-template-budget", 8);
    let daemon = Daemon::start_with(&data, &["--template-memory", "1"]);
    deploy(&daemon, &data, "py-packages");
    // The same function under a second name.
    let second = data.dir.join("py-packages-2");
    std::fs::create_dir_all(&second).unwrap();
    let fixture = fixture("py-packages");
    std::fs::copy(fixture.join("main.py"), second.join("main.py")).unwrap();
    let manifest = std::fs::read_to_string(fixture.join("skiff.yaml")).unwrap();
    std::fs::write(
        second.join("skiff.yaml"),
        manifest.replace("name: py-packages", "name: py-packages-2"),
    )
    .unwrap();
    let templates = || -> Vec<String> {
        let all = daemon.get("/v1/instances").json();
        let mut names: Vec<String> = all
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["role"] == "template")
            .map(|i| i["function"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    // The first one's instance lives: its template stays.
    deploy_dir(&daemon, &data, &second);
    assert_eq!(templates(), ["py-packages", "py-packages-2"]);
    // Idle now: the next template start stops it.
    let stop = daemon.request("DELETE", "/v1/functions/py-packages/instances", &[], b"");
    assert!(stop.status < 300, "{}", stop.text());
    wait_for(
        "py-packages to have no instance",
        Duration::from_secs(5),
        || daemon.instances_of("py-packages").is_empty().then_some(()),
    );
    let stop = daemon.request("DELETE", "/v1/functions/py-packages-2/instances", &[], b"");
    assert!(stop.status < 300, "{}", stop.text());
    // Redeployed: py-packages-2 gets a new template, which evicts py-packages's.
    std::fs::write(second.join("extra.txt"), "a new version").unwrap();
    deploy_dir(&daemon, &data, &second);
    wait_for("the idle template to stop", Duration::from_secs(5), || {
        (templates() == ["py-packages-2"]).then_some(())
    });
    // An evicted template comes back on the next cold start.
    assert_eq!(daemon.get("/fn/py-packages").status, 200);
    assert!(templates().contains(&"py-packages".to_owned()));
    daemon.stop();
    assert_nothing_left(&data);
}

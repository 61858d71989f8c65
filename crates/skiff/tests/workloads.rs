//! Real python3 and node workloads on `skiff serve` (issue 14): the whole standard library
//! and wheels and addons with native code, on both cold paths (forked from the template
//! and started plainly); random state that forked instances must not share; the lines a
//! function printed before it timed out, ran out of memory or crashed; and the reason a
//! package that does not exist fails a deploy. The fixtures are in tests/functions/;
//! the packages come from PyPI and npm (their caches make reruns fast).

mod common;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::daemon::{assert_nothing_left, deploy, fixture, wait_for, Daemon, Response};
use common::{stderr, stdout, Data};

/// Modules with side effects (a browser, a poem on stdout, a GUI), left out on both sides.
const SIDE_EFFECTS: &[&str] = &[
    "antigravity",
    "this",
    "turtledemo",
    "idlelib",
    "tkinter",
    "_tkinter",
    "turtle",
];

impl Daemon {
    fn call(&self, method: &str, path: &str, body: &[u8]) -> Response {
        self.request(method, path, &[], body)
    }

    /// `GET /v1/invocations/ID` of the call that answered `r`.
    fn record_of(&self, r: &Response) -> Value {
        let id = r
            .header("x-skiff-invocation-id")
            .unwrap_or_else(|| panic!("no invocation id: {r:?}"));
        let record = self.get(&format!("/v1/invocations/{id}"));
        assert_eq!(record.status, 200, "invocation {id}: {}", record.text());
        record.json()
    }

    /// The function's instances, not its template (a function with packages has one).
    fn instances_of(&self, function: &str) -> usize {
        let all = self.get("/v1/instances").json();
        all.as_array()
            .unwrap_or_else(|| panic!("/v1/instances is not a list: {all}"))
            .iter()
            .filter(|i| i["function"] == function && i["role"] != "template")
            .count()
    }

    /// Ends the function's idle instances, so that its next call is a cold start.
    fn scale_to_zero(&self, function: &str) {
        let r = self.call(
            "DELETE",
            &format!("/v1/functions/{function}/instances"),
            b"",
        );
        assert!(r.status < 300, "scale {function} to zero: {}", r.text());
        wait_for(
            &format!("{function}'s instances to end"),
            Duration::from_secs(10),
            || (self.instances_of(function) == 0).then_some(()),
        );
    }

    /// A call that must be a cold start and answer 200 with JSON.
    fn cold_json(&self, what: &str, function: &str, body: &[u8]) -> Value {
        let r = self.call("POST", &format!("/fn/{function}"), body);
        assert_eq!(r.status, 200, "{what}: {function}: {}", r.text());
        assert_eq!(
            r.header("x-skiff-cold-start"),
            Some("true"),
            "{what}: {r:?}"
        );
        r.json()
    }
}

/// The standard library as the host's python imports it: every name in
/// `sys.stdlib_module_names` that `/usr/bin/python3.11` imports, bar [`SIDE_EFFECTS`].
fn host_stdlib() -> Vec<String> {
    let script = format!(
        "import contextlib, importlib, io, json, sys\n\
         ok = []\n\
         for name in sorted(set(sys.stdlib_module_names) - set({SIDE_EFFECTS:?})):\n\
         \x20   try:\n\
         \x20       with contextlib.redirect_stdout(io.StringIO()):\n\
         \x20           importlib.import_module(name)\n\
         \x20       ok.append(name)\n\
         \x20   except Exception:\n\
         \x20       pass\n\
         print(json.dumps(ok))\n"
    );
    let out = Command::new("/usr/bin/python3.11")
        .args(["-I", "-c", &script])
        .output()
        .expect("/usr/bin/python3.11 on the host");
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    // Far more than a stub of a standard library: a broken host fails here, not below.
    assert!(names.len() > 200, "{names:?}");
    names
}

/// py-stdlib imports the whole standard library; nothing it sees names a host path.
/// Returns what it sees of the interpreter (sys.path, the prefixes, sys.executable).
fn check_stdlib(daemon: &Daemon, data: &Data, path: &str, stdlib: &[String]) -> Value {
    let v = daemon.cold_json(path, "py-stdlib", &serde_json::to_vec(stdlib).unwrap());
    assert_eq!(v["failed"], json!({}), "{path}: imports failed");
    assert_eq!(v["imported"], stdlib.len(), "{path}: {v}");
    assert_eq!(v["absent"], json!([]), "{path}: paths not in the sandbox");
    assert_eq!(
        v["prefix"],
        json!(["/usr", "/usr", "/usr", "/usr"]),
        "{path}"
    );
    assert_eq!(v["executable"], "/usr/bin/python3", "{path}");
    let host = data.dir.to_str().unwrap();
    let sys_path: Vec<&str> = v["sys_path"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        sys_path.contains(&"/usr/lib/python3.11"),
        "{path}: {sys_path:?}"
    );
    assert!(sys_path.contains(&"/code"), "{path}: {sys_path:?}");
    let module_paths = v["module_paths"].as_array().unwrap();
    assert!(module_paths.len() > stdlib.len(), "{path}: {v}");
    let on_host: Vec<&str> = module_paths
        .iter()
        .filter_map(Value::as_str)
        .filter(|p| p.contains(host))
        .collect();
    assert!(on_host.is_empty(), "{path}: host paths: {on_host:?}");
    json!([v["sys_path"], v["prefix"], v["executable"]])
}

/// The wheels with native code compute.
fn check_wheels(daemon: &Daemon, path: &str) {
    let v = daemon.cold_json(path, "py-wheels", b"{}");
    assert_eq!(
        v,
        json!({
            "numpy": 506.0,
            "pandas": {"a": 4, "b": 6},
            "lxml": 42,
            "pillow": [[255, 0, 0], [0, 0, 0], "PNG"],
        }),
        "{path}"
    );
    let v = daemon.cold_json(path, "py-wheels-manifest", b"{}");
    assert_eq!(
        v,
        json!({
            "pydantic": [7, true],
            "sha256": "7985a8b8e1885ff73de4ece8dd8e8ed5280d2cd1422deb1f30f0c6aa1f4e70fc",
            "fernet": "round trip",
            "orjson": {"a": [1, 2.5, null]},
        }),
        "{path}"
    );
}

/// better-sqlite3's addon computes; package-lock.json's version is the one installed.
fn check_node_packages(daemon: &Daemon, path: &str) {
    let v = daemon.cold_json(path, "node-sqlite", br#"[["a", 1], ["b", 2], ["a", 3]]"#);
    assert_eq!(
        v["rows"],
        json!([{"k": "a", "total": 4}, {"k": "b", "total": 2}]),
        "{path}: {v}"
    );
    assert!(
        v["version"].as_str().is_some_and(|s| s.starts_with("3.")),
        "{path}: {v}"
    );
    let v = daemon.cold_json(path, "node-lock", b"{}");
    // The range (^7.0.0) alone would resolve to the newest 7.x.
    assert_eq!(v, json!({"version": "7.5.4", "satisfies": true}), "{path}");
}

/// node-sqlite first: it deploys on a thread of its own.
const PACKAGED: &[&str] = &[
    "node-sqlite",
    "py-stdlib",
    "py-wheels",
    "py-wheels-manifest",
    "node-lock",
];

#[test]
fn stdlib_native_packages_and_locks_work_on_both_cold_paths() {
    let stdlib = host_stdlib();
    // One data directory: the second deploys reuse the package layers the first built.
    let data = Data::new("workloads-packages", 8);
    let mut seen = Vec::new();
    for path in ["template", "plain"] {
        let daemon = Daemon::start_with(&data, &["--cold-start", path]);
        std::thread::scope(|s| {
            // Where better-sqlite3's prebuilt addon cannot be fetched, node-gyp builds it
            // (a minute or two): the other deploys go meanwhile.
            let (node, rest) = PACKAGED.split_first().unwrap();
            let node = s.spawn(|| deploy(&daemon, &data, node));
            for name in rest {
                deploy(&daemon, &data, name);
            }
            node.join().expect("deploy node-sqlite");
        });
        for name in PACKAGED {
            daemon.scale_to_zero(name);
        }
        seen.push(check_stdlib(&daemon, &data, path, &stdlib));
        check_wheels(&daemon, path);
        check_node_packages(&daemon, path);
        daemon.stop_within(Duration::from_secs(15));
        assert_nothing_left(&data);
    }
    // A forked instance sees the interpreter as a plain start does.
    assert_eq!(seen[0], seen[1], "template, then plain");
}

/// Two instances of one function, forked from the template at the same time, each
/// draw their own random numbers (python's `random` matters once a template has
/// imported it: the handler's module imports it after the fork today).
#[test]
fn forked_instances_draw_different_random_numbers() {
    let data = Data::new("workloads-random", 8);
    let daemon = Daemon::start_with(&data, &["--cold-start", "template"]);
    for name in ["py-random", "node-random"] {
        deploy(&daemon, &data, name);
        daemon.scale_to_zero(name);
        // concurrency 1 and a handler that waits: the second call needs a second instance.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| daemon.call("POST", &format!("/fn/{name}"), b""));
            let b = s.spawn(|| daemon.call("POST", &format!("/fn/{name}"), b""));
            (a.join().unwrap(), b.join().unwrap())
        });
        let (ra, rb) = (daemon.record_of(&a), daemon.record_of(&b));
        assert_ne!(
            ra["instance"], rb["instance"],
            "{name}: one instance served both"
        );
        assert_eq!(
            (ra["cold_start"].clone(), rb["cold_start"].clone()),
            (json!(true), json!(true))
        );
        let (a, b) = (a.json(), b.json());
        let draws = |v: &Value| v["random"].as_array().unwrap().clone();
        assert_eq!(draws(&a).len(), 4, "{a}");
        for (x, y) in draws(&a).iter().zip(&draws(&b)) {
            assert_ne!(x, y, "{name}: the instances drew the same numbers: {a} {b}");
        }
        if name == "node-random" {
            assert_ne!(
                a["bytes"], b["bytes"],
                "{name}: crypto.randomBytes repeated"
            );
        }
    }
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// What a handler printed before it timed out, ran out of memory, exited or was killed
/// by a signal is in the call's record and in `skiff logs`.
#[test]
fn lines_printed_before_a_timeout_an_oom_or_a_crash_are_kept() {
    for path in ["template", "plain"] {
        let data = Data::new(&format!("workloads-dying-{path}"), 8);
        let daemon = Daemon::start_with(&data, &["--cold-start", path]);
        for name in ["py-dying", "node-dying"] {
            deploy(&daemon, &data, name);
            check_dying(&daemon, &data, path, name);
        }
        daemon.stop_within(Duration::from_secs(15));
        assert_nothing_left(&data);
    }
}

/// Each way `name` can die, after printing a line to stdout and one to stderr.
fn check_dying(daemon: &Daemon, data: &Data, path: &str, name: &str) {
    for (case, status, why) in [
        ("timeout", 504, "timed out"),
        ("oom", 502, "out of memory"),
        ("exit", 502, "exited with 3"),
        ("signal", 502, "signal"),
        ("uncaught", 502, "exited with 1"),
    ] {
        if case == "uncaught" && name != "node-dying" {
            continue;
        }
        let what = format!("{path}: {name}/{case}");
        let r = daemon.call("GET", &format!("/fn/{name}/{case}"), b"");
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert!(r.text().contains(why), "{what}: {}", r.text());
        let record = daemon.record_of(&r);
        let id = record["id"].as_str().unwrap();
        let printed = [
            format!("{name} before {case}"),
            format!("{name} to stderr before {case}"),
        ];
        let logs = stdout(&daemon.cli(data, &["logs", name, "--invocation", id]));
        for line in &printed {
            assert!(
                record["logs"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|x| x == line.as_str())),
                "{what}: {line:?} not in the record: {record}"
            );
            assert!(
                logs.lines().any(|l| l.ends_with(&format!(": {line}"))),
                "{what}: {line:?} not in `skiff logs`:\n{logs}"
            );
        }
        if case == "uncaught" {
            // What node prints of the exception, in the function's log at least.
            let logs = stdout(&daemon.cli(data, &["logs", name]));
            assert!(
                logs.contains("Error: node-dying uncaught"),
                "{what}: no error in `skiff logs`:\n{logs}"
            );
        }
    }
}

/// A package that does not exist: the deploy fails with pip's and npm's own reason.
#[test]
fn a_missing_package_fails_the_deploy_with_the_tools_reason() {
    let data = Data::new("workloads-missing", 8);
    let daemon = Daemon::start(&data);
    for (name, says) in [
        (
            "py-missing",
            "No matching distribution found for a-package-that-does-not-exist-xyz",
        ),
        ("node-missing", "E404"),
    ] {
        let out = daemon.cli(&data, &["deploy", fixture(name).to_str().unwrap()]);
        let error = stderr(&out);
        assert!(!out.status.success(), "{name} deployed: {}", stdout(&out));
        assert!(error.contains(says), "{name}: {says:?} not in: {error}");
        assert!(
            error.contains("a-package-that-does-not-exist-xyz"),
            "{name}: {error}"
        );
        // No host path: neither the data directory nor the tool's scratch directory.
        assert!(
            !error.contains(data.dir.to_str().unwrap()),
            "{name}: {error}"
        );
        assert!(!error.contains("skiff-packages-"), "{name}: {error}");
        assert_eq!(daemon.get(&format!("/v1/functions/{name}")).status, 404);
    }
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

//! Sessions of wasm functions end to end (issue 6): strong state is linearizable under
//! contention through secondaries, weak operations are atomic, checkpoint and restore
//! round-trip exactly, `durability: wal` loses no acknowledged write when a worker or
//! the daemon is killed, hostile guests are stopped without harm to the session, hints
//! cannot be forged, a wasm hook routes, pub/sub survives the publisher's restore, and
//! the operator routes and metrics follow. Real daemon, real sandboxed workers, real
//! HTTP; the guests are in tests/wasm-guests/ (built by scripts/build-wasm.sh into
//! tests/functions/wasm-*/).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::daemon::{
    assert_nothing_left, deploy, deploy_dir, fixture, http, wait_for, Daemon, Response,
};
use common::{wait_gone, Data};

/// The header that carries a session hint, both ways.
const HINT: &str = "x-skiff-session";

impl Response {
    /// The session hint the daemon gave.
    fn hint(&self) -> String {
        self.header(HINT)
            .unwrap_or_else(|| panic!("HTTP {} has no {HINT}: {}", self.status, self.text()))
            .to_owned()
    }

    /// The body of a 200 answer (panics with the answer otherwise).
    fn ok(&self) -> String {
        assert_eq!(self.status, 200, "{}", self.text());
        self.text()
    }
}

impl Daemon {
    fn post(&self, path: &str) -> Response {
        self.request("POST", path, &[], b"")
    }

    /// `POST /fn/FUNCTION` in the session `key` (sent as `x-session`).
    fn call(&self, function: &str, key: &str, body: &str) -> Response {
        self.request(
            "POST",
            &format!("/fn/{function}"),
            &[("x-session", key)],
            body.as_bytes(),
        )
    }

    /// `GET /v1/sessions`.
    fn sessions(&self) -> Vec<Value> {
        let r = self.get("/v1/sessions");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json().as_array().expect("a list").clone()
    }

    /// The `/v1/sessions` entry of session `id`.
    fn session(&self, id: &str) -> Option<Value> {
        self.sessions().into_iter().find(|s| s["id"] == id)
    }

    /// `GET /v1/sessions/ID/state` as {key: (value as JSON, bytes)}.
    fn state(&self, id: &str) -> BTreeMap<String, (Value, u64)> {
        let r = self.get(&format!("/v1/sessions/{id}/state"));
        assert_eq!(r.status, 200, "state of {id}: {}", r.text());
        r.json()
            .as_array()
            .unwrap_or_else(|| panic!("state is not a list: {}", r.text()))
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().expect("a text key").to_owned(),
                    (e["value"].clone(), e["bytes"].as_u64().expect("bytes")),
                )
            })
            .collect()
    }

    /// The value of an unlabelled line of `/metrics`.
    fn metric(&self, name: &str) -> u64 {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200);
        let text = r.text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    }

    /// Stops the daemon as an operator does (SIGTERM) and checks that it exits cleanly.
    fn stop(self) {
        self.stop_within(Duration::from_secs(30));
    }

    /// SIGKILL, as a crash would.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// A copy of fixture `name` in the data directory, deployed as `new_name` with
/// `edit` applied to its skiff.yaml.
fn variant(data: &Data, name: &str, new_name: &str, edit: &[(&str, &str)]) -> PathBuf {
    let src = fixture(name);
    let dir = data.dir.join("fn").join(new_name);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let mut manifest = std::fs::read_to_string(src.join("skiff.yaml")).unwrap();
    manifest = manifest.replace(&format!("name: {name}\n"), &format!("name: {new_name}\n"));
    for (from, to) in edit {
        assert!(
            manifest.contains(from),
            "{from:?} not in {name}'s skiff.yaml"
        );
        manifest = manifest.replace(from, to);
    }
    std::fs::write(dir.join("skiff.yaml"), manifest).unwrap();
    dir
}

/// The session id a hint names (its first 32 hex digits).
fn id_of(hint: &str) -> String {
    hint[..32].to_owned()
}

/// Host pids of the session workers in the test's own pool whose command line holds
/// `--session ROLE`: processes the test's daemon started, nothing else.
fn workers(data: &Data, role: &str) -> Vec<i32> {
    data.pool_processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                    args.windows(2)
                        .any(|w| w[0] == b"--session" && w[1] == role.as_bytes())
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The pid of the one primary worker of the test's daemon.
fn primary_pid(data: &Data) -> i32 {
    wait_for(
        "one primary worker",
        Duration::from_secs(10),
        || match workers(data, "primary")[..] {
            [pid] => Some(pid),
            _ => None,
        },
    )
}

/// Waits for the test's daemon to have no primary worker running.
fn no_primary_left(data: &Data) {
    wait_for("the primary worker to end", Duration::from_secs(10), || {
        workers(data, "primary").is_empty().then_some(())
    });
}

/// 1. Strong mode is linearizable under contention: 10,000 increments from 50 clients
///    on one session with a concurrency cap of 4, so secondaries start and reach the
///    primary's state over RPC; none is lost and no two see the same count.
#[test]
fn strong_increments_are_linearizable_through_secondaries() {
    const CLIENTS: usize = 50;
    const EACH: usize = 200;
    let data = Data::new("sess-strong", 24);
    let daemon = Daemon::start(&data);
    let dir = variant(
        &data,
        "wasm-counter",
        "counter4",
        &[("max_concurrency: 10", "max_concurrency: 4")],
    );
    deploy_dir(&daemon, &data, &dir);
    let id = id_of(&daemon.call("counter4", "contended", "get").hint());

    let port = daemon.port;
    let done = Arc::new(AtomicBool::new(false));
    let most_workers = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let values: Vec<u64> = std::thread::scope(|s| {
        let watcher = {
            let (done, most, id) = (done.clone(), most_workers.clone(), id.clone());
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Ok(r) = http(port, "GET", "/v1/sessions", &[], b"") {
                        let n = r
                            .json()
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|e| e["id"] == id.as_str())
                            .and_then(|e| e["workers"].as_u64())
                            .unwrap_or(0);
                        most.fetch_max(n, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(move || {
                    (0..EACH)
                        .map(|_| {
                            let r = http(
                                port,
                                "POST",
                                "/fn/counter4",
                                &[("x-session", "contended")],
                                b"+",
                            )
                            .unwrap_or_else(|e| panic!("increment: {e}"));
                            let body = r.ok();
                            body.parse::<u64>()
                                .unwrap_or_else(|_| panic!("increment answered {body:?}"))
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let values = clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        done.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        values
    });
    eprintln!(
        "{} increments in {:?}, at most {} workers",
        values.len(),
        began.elapsed(),
        most_workers.load(Ordering::Relaxed)
    );
    let seen: BTreeSet<u64> = values.iter().copied().collect();
    assert_eq!(
        seen.len(),
        values.len(),
        "two increments saw the same count"
    );
    assert_eq!(
        seen,
        (1..=(CLIENTS * EACH) as u64).collect::<BTreeSet<u64>>(),
        "the counts seen are not exactly 1..=10000"
    );
    assert_eq!(daemon.call("counter4", "contended", "get").ok(), "10000");
    assert!(
        most_workers.load(Ordering::Relaxed) > 1,
        "no secondary worker started under 50 clients with max_concurrency 4"
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// 2. Weak operations are atomic: concurrent 64 KiB writes of different fills and reads
///    of the same key; every read is one whole write, never a mix.
#[test]
fn weak_writes_and_reads_are_atomic() {
    const LEN: usize = 65536;
    let data = Data::new("sess-weak", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-weak");
    assert_eq!(daemon.call("wasm-weak", "atomic", "w k A 65536").ok(), "ok");
    let port = daemon.port;
    let fills: Vec<u8> = b"BCDEFGHI".to_vec();
    let reads: Vec<Vec<u8>> = std::thread::scope(|s| {
        for &fill in &fills {
            s.spawn(move || {
                let cmd = format!("w k {} {LEN}", fill as char);
                for _ in 0..25 {
                    let r = http(
                        port,
                        "POST",
                        "/fn/wasm-weak",
                        &[("x-session", "atomic")],
                        cmd.as_bytes(),
                    )
                    .unwrap();
                    assert_eq!(r.ok(), "ok");
                }
            });
        }
        let readers: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(move || {
                    (0..40)
                        .map(|_| {
                            let r = http(
                                port,
                                "POST",
                                "/fn/wasm-weak",
                                &[("x-session", "atomic")],
                                b"r k",
                            )
                            .unwrap();
                            assert_eq!(r.status, 200, "{}", r.text());
                            r.body
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        readers
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect()
    });
    let mut seen = BTreeSet::new();
    for value in &reads {
        assert_eq!(value.len(), LEN, "a read saw a value of another length");
        let first = value[0];
        assert!(
            b"ABCDEFGHI".contains(&first),
            "a read saw byte {first} no write wrote"
        );
        assert!(
            value.iter().all(|b| *b == first),
            "a read saw a mix of writes: {:?}",
            value.iter().collect::<BTreeSet<_>>()
        );
        seen.insert(first);
    }
    eprintln!(
        "{} reads saw fills {}",
        reads.len(),
        seen.iter().map(|b| *b as char).collect::<String>()
    );
    let last = daemon.call("wasm-weak", "atomic", "r k").ok().into_bytes();
    assert_eq!(last.len(), LEN);
    assert!(fills.contains(&last[0]) && last.iter().all(|b| *b == last[0]));
    daemon.stop();
    assert_nothing_left(&data);
}

/// The weak fixture's value for (fill, len): LEN bytes of FILL.
fn weak_write(daemon: &Daemon, function: &str, session: &str, key: &str, fill: u8, len: usize) {
    let cmd = format!("w {key} {fill:03} {len}");
    assert_eq!(daemon.call(function, session, &cmd).ok(), "ok", "{cmd}");
}

/// 3. Checkpoint and restore round-trip exactly: keys of many sizes with text and
///    binary values, deleted keys staying deleted; a close (checkpoint, workers end)
///    and a restore give back the same state, byte for byte, to the operator's view
///    and to the guest; so does a daemon restart.
#[test]
fn checkpoint_and_restore_round_trip_exactly() {
    let data = Data::new("sess-checkpoint", 16);
    let daemon = Daemon::start(&data);
    // Checkpoint durability: the state on disk is only what checkpoints wrote.
    let dir = variant(
        &data,
        "wasm-weak",
        "weak-cp",
        &[("durability: wal", "durability: checkpoint")],
    );
    deploy_dir(&daemon, &data, &dir);
    let sizes = [0usize, 1, 2, 7, 100, 1000, 4095, 4096, 4097, 65536, 300_000];
    let fills = [0u8, 1, 10, 65, 127, 128, 200, 255, 97, 48, 13];
    let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for round in 0..4 {
        for (i, (&len, &fill)) in sizes.iter().zip(&fills).enumerate() {
            let key = format!("key-{round}-{i}");
            let fill = fill.wrapping_add(round as u8 * 31);
            weak_write(&daemon, "weak-cp", "cp", &key, fill, len);
            expected.insert(key, vec![fill; len]);
        }
    }
    // Overwrites and deletes: the checkpoint holds the last of each.
    weak_write(&daemon, "weak-cp", "cp", "key-0-9", 7, 12345);
    expected.insert("key-0-9".into(), vec![7; 12345]);
    for key in ["key-1-3", "key-2-10", "key-3-0"] {
        assert_eq!(
            daemon.call("weak-cp", "cp", &format!("d {key}")).ok(),
            "deleted"
        );
        expected.remove(key);
    }
    let hint = daemon.call("weak-cp", "cp", "r key-0-0").hint();
    let id = id_of(&hint);

    let before = daemon.state(&id);
    assert_eq!(
        before.keys().cloned().collect::<Vec<_>>(),
        expected.keys().cloned().collect::<Vec<_>>()
    );
    for (key, value) in &expected {
        assert_eq!(before[key].1, value.len() as u64, "{key}'s size");
    }
    let r = daemon.post(&format!("/v1/sessions/{id}/checkpoint"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = daemon.post(&format!("/v1/sessions/{id}/close"));
    assert_eq!(r.status, 204, "{}", r.text());
    let info = daemon
        .session(&id)
        .expect("a closed session is still listed");
    assert_eq!(info["workers"], 0, "{info}");
    assert!(info["disk_bytes"].as_u64().unwrap() > 0, "{info}");
    no_primary_left(&data);

    // The operator's look restores it.
    let after = daemon.state(&id);
    assert_eq!(after, before, "the state changed across close and restore");
    // And the guest sees every value, byte for byte.
    for (key, value) in &expected {
        let r = daemon.request(
            "POST",
            "/fn/weak-cp",
            &[(HINT, &hint)],
            format!("r {key}").as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.body == *value, "{key}: {} bytes back", r.body.len());
    }
    for key in ["key-1-3", "key-2-10", "key-3-0"] {
        assert_eq!(
            daemon.call("weak-cp", "cp", &format!("r {key}")).ok(),
            "absent"
        );
    }
    // A daemon stopped cleanly checkpoints its sessions; the next one restores them.
    daemon.stop();
    assert_nothing_left(&data);
    let daemon = Daemon::start(&data);
    assert_eq!(
        daemon.state(&id),
        before,
        "the state changed across a restart"
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// Clients that increment one session until `stop`; every acknowledged count (a 200
/// with a number) goes into `acks`, every other answer or error counts in `failures`.
struct Load {
    stop: AtomicBool,
    acks: Mutex<Vec<u64>>,
    failures: AtomicU64,
}

impl Load {
    fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    fn run<'s>(
        &'s self,
        s: &'s std::thread::Scope<'s, '_>,
        port: u16,
        function: &'s str,
        key: &'s str,
    ) {
        self.stop.store(false, Ordering::Relaxed);
        for _ in 0..8 {
            s.spawn(move || {
                let path = format!("/fn/{function}");
                while !self.stop.load(Ordering::Relaxed) {
                    match http(port, "POST", &path, &[("x-session", key)], b"+") {
                        Ok(r) if r.status == 200 => match r.text().parse::<u64>() {
                            Ok(n) => self.acks.lock().unwrap().push(n),
                            Err(_) => panic!("an increment answered 200 {:?}", r.text()),
                        },
                        _ => {
                            self.failures.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            });
        }
    }
}

/// Every acknowledged count is unique and at most `now`, and `now` counts them all.
fn assert_no_ack_lost(acks: &[u64], now: u64, what: &str) {
    let unique: BTreeSet<u64> = acks.iter().copied().collect();
    assert_eq!(
        unique.len(),
        acks.len(),
        "{what}: two acknowledged increments saw the same count"
    );
    let max = unique.last().copied().unwrap_or(0);
    assert!(
        now >= max && now >= acks.len() as u64,
        "{what}: an acknowledged increment was lost: the count is {now}, {} acks, the highest {max}",
        acks.len()
    );
}

/// 4. `durability: wal`: an acknowledged write is on disk before the reply, so SIGKILL
///    of the primary worker, then of the daemon itself, under load loses none.
#[test]
fn wal_loses_no_acknowledged_write_when_worker_or_daemon_is_killed() {
    let data = Data::new("sess-wal", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-counter");
    assert_eq!(daemon.call("wasm-counter", "wal", "+").ok(), "1");
    let load = Load {
        stop: AtomicBool::new(false),
        acks: Mutex::new(vec![1]),
        failures: AtomicU64::new(0),
    };

    // The primary worker killed under load.
    let primary = primary_pid(&data);
    std::thread::scope(|s| {
        load.run(s, daemon.port, "wasm-counter", "wal");
        wait_for(
            "200 acknowledged increments",
            Duration::from_secs(60),
            || (load.acked() >= 200).then_some(()),
        );
        // SAFETY: kill(2) of a worker of this test's own daemon (found in its pool).
        assert_eq!(unsafe { libc::kill(primary, libc::SIGKILL) }, 0);
        assert!(wait_gone(primary, Duration::from_secs(10)));
        let at_kill = load.acked();
        // The session comes back (restored from its checkpoint and log) and goes on.
        wait_for("increments after the kill", Duration::from_secs(60), || {
            (load.acked() >= at_kill + 200).then_some(())
        });
        load.stop.store(true, Ordering::Relaxed);
    });
    let now: u64 = daemon
        .call("wasm-counter", "wal", "get")
        .ok()
        .parse()
        .unwrap();
    assert_no_ack_lost(&load.acks.lock().unwrap(), now, "worker killed");
    assert_ne!(
        primary_pid(&data),
        primary,
        "the killed primary is still there"
    );
    eprintln!(
        "worker killed: count {now}, {} acks, {} failed calls",
        load.acked(),
        load.failures.load(Ordering::Relaxed)
    );

    // The daemon killed under load, restarted on the same data directory.
    let port = daemon.port;
    let mut daemon = Some(daemon);
    std::thread::scope(|s| {
        load.run(s, port, "wasm-counter", "wal");
        let start = load.acked();
        wait_for(
            "200 more acknowledged increments",
            Duration::from_secs(60),
            || (load.acked() >= start + 200).then_some(()),
        );
        daemon.take().unwrap().kill();
        load.stop.store(true, Ordering::Relaxed);
    });
    let daemon = Daemon::start(&data);
    let now: u64 = daemon
        .call("wasm-counter", "wal", "get")
        .ok()
        .parse()
        .unwrap();
    assert_no_ack_lost(&load.acks.lock().unwrap(), now, "daemon killed");
    // The restored session goes on from there.
    assert_eq!(
        daemon.call("wasm-counter", "wal", "+").ok(),
        (now + 1).to_string()
    );
    eprintln!(
        "daemon killed: count {now}, {} acks, {} failed calls",
        load.acked(),
        load.failures.load(Ordering::Relaxed)
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// 5. Hostile guests: a request that loops, one that allocates without end, one that
///    traps, and one that loops holding the strong lock on "n" are each stopped with a
///    clear error, the worker survives, other requests of the session go on, and the
///    state is intact.
#[test]
fn hostile_guests_are_stopped_without_harm_to_the_session() {
    let data = Data::new("sess-hostile", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-hostile");
    let call = |body: &str| daemon.call("wasm-hostile", "h", body);
    assert_eq!(call("+").ok(), "1");
    let worker = primary_pid(&data);

    // "loop": stopped at the 2 s timeout; meanwhile the session serves an increment.
    std::thread::scope(|s| {
        let looping = s.spawn(|| {
            let began = Instant::now();
            (call("loop"), began.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        let began = Instant::now();
        assert_eq!(call("+").ok(), "2");
        let took = began.elapsed();
        let (r, elapsed) = looping.join().unwrap();
        assert_eq!(r.status, 504, "loop: {}", r.text());
        assert!(
            elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(10),
            "loop stopped after {elapsed:?} (timeout 2 s)"
        );
        assert!(
            took < elapsed,
            "the increment took {took:?}: it waited for the loop"
        );
    });
    assert_eq!(call("+").ok(), "3");

    // "alloc": the memory limit stops it (a trap, or memory.grow failing in the guest).
    let r = call("alloc");
    let text = r.text();
    assert!(
        (r.status == 500 && text.to_lowercase().contains("memory"))
            || (r.status == 200 && text.starts_with("memory.grow failed after")),
        "alloc: HTTP {}: {text}",
        r.status
    );
    eprintln!("alloc: HTTP {}: {text}", r.status);
    assert_eq!(call("+").ok(), "4");

    // "trap": 500 with the trap's message.
    let r = call("trap");
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("unreachable"), "trap: {}", r.text());
    assert_eq!(call("+").ok(), "5");

    // "strongloop": 504, and the lock on "n" is released with it.
    let r = call("strongloop");
    assert_eq!(r.status, 504, "strongloop: {}", r.text());
    let began = Instant::now();
    assert_eq!(call("+").ok(), "6");
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "the increment after strongloop took {:?}",
        began.elapsed()
    );

    assert_eq!(
        workers(&data, "primary"),
        vec![worker],
        "the session's worker did not survive its hostile requests"
    );
    let id = id_of(&call("+").hint());
    let state = daemon.state(&id);
    assert_eq!(state["n"].0, "7", "{state:?}");
    daemon.stop();
    assert_nothing_left(&data);
}

/// 6. Hints: a valid one reaches its session without the key; an altered one, or one
///    of another function's session, is refused with 403; no key and no hint is 400.
#[test]
fn forged_hints_are_rejected() {
    let data = Data::new("sess-hints", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-counter");
    deploy(&daemon, &data, "wasm-weak");
    let hint = daemon.call("wasm-counter", "alice", "+").hint();
    assert_eq!(hint.len(), 64, "{hint}");
    let with_hint = |function: &str, hint: &str| {
        daemon.request("POST", &format!("/fn/{function}"), &[(HINT, hint)], b"+")
    };
    let r = with_hint("wasm-counter", &hint);
    assert_eq!(r.ok(), "2");
    assert_eq!(r.hint(), hint);
    for at in [0, 31, 32, 63] {
        let mut forged = hint.clone().into_bytes();
        forged[at] = if forged[at] == b'0' { b'1' } else { b'0' };
        let forged = String::from_utf8(forged).unwrap();
        let r = with_hint("wasm-counter", &forged);
        assert_eq!(r.status, 403, "hint altered at {at}: {}", r.text());
        assert!(r.header(HINT).is_none(), "a refused request got a hint");
    }
    for forged in [&hint[..32], "", &hint.to_uppercase(), &format!("{hint}0")] {
        let r = with_hint("wasm-counter", forged);
        assert_eq!(r.status, 403, "hint {forged:?}: {}", r.text());
    }
    // Genuine, but of wasm-counter's session: wasm-weak refuses it.
    let r = daemon.request("POST", "/fn/wasm-weak", &[(HINT, &hint)], b"r n");
    assert_eq!(r.status, 403, "{}", r.text());
    // A hint and a key that name different sessions.
    let r = daemon.request(
        "POST",
        "/fn/wasm-counter",
        &[(HINT, &hint), ("x-session", "bob")],
        b"+",
    );
    assert_eq!(r.status, 403, "{}", r.text());
    // No key and no hint.
    let r = daemon.request("POST", "/fn/wasm-counter", &[], b"+");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains(HINT), "{}", r.text());
    // None of that touched alice's session.
    assert_eq!(with_hint("wasm-counter", &hint).ok(), "3");
    daemon.stop();
    assert_nothing_left(&data);
}

/// 7. A wasm hook routes by the JSON "user": one session per user; a request the hook
///    cannot read gets an error, and the function goes on.
#[test]
fn a_wasm_hook_routes_by_user() {
    let data = Data::new("sess-hook", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-hook");
    let call = |body: &str| daemon.request("POST", "/fn/wasm-hook", &[], body.as_bytes());
    let ann1 = call(r#"{"user": "ann", "item": 1}"#);
    assert_eq!(ann1.ok(), "1");
    let bob1 = call(r#"{"user": "bob"}"#);
    assert_eq!(bob1.ok(), "1");
    assert_ne!(ann1.hint(), bob1.hint());
    let ann2 = call(r#"{"item": 2, "user": "ann"}"#);
    assert_eq!(ann2.ok(), "2");
    assert_eq!(ann2.hint(), ann1.hint());
    for bad in ["not json", r#"{"user": 7}"#, r#"{"name": "ann"}"#, ""] {
        let r = call(bad);
        assert!(
            r.status >= 400 && r.status != 502,
            "{bad:?}: HTTP {}: {}",
            r.status,
            r.text()
        );
        assert!(r.text().contains("session_key"), "{bad:?}: {}", r.text());
    }
    // The hint with a body of the same user reaches the same session.
    let r = daemon.request(
        "POST",
        "/fn/wasm-hook",
        &[(HINT, &ann1.hint())],
        br#"{"user": "ann"}"#,
    );
    assert_eq!(r.ok(), "3");
    assert_eq!(call(r#"{"user": "bob"}"#).ok(), "2");
    let ids: BTreeSet<String> = daemon
        .sessions()
        .iter()
        .filter(|s| s["function"] == "wasm-hook")
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        ids,
        BTreeSet::from([id_of(&ann1.hint()), id_of(&bob1.hint())])
    );
    daemon.stop();
    assert_nothing_left(&data);
}

/// 8. Pub/sub: session B reads what session A published through A's hint, also after
///    A was closed (the read restores A).
#[test]
fn published_values_survive_the_publishers_close() {
    let data = Data::new("sess-pubsub", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-pubsub");
    let a = daemon.call("wasm-pubsub", "a", "pub color deep blue");
    assert_eq!(a.ok(), "ok");
    let addr = a.hint();
    let get = |name: &str| daemon.call("wasm-pubsub", "b", &format!("get {addr} {name}"));
    assert_eq!(get("color").ok(), "deep blue");
    assert_eq!(get("size").ok(), "absent");
    let a_id = id_of(&addr);
    let r = daemon.post(&format!("/v1/sessions/{a_id}/close"));
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(daemon.session(&a_id).expect("listed")["workers"], 0);
    assert_eq!(get("color").ok(), "deep blue");
    assert!(
        daemon.session(&a_id).expect("listed")["workers"]
            .as_u64()
            .unwrap()
            > 0,
        "reading A's value did not restore A"
    );
    // A publishes again; B sees the new value.
    assert_eq!(daemon.call("wasm-pubsub", "a", "pub color red").ok(), "ok");
    assert_eq!(get("color").ok(), "red");
    // An address that is no session's hint reads nothing.
    let mut forged = addr.clone().into_bytes();
    forged[40] = if forged[40] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).unwrap();
    let r = daemon.call("wasm-pubsub", "b", &format!("get {forged} color"));
    assert_ne!(r.text(), "red", "a forged address read A's value");
    daemon.stop();
    assert_nothing_left(&data);
}

/// 9. The operator's view: /v1/sessions lists the session, /metrics counts sessions
///    and checkpoints, DELETE removes the session and its state.
#[test]
fn sessions_are_listed_counted_and_deleted() {
    let data = Data::new("sess-ops", 16);
    let daemon = Daemon::start(&data);
    deploy(&daemon, &data, "wasm-counter");
    assert_eq!(daemon.metric("skiff_sessions"), 0);
    assert_eq!(daemon.metric("skiff_session_checkpoints_total"), 0);
    for n in 1..=3 {
        assert_eq!(daemon.call("wasm-counter", "ops", "+").ok(), n.to_string());
    }
    let id = id_of(&daemon.call("wasm-counter", "ops", "get").hint());
    assert_eq!(daemon.metric("skiff_sessions"), 1);
    assert_eq!(daemon.metric("skiff_session_workers"), 1);
    assert_eq!(daemon.metric("skiff_sessions_opened_total"), 1);
    let info = daemon.session(&id).expect("the session is listed");
    assert_eq!(info["function"], "wasm-counter", "{info}");
    assert_eq!(info["workers"], 1, "{info}");
    let listed = daemon.sessions().len();
    assert_eq!(listed, 1);

    let r = daemon.post(&format!("/v1/sessions/{id}/checkpoint"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(daemon.metric("skiff_session_checkpoints_total"), 1);
    let r = daemon.post(&format!("/v1/sessions/{id}/close"));
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(daemon.metric("skiff_session_checkpoints_total"), 2);
    assert_eq!(daemon.metric("skiff_sessions"), 0);
    assert_eq!(daemon.metric("skiff_session_workers"), 0);
    assert_eq!(daemon.session(&id).expect("still listed")["workers"], 0);
    // The next request restores it.
    assert_eq!(daemon.call("wasm-counter", "ops", "+").ok(), "4");
    assert_eq!(daemon.metric("skiff_sessions"), 1);
    assert_eq!(daemon.metric("skiff_sessions_opened_total"), 2);

    let r = daemon.request("DELETE", &format!("/v1/sessions/{id}"), &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(daemon.session(&id).is_none(), "a deleted session is listed");
    assert_eq!(daemon.metric("skiff_sessions"), 0);
    no_primary_left(&data);
    assert_eq!(daemon.get(&format!("/v1/sessions/{id}/state")).status, 404);
    let r = daemon.request("DELETE", &format!("/v1/sessions/{id}"), &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    // Its state is gone: the same key starts over.
    assert_eq!(daemon.call("wasm-counter", "ops", "get").ok(), "0");
    assert_eq!(daemon.call("wasm-counter", "ops", "+").ok(), "1");
    daemon.stop();
    assert_nothing_left(&data);
}

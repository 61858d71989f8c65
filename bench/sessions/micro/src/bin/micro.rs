//! bench/sessions/micro: the parts of a request that happen inside a skiff worker, timed
//! one by one (the HTTP path is bench/sessions/run.sh's job):
//! - a request in a fresh instance: `Host::run` (instantiate from the pooling allocator,
//!   a WASI context, the call) of kvapp's `ro`, `seed`, `rmw`, `linear` and a bad input
//!   (no state call), with a `Space` as the state, as the primary worker runs them;
//! - a 1 KiB state read: `Space::read` (the primary), `Remote::read` (a secondary, over
//!   the Unix socket RPC), next to a Redis GET of 1 KiB with the `redis` crate;
//!
//! Usage: micro KVAPP.wasm REDIS_PORT [RUNS]   (prints one JSON object per line)

use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use skiff_session::{Durability, Locking, Mode, Remote, Space, State};
use skiff_wasm::{Host, Published, Request, Sizing};

struct NoPublished;
impl Published for NoPublished {
    fn read(
        &self,
        _: &str,
        _: &str,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, skiff_session::Error> {
        Ok(None)
    }
}

/// Times `f` `runs` times (after `runs / 10` untimed warm-up calls); prints a JSON line
/// with p50, p99 and mean in microseconds.
fn time(name: &str, runs: usize, mut f: impl FnMut(usize)) {
    for i in 0..runs / 10 {
        f(i);
    }
    let mut samples = Vec::with_capacity(runs);
    let all = Instant::now();
    for i in 0..runs {
        let t = Instant::now();
        f(i);
        samples.push(t.elapsed());
    }
    let mean = all.elapsed().as_secs_f64() * 1e6 / runs as f64;
    samples.sort();
    let us = |q: f64| samples[((runs as f64 * q) as usize).min(runs - 1)].as_secs_f64() * 1e6;
    println!(
        "{{\"name\":\"{name}\",\"runs\":{runs},\"p50_us\":{:.3},\"p99_us\":{:.3},\"mean_us\":{mean:.3}}}",
        us(0.5),
        us(0.99)
    );
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 3, "usage: micro KVAPP.wasm REDIS_PORT [RUNS]");
    let runs: usize = args.get(3).map_or(Ok(20_000), |s| s.parse())?;
    let tmp = std::env::temp_dir().join(format!("skiff-sessions-micro.{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = run(&args[1], &args[2], runs, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn run(wasm: &str, redis_port: &str, runs: usize, tmp: &std::path::Path) -> Result<()> {
    // As the daemon does at deploy, then the worker at start: compile once, map it.
    let compiled = tmp.join("kvapp.cwasm");
    let module = std::fs::read(wasm).with_context(|| format!("reading {wasm}"))?;
    std::fs::write(&compiled, skiff_wasm::compile(&module, &["handle"])?)?;
    // A worker's sizing with the default session cap (10) and memory limit (128 MiB).
    let host = Host::load(&compiled, Sizing { instances: 11, memory_bytes: 128 << 20 })?;
    let space = Arc::new(Space::open(&tmp.join("space"), Durability::Checkpoint, Locking::Pessimistic)?);
    let state: Arc<dyn State> = space.clone();
    let published: Arc<dyn Published> = Arc::new(NoPublished);
    let mut txn = 0u64;
    let mut request = |input: &str| {
        txn += 1;
        let outcome = host.run(Request {
            export: "handle",
            input: input.as_bytes().to_vec(),
            txn,
            deadline: Instant::now() + Duration::from_secs(10),
            state: state.clone(),
            published: published.clone(),
        });
        if let Some(failure) = outcome.failure {
            panic!("{input}: {failure}");
        }
        outcome.output
    };
    assert_eq!(request("seed k"), b"0");
    assert_eq!(request("ro k"), b"1024");
    // A bad input answers its usage without touching the state: instance + WASI + call.
    time("run_no_state", runs, |_| {
        request("nop");
    });
    time("run_ro", runs, |_| {
        request("ro k");
    });
    time("run_seed", runs, |_| {
        request("seed k");
    });
    time("run_rmw", runs, |_| {
        request("rmw k");
    });
    time("run_linear", runs, |_| {
        request("linear k");
    });

    // One 1 KiB read, the state's own cost (the guest API adds a copy into the instance).
    let reads = runs * 10;
    let far = Instant::now() + Duration::from_secs(3600);
    time("space_read_weak", reads, |_| {
        assert_eq!(space.read(1, b"k", Mode::Weak, far).unwrap().map(|v| v.len()), Some(1024));
    });
    time("space_read_strong", reads, |i| {
        let t = 1_000_000 + i as u64;
        space.read(t, b"k", Mode::Strong, far).unwrap();
        space.finish(t);
    });

    // A secondary: the same read over the primary's RPC socket.
    let sock = tmp.join("primary.sock");
    skiff_session::serve(space.clone(), UnixListener::bind(&sock)?)?;
    let remote = Remote::connect(&sock)?;
    time("remote_read_weak", runs, |i| {
        // One txn per request, as a secondary's instances use it.
        let t = i as u64;
        assert_eq!(remote.read(t, b"k", Mode::Weak, far).unwrap().map(|v| v.len()), Some(1024));
        remote.finish(t);
    });

    // The same 1 KiB value in the benchmark's redis-server, one connection (TCP loopback).
    let client = redis::Client::open(format!("redis://127.0.0.1:{redis_port}"))?;
    let mut conn = client.get_connection()?;
    let value = vec![b'x'; 1024];
    redis::cmd("SET").arg("micro:k").arg(&value).exec(&mut conn)?;
    time("redis_get", runs, |_| {
        let v: Vec<u8> = redis::cmd("GET").arg("micro:k").query(&mut conn).unwrap();
        assert_eq!(v.len(), 1024);
    });
    time("redis_set", runs, |_| {
        redis::cmd("SET").arg("micro:k").arg(&value).exec(&mut conn).unwrap();
    });
    redis::cmd("DEL").arg("micro:k").exec(&mut conn)?;
    Ok(())
}

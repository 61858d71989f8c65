//! One invocation of a `binary` function: a sandbox per request (FRE's event-handler
//! case), the request body on stdin, the response on stdout.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use skiff_cgroups::{CgroupPool, Limits};
use skiff_sandbox::{ExitStatus, RemoteSpawner, Spec};

use crate::registry::Function;

/// What an invocation came to.
pub enum Outcome {
    Ok(Vec<u8>),
    /// The function exited non-zero or was killed: (message, stderr tail).
    Crashed(String),
    TimedOut,
    Overloaded(String),
    Failed(String),
}

/// Output a function may write before it is cut off.
const MAX_OUTPUT: usize = 6 << 20;

/// One request for a function.
pub struct Job {
    pub env_root: std::path::PathBuf,
    pub dev_template: std::path::PathBuf,
    pub function: Function,
    pub body: Vec<u8>,
    /// The request's method, path, query and headers, as environment variables.
    pub env: Vec<String>,
    /// `network: none`: the network namespace to join.
    pub netns: Option<OwnedFd>,
}

/// The request as a `binary` function sees it: environment variables beside the body
/// on stdin (the CGI convention FRE's event handlers follow).
pub fn request_env(request: &crate::engine::Request) -> Vec<String> {
    let mut env = vec![
        format!("SKIFF_METHOD={}", request.method),
        format!("SKIFF_PATH={}", request.path),
        format!("SKIFF_QUERY={}", request.query),
    ];
    for (name, value) in &request.headers {
        let key = name.to_ascii_uppercase().replace('-', "_");
        env.push(format!("SKIFF_HEADER_{key}={value}"));
    }
    env
}

/// What came of a job, how long its sandbox took to start, and what it wrote to stderr.
pub struct Ran {
    pub outcome: Outcome,
    pub start: Duration,
    pub stderr: Vec<u8>,
}

/// Runs `job`.
pub fn run(spawner: &RemoteSpawner, pool: &CgroupPool, job: Job) -> Ran {
    let f = &job.function;
    // A restarted daemon frees the claims its predecessor left by this prefix.
    let id = format!(
        "{}{}",
        skiff_pool::SERVE_OWNER_PREFIX,
        crate::invocations::new_id()
    );
    let limits = Limits {
        memory_bytes: f.memory_bytes,
        cpus: f.cpus,
        pids: f.pids,
    };
    let started = Instant::now();
    let (slot, entry) = match pool.acquire(&id, &limits) {
        Ok(claimed) => claimed,
        Err(e) => {
            return Ran {
                outcome: Outcome::Overloaded(format!("{e:#}")),
                start: started.elapsed(),
                stderr: Vec::new(),
            }
        }
    };
    let mut ran = run_in_slot(spawner, pool, &slot, &entry, &job, &id);
    drop(entry);
    if let Err(e) = pool.release(slot.index) {
        ran.outcome = Outcome::Failed(format!("cannot release the sandbox's cgroup: {e:#}"));
    }
    ran
}

fn run_in_slot(
    spawner: &RemoteSpawner,
    pool: &CgroupPool,
    slot: &skiff_cgroups::Slot,
    entry: &skiff_cgroups::Entry,
    job: &Job,
    id: &str,
) -> Ran {
    let f = &job.function;
    let started = Instant::now();
    let (stdin_r, stdin_w) = pipe();
    let (stdout_r, stdout_w) = pipe();
    let (stderr_r, stderr_w) = pipe();
    let handler = format!("/code/{}", f.handler.trim_start_matches("./"));
    let mut spec = Spec::new(
        id,
        job.env_root.clone(),
        job.dev_template.clone(),
        vec![handler],
    );
    spec.env
        .extend(f.vars.iter().map(|(k, v)| format!("{k}={v}")));
    spec.env.extend(job.env.iter().cloned());
    spec.netns = job.netns.as_ref().and_then(|fd| fd.try_clone().ok());
    spec.stdio = [
        stdin_r.as_raw_fd(),
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
    ];
    let child = match spawner.spawn(&spec, entry) {
        Ok(child) => child,
        Err(e) => {
            return Ran {
                outcome: Outcome::Failed(e.message),
                start: started.elapsed(),
                stderr: Vec::new(),
            }
        }
    };
    let start = started.elapsed();
    drop((stdin_r, stdout_w, stderr_w));
    // Feed stdin on its own thread: a function may write before it reads everything.
    let input = job.body.clone();
    let writer = std::thread::spawn(move || {
        let _ = std::fs::File::from(stdin_w).write_all(&input);
    });
    let deadline = Instant::now() + Duration::from_millis(f.timeout_ms);
    let (out, err, timed_out) = collect(stdout_r, stderr_r, deadline, &child);
    let status = child.wait();
    let _ = writer.join();
    let outcome = if timed_out {
        Outcome::TimedOut
    } else if pool.oom_killed(slot) {
        Outcome::Crashed(
            "the function ran out of memory (killed by the kernel's OOM killer)".into(),
        )
    } else {
        match status {
            Ok(ExitStatus::Exited(0)) => Outcome::Ok(out),
            Ok(status) => {
                let tail =
                    String::from_utf8_lossy(&err[err.len().saturating_sub(500)..]).into_owned();
                let how = match status {
                    ExitStatus::Exited(c) => format!("exited with {c}"),
                    ExitStatus::Signaled(s) => format!("was killed by signal {s}"),
                };
                Outcome::Crashed(format!("the function {how}: {}", tail.trim()))
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    };
    Ran {
        outcome,
        start,
        stderr: err,
    }
}

/// Reads stdout and stderr until both close or the deadline passes (then kills).
fn collect(
    stdout: OwnedFd,
    stderr: OwnedFd,
    deadline: Instant,
    child: &skiff_sandbox::Child,
) -> (Vec<u8>, Vec<u8>, bool) {
    let mut bufs = [Vec::new(), Vec::new()];
    let mut files = [
        Some(std::fs::File::from(stdout)),
        Some(std::fs::File::from(stderr)),
    ];
    let mut chunk = [0u8; 64 << 10];
    loop {
        let mut fds: Vec<libc::pollfd> = files
            .iter()
            .map(|f| libc::pollfd {
                fd: f.as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.iter().all(|p| p.fd < 0) {
            return (
                std::mem::take(&mut bufs[0]),
                std::mem::take(&mut bufs[1]),
                false,
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = child.kill(libc::SIGKILL);
            return (Vec::new(), Vec::new(), true);
        }
        // SAFETY: valid pollfds; negative fds are ignored by poll.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis().min(1000) as i32) };
        for (i, p) in fds.iter().enumerate() {
            if p.revents == 0 {
                continue;
            }
            let Some(file) = files[i].as_mut() else {
                continue;
            };
            match file.read(&mut chunk) {
                Ok(0) | Err(_) => files[i] = None,
                Ok(n) => {
                    if bufs[i].len() + n > MAX_OUTPUT {
                        let _ = child.kill(libc::SIGKILL);
                        files[i] = None;
                    } else {
                        bufs[i].extend_from_slice(&chunk[..n]);
                    }
                }
            }
        }
    }
}

pub(crate) fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array; the two descriptors are new and ours.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0, "pipe2");
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    }
}

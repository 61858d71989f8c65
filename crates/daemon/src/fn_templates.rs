//! Function templates: for a python3 function with packages, a template of its own that
//! has imported what its handler imports (numpy, pandas, ...), so a cold start is a fork,
//! not hundreds of milliseconds of imports (SOCK's import cache).
//!
//! Such a template runs code from the function's packages, so it is a sandbox of that
//! function like any instance (its root, limits, seccomp, no capabilities, uid 65534),
//! in a cgroup slot of its own with the function's limits, and it forks instances of
//! that function alone. Each fork is moved by the daemon into a slot of its own before
//! it runs anything of the function's. Forks share their template's namespaces (its
//! /tmp, pids and network namespace) with their siblings of the same function: a
//! template without privileges cannot make new ones. Killing the template (it is their
//! PID namespace's init) ends its forks too, so only templates with no live instances
//! are evicted; idle ones are, least recently used first, past a memory budget.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use skiff_cgroups::{Entry, Slot};
use skiff_sandbox::{Child, ExitStatus};

use crate::engine::Engine;
use crate::registry::{Function, Runtime};

/// Where a python environment's packages are: a function with none keeps the
/// interpreter's shared template.
const PYTHON_PACKAGES: &str = "usr/lib/python3/dist-packages";

/// A running function template.
pub struct FunctionTemplate {
    pub id: String,
    pub function: String,
    /// The environment it was started for: a redeploy makes a new one.
    env: String,
    pub child: Child,
    pub slot: Slot,
    pub netns_slot: Option<usize>,
    pub started: SystemTime,
    /// How long its start (imports included) took.
    pub init: Duration,
    /// Requests and answers, one at a time.
    control: Mutex<StdUnixStream>,
    last_used: Mutex<Instant>,
    /// Instances forked from it that are alive.
    instances: AtomicUsize,
}

/// An instance's hold on the template it was forked from (and its pid there): while
/// any is held, the template is not evicted.
pub struct TemplateUse {
    template: Arc<FunctionTemplate>,
    pid: i64,
}

impl TemplateUse {
    fn new(template: &Arc<FunctionTemplate>, pid: i64) -> TemplateUse {
        template.instances.fetch_add(1, Ordering::Relaxed);
        TemplateUse {
            template: template.clone(),
            pid,
        }
    }

    /// How the fork ended, as its template (which reaps it) saw it.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let (answer, _) = self
            .template
            .ask(format!("exit {}", self.pid).as_bytes(), &[])
            .ok()?;
        let number = |key: &str| answer[key].as_i64().map(|n| n as i32);
        number("code")
            .map(ExitStatus::Exited)
            .or_else(|| number("signal").map(ExitStatus::Signaled))
    }
}

impl Clone for TemplateUse {
    fn clone(&self) -> TemplateUse {
        TemplateUse::new(&self.template, self.pid)
    }
}

impl Drop for TemplateUse {
    fn drop(&mut self) {
        self.template.instances.fetch_sub(1, Ordering::Relaxed);
    }
}

impl FunctionTemplate {
    /// Forks an instance: its channel and log pipe go to the child, which waits for a
    /// byte on its channel; it is moved into `entry`'s cgroup, then told to go.
    pub fn fork(
        self: &Arc<Self>,
        theirs: &StdUnixStream,
        log: &OwnedFd,
        ours: &StdUnixStream,
        entry: &Entry,
    ) -> Result<(Child, TemplateUse)> {
        *self.last_used.lock().unwrap() = Instant::now();
        let (answer, mut fds) = self.ask(b"fork", &[theirs.as_raw_fd(), log.as_raw_fd()])?;
        let (Some(pid), Some(pidfd)) = (answer["pid"].as_i64(), fds.pop()) else {
            bail!(
                "the function's template could not fork: {}",
                answer["error"]
            );
        };
        let child = Child {
            pid: pidfd_pid(&pidfd)?,
            pidfd,
        };
        // The answer is the template's, so the function's: it must name its own fork, not
        // itself or another process, before that process is moved and signalled as one.
        if parent_of(child.pid) != Some(self.child.pid) {
            bail!("the function's template answered with a process that is not its fork");
        }
        let admitted = entry.admit(child.pid).and_then(|()| {
            (&*ours)
                .write_all(b"g")
                .context("the fork is gone before it started")
        });
        if let Err(e) = admitted {
            let _ = child.kill(libc::SIGKILL);
            return Err(e);
        }
        Ok((child, TemplateUse::new(self, pid)))
    }

    fn key(&self) -> Key {
        (self.function.clone(), self.env.clone())
    }

    /// One request and its answer (JSON, with the descriptors that came with it), one
    /// exchange at a time.
    fn ask(
        &self,
        request: &[u8],
        fds: &[std::os::fd::RawFd],
    ) -> Result<(serde_json::Value, Vec<OwnedFd>)> {
        let control = self.control.lock().unwrap();
        skiff_sandbox::send_with_fds(control.as_raw_fd(), request, fds)
            .map_err(|e| anyhow::anyhow!("the function's template is gone: {e}"))?;
        let mut buf = [0u8; 256];
        let (n, fds) = skiff_sandbox::recv_with_fds(control.as_raw_fd(), &mut buf)
            .context("the function's template did not answer")?;
        Ok((serde_json::from_slice(&buf[..n]).unwrap_or_default(), fds))
    }

    /// Bytes charged to its cgroup.
    pub fn memory_bytes(&self, engine: &Engine) -> u64 {
        engine.cgroups.memory_usage(self.slot.index).unwrap_or(0)
    }

    /// Since it last forked.
    pub fn idle(&self) -> Duration {
        self.last_used.lock().unwrap().elapsed()
    }

    pub fn stop(&self) {
        let _ = self.child.kill(libc::SIGKILL);
    }
}

/// Whether a process has ended (its pidfd is readable).
fn exited(child: &Child) -> bool {
    let mut poll = libc::pollfd {
        fd: child.pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one descriptor we own, without waiting.
    unsafe { libc::poll(&mut poll, 1, 0) != 0 }
}

/// The parent of `pid`, from /proc/PID/stat.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses: state, then ppid.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The pid (in our namespace) of the process a pidfd refers to.
fn pidfd_pid(pidfd: &OwnedFd) -> Result<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|p| p.trim().parse().ok())
        .filter(|&p| p > 0)
        .context("the fork is gone before it started")
}

/// A function's name and environment: a redeploy's new version gets its own template
/// while the old one's instances finish.
type Key = (String, String);

/// Per function version, its template; environments whose template failed; and a lock
/// per function, so concurrent cold starts start one template.
#[derive(Default)]
pub struct FunctionTemplates {
    running: Mutex<HashMap<Key, Arc<FunctionTemplate>>>,
    /// Environments whose template failed to start: their functions start as before.
    failed: Mutex<std::collections::HashSet<String>>,
    /// Per environment, whether it has python packages.
    packaged: Mutex<HashMap<String, bool>>,
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The tasks that free a template's slots when it ends.
    watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bytes idle templates may hold together.
    pub budget: u64,
}

impl FunctionTemplates {
    pub fn new(budget: u64) -> FunctionTemplates {
        FunctionTemplates {
            budget,
            ..FunctionTemplates::default()
        }
    }

    /// Whether `f` gets a template of its own: python3 with packages. Read once per
    /// environment (they never change), not on every cold start.
    pub fn wanted(&self, engine: &Engine, f: &Function) -> bool {
        if !engine.use_templates || f.runtime != Runtime::Python3 {
            return false;
        }
        *self
            .packaged
            .lock()
            .unwrap()
            .entry(f.env.clone())
            .or_insert_with(|| {
                std::fs::read_dir(engine.env_root(&f.env).join(PYTHON_PACKAGES))
                    .is_ok_and(|mut d| d.next().is_some())
            })
    }

    /// `f`'s template, started if it has none; `None` when its start failed (once per
    /// environment: it is not retried until the function is redeployed).
    pub async fn get(&self, engine: &Arc<Engine>, f: &Function) -> Option<Arc<FunctionTemplate>> {
        let lock = self
            .starting
            .lock()
            .unwrap()
            .entry(f.name.clone())
            .or_default()
            .clone();
        let _starting = lock.lock().await;
        if let Some(t) = self.current(f) {
            return Some(t);
        }
        if self.failed.lock().unwrap().contains(&f.env) {
            return None;
        }
        match crate::instance::start_function_template(engine, f).await {
            Ok(t) => {
                let t = Arc::new(t);
                let old = self.running.lock().unwrap().insert(t.key(), t.clone());
                if let Some(old) = old {
                    old.stop();
                }
                self.watch(engine, &t);
                self.evict(engine, &t);
                Some(t)
            }
            Err(e) => {
                eprintln!(
                    "skiff: warning: {} gets no template of its own; its instances start \
                     as before: {e:#}",
                    f.name
                );
                self.give_up(f);
                None
            }
        }
    }

    /// The running template of `f`'s current environment.
    fn current(&self, f: &Function) -> Option<Arc<FunctionTemplate>> {
        let running = self.running.lock().unwrap();
        let t = running.get(&(f.name.clone(), f.env.clone()))?;
        (!exited(&t.child)).then(|| t.clone())
    }

    /// Frees its slots when the template ends, and forgets it.
    fn watch(&self, engine: &Arc<Engine>, t: &Arc<FunctionTemplate>) {
        let (engine, t) = (engine.clone(), t.clone());
        let mut watchers = self.watchers.lock().unwrap();
        watchers.retain(|w| !w.is_finished());
        watchers.push(tokio::spawn(async move {
            crate::instance::wait_exit(&t.child).await;
            {
                let mut running = engine.fn_templates.running.lock().unwrap();
                if running.get(&t.key()).is_some_and(|r| Arc::ptr_eq(r, &t)) {
                    running.remove(&t.key());
                }
            }
            crate::instance::release_slots(&engine, t.slot.index, t.netns_slot).await;
        }));
    }

    /// Stops idle templates, least recently used first, while all together hold more
    /// than the budget (`keep` stays).
    fn evict(&self, engine: &Engine, keep: &Arc<FunctionTemplate>) {
        let mut all: Vec<_> = self.running.lock().unwrap().values().cloned().collect();
        let mut total: u64 = all.iter().map(|t| t.memory_bytes(engine)).sum();
        all.sort_by_key(|t| *t.last_used.lock().unwrap());
        for t in all {
            if total <= self.budget {
                break;
            }
            if Arc::ptr_eq(&t, keep) || t.instances.load(Ordering::Relaxed) > 0 {
                continue;
            }
            total = total.saturating_sub(t.memory_bytes(engine));
            if let Some(t) = self.running.lock().unwrap().remove(&t.key()) {
                t.stop();
            }
        }
    }

    /// Stops the templates of `function` (removed).
    pub fn forget(&self, function: &str) {
        self.stop_where(|(name, _)| name == function);
    }

    /// Stops the templates of `function`'s versions other than `env` (redeployed).
    pub fn forget_unless(&self, function: &str, env: &str) {
        self.stop_where(|(name, e)| name == function && e != env);
    }

    /// Stops `f`'s template for good: its version starts without one from now on.
    pub fn give_up(&self, f: &Function) {
        self.failed.lock().unwrap().insert(f.env.clone());
        self.forget_version(&f.name, &f.env);
    }

    /// Stops the template of one version of `function` (a deploy refused).
    pub fn forget_version(&self, function: &str, env: &str) {
        self.stop_where(|(name, e)| name == function && e == env);
    }

    fn stop_where(&self, which: impl Fn(&Key) -> bool) {
        self.running.lock().unwrap().retain(|key, t| {
            if which(key) {
                t.stop();
            }
            !which(key)
        });
    }

    pub fn all(&self) -> Vec<Arc<FunctionTemplate>> {
        self.running.lock().unwrap().values().cloned().collect()
    }

    /// `/metrics` lines: each template's memory, and the budget of idle ones.
    pub fn metrics(&self, engine: &Engine) -> String {
        let mut out = String::from(
            "# HELP skiff_function_template_memory_bytes Memory charged to a function's \
             template (python3 functions with packages).\n\
             # TYPE skiff_function_template_memory_bytes gauge\n",
        );
        for t in self.all() {
            out.push_str(&format!(
                "skiff_function_template_memory_bytes{{function=\"{}\"}} {}\n",
                t.function,
                t.memory_bytes(engine)
            ));
        }
        out.push_str(&format!(
            "# HELP skiff_function_template_budget_bytes Memory idle function templates \
             may hold together.\n\
             # TYPE skiff_function_template_budget_bytes gauge\n\
             skiff_function_template_budget_bytes {}\n",
            self.budget
        ));
        out
    }

    /// Stops every template and waits until their slots are free (daemon shutdown).
    pub async fn clear(&self) {
        for t in self.running.lock().unwrap().drain().map(|(_, t)| t) {
            t.stop();
        }
        let watchers = std::mem::take(&mut *self.watchers.lock().unwrap());
        for w in watchers {
            let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
        }
    }
}

impl FunctionTemplate {
    pub fn new(
        id: String,
        f: &Function,
        child: Child,
        slot: Slot,
        netns_slot: Option<usize>,
        control: StdUnixStream,
        init: Duration,
    ) -> FunctionTemplate {
        FunctionTemplate {
            id,
            function: f.name.clone(),
            env: f.env.clone(),
            child,
            slot,
            netns_slot,
            started: SystemTime::now(),
            init,
            control: Mutex::new(control),
            last_used: Mutex::new(Instant::now()),
            instances: AtomicUsize::new(0),
        }
    }
}

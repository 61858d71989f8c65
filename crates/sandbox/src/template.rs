//! The sandbox set-up as data, for a template process (a zygote) that forks sandboxes
//! instead of exec'ing a program: the forked child hands these values to the sandbox
//! entry the native spawner's child calls too (`entry.c`; python's template loads it as
//! a shared object, node's addon compiles it in); those steps that need no plan it takes
//! ahead, while it waits (`Preparation`). Keeping the values here keeps one source for
//! what a sandbox is; the zygote only supplies the mechanism.

use std::os::fd::{AsRawFd, RawFd};

use serde::Serialize;
use skiff_cgroups::Entry;

use crate::child::{
    MASKED_DIRS, MASKED_FILES, MASK_OPTIONS, READONLY, SECBITS, SHM_OPTIONS, TMP_OPTIONS,
};
use crate::seccomp::Filter;
use crate::spec::Spec;

#[derive(Serialize)]
pub struct Plan<'a> {
    pub hostname: String,
    pub rootfs: String,
    pub dev_template: String,
    pub cwd: String,
    pub env: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub max_open_files: u64,
    pub shm_options: &'static str,
    pub tmp_options: &'static str,
    pub secure_bits: u64,
    /// The seccomp program's bytes, hex.
    pub seccomp: &'a str,
    /// The descriptors sent with the plan, in order: stdin, stdout, stderr, then the
    /// cgroup v2 directory to move into if `clone_into`, `joins` v1 `tasks` files, and a
    /// network namespace if `netns`.
    pub clone_into: bool,
    pub joins: usize,
    pub netns: bool,
}

/// What a spare does before its plan comes, the same for every start: makes its mount
/// tree private, mounts a fresh /proc (its own PID namespace's) at `/proc` with runc's
/// masks, to be moved under the root once the plan names it, and empties its bounding
/// capability set (its effective capabilities, which the plan's steps need, stay until
/// the plan drops them). Sent to the template once, as `prepare` and this as JSON.
#[derive(Serialize)]
struct Preparation {
    masked_files: &'static [&'static str],
    masked_dirs: &'static [&'static str],
    readonly: &'static [&'static str],
    mask_options: &'static str,
    last_cap: u32,
}

fn preparation() -> Preparation {
    Preparation {
        masked_files: &MASKED_FILES,
        masked_dirs: &MASKED_DIRS,
        readonly: &READONLY,
        mask_options: MASK_OPTIONS,
        last_cap: crate::spawn::last_cap(),
    }
}

/// The plan for `spec` in the cgroup `entry` with the seccomp program `seccomp` (hex),
/// and the descriptors that go with it. User namespaces, `/work` and extra tmpfs paths
/// are not offered on this path.
pub fn plan<'a>(spec: &Spec, entry: &Entry, seccomp: &'a str) -> (Plan<'a>, Vec<RawFd>) {
    let mut fds: Vec<RawFd> = spec.stdio.to_vec();
    // A forked-ahead child moves itself into its cgroup. A v2 move (`cgroup.procs`) makes
    // the kernel wait for an RCU grace period (5-15 ms after an idle spell); v1 moves
    // through `tasks` do not. On a hybrid host v1 carries the limits and the tracking, so
    // the child skips the controller-less v2 tree there.
    let clone_into = entry.clone_into.as_ref().filter(|_| entry.join.is_empty());
    fds.extend(clone_into.map(|f| f.as_raw_fd()));
    fds.extend(entry.join.iter().map(|f| f.as_raw_fd()));
    fds.extend(spec.netns.as_ref().map(|f| f.as_raw_fd()));
    let plan = Plan {
        hostname: spec.id.clone(),
        rootfs: spec.rootfs.to_string_lossy().into_owned(),
        dev_template: spec.dev_template.to_string_lossy().into_owned(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
        uid: spec.uid,
        gid: spec.gid,
        max_open_files: spec.max_open_files,
        shm_options: SHM_OPTIONS,
        tmp_options: TMP_OPTIONS,
        secure_bits: SECBITS,
        seccomp,
        clone_into: clone_into.is_some(),
        joins: entry.join.len(),
        netns: spec.netns.is_some(),
    };
    (plan, fds)
}

/// The filesystem a template runs in: what a sandbox of its runtime sees, so nothing it
/// loads before forking (a module's `__file__`, `sys.path`, a cached path) names a host
/// path. Its own mount namespace, chrooted into `root` (a runtime layer's tree: the same
/// paths as every sandbox of that runtime), with a /proc, the device template `dev` at
/// /dev, a tmpfs /tmp, and each `(host file, name)` of `files` at `/tmp/NAME`. It stays in
/// the host's mount tree (a chroot, not a pivot): its spares climb out of the chroot
/// (`/tmp` is the way out) to reach the function's root, then pivot into it.
pub struct View<'a> {
    pub root: &'a std::path::Path,
    pub dev: &'a std::path::Path,
    pub files: Vec<(std::path::PathBuf, String)>,
}

/// A [`View`]'s steps, made before the fork: they run between fork and exec, where
/// nothing may allocate.
struct ViewSteps {
    root: std::ffi::CString,
    proc: std::ffi::CString,
    dev_from: std::ffi::CString,
    dev: std::ffi::CString,
    tmp: std::ffi::CString,
    files: Vec<(std::ffi::CString, std::ffi::CString)>,
}

impl View<'_> {
    fn steps(&self) -> anyhow::Result<ViewSteps> {
        use crate::spawn::cstring;
        use std::os::unix::ffi::OsStrExt;
        let inside = |rel: &str| cstring(self.root.join(rel).as_os_str().as_bytes());
        Ok(ViewSteps {
            root: cstring(self.root.as_os_str().as_bytes())?,
            proc: inside("proc")?,
            dev_from: cstring(self.dev.as_os_str().as_bytes())?,
            dev: inside("dev")?,
            tmp: inside("tmp")?,
            files: self
                .files
                .iter()
                .map(|(from, name)| {
                    Ok((
                        cstring(from.as_os_str().as_bytes())?,
                        inside(&format!("tmp/{name}"))?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?,
        })
    }
}

impl ViewSteps {
    /// Enters the view (in the child, before exec).
    fn run(&self) -> std::io::Result<()> {
        use std::ffi::CStr;
        fn ok(result: libc::c_int) -> std::io::Result<()> {
            if result < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        fn mount(
            src: Option<&CStr>,
            dst: &CStr,
            fstype: Option<&CStr>,
            flags: libc::c_ulong,
            data: Option<&CStr>,
        ) -> std::io::Result<()> {
            let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
            // SAFETY: NUL-terminated strings or null, as mount(2) takes them.
            ok(
                unsafe {
                    libc::mount(ptr(src), dst.as_ptr(), ptr(fstype), flags, ptr(data).cast())
                },
            )
        }
        let nsdx = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        // SAFETY: unshare takes no pointers.
        ok(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
        mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
        mount(Some(c"proc"), &self.proc, Some(c"proc"), nsdx, None)?;
        mount(
            Some(&self.dev_from),
            &self.dev,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        // Executable: node preloads its addon from here.
        let tmp_flags = libc::MS_NOSUID | libc::MS_NODEV;
        let tmp_options = c"mode=1777,size=64m";
        mount(
            Some(c"tmpfs"),
            &self.tmp,
            Some(c"tmpfs"),
            tmp_flags,
            Some(tmp_options),
        )?;
        for (from, to) in &self.files {
            // SAFETY: a NUL-terminated path; the descriptor is closed at once.
            let fd = unsafe {
                libc::open(
                    to.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                )
            };
            ok(fd)?;
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd) };
            mount(Some(from), to, None, libc::MS_BIND, None)?;
        }
        // SAFETY: NUL-terminated paths.
        ok(unsafe { libc::chroot(self.root.as_ptr()) })?;
        ok(unsafe { libc::chdir(c"/".as_ptr()) })
    }
}

/// A running template process (a zygote) that forks spare children ahead of need.
/// Over a SEQPACKET control socket on its stdin it gets requests for spares, `next`
/// (when it suits: it first leaves a start just begun the CPU for a few ms) or `now`,
/// and answers each with `{"pid": N}` and the spare's pidfd and plan socket, or with
/// `{"error": ...}`. A start sends its plan (JSON, descriptors beside it) straight to a
/// spare, which builds the sandbox from it and becomes the instance: the template is
/// off the start's path. Spares are clone3'd with CLONE_PARENT: they are the caller's,
/// as with a [`crate::RemoteSpawner`].
pub struct Template {
    control: std::sync::Mutex<Control>,
    process: std::sync::Mutex<std::process::Child>,
    /// The seccomp program every plan carries, hex: made once, not per start.
    seccomp: String,
    /// Whether an instance has taught it what its spares should populate.
    taught: std::sync::atomic::AtomicBool,
}

/// At most this many written pages in a lesson (each costs every spare a page).
const LESSON_PAGES: u64 = 1024;
/// At most this many ranges in a lesson: 24 bytes each, one control message.
const LESSON_RANGES: usize = 4096;

/// `learn`, then `(start, length, advice)` as little-endian u64s: the lesson of
/// `instance`, for its template.
fn lesson_message(instance: &crate::Child) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let ranges = crate::lesson::learn(instance.pid, LESSON_PAGES)
        .context("cannot read the instance's page map")?;
    // Still ours: the pid was not reaped (and perhaps reused) while we read.
    instance.kill(0).context("the instance is gone")?;
    let mut message = b"learn".to_vec();
    message.extend(
        ranges
            .iter()
            .take(LESSON_RANGES)
            .flatten()
            .flat_map(|v| v.to_le_bytes()),
    );
    Ok(message)
}

/// The template's control socket and the spares it has handed over.
struct Control {
    socket: std::os::fd::OwnedFd,
    spares: std::collections::VecDeque<Spare>,
    /// Requests for spares not yet answered.
    asked: usize,
}

/// Whether `fd` has something to read within `wait_ms`.
fn readable(fd: RawFd, wait_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor the caller owns.
    unsafe { libc::poll(&mut pfd, 1, wait_ms) > 0 }
}

/// A child forked ahead, waiting for its plan; killed and reaped if never used.
struct Spare {
    child: Option<crate::Child>,
    plan: std::os::fd::OwnedFd,
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = child.kill(libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Control {
    /// Sends the template one message that asks for no answer.
    fn tell(&self, message: &[u8]) -> anyhow::Result<()> {
        crate::server::send_with_fds(self.socket.as_raw_fd(), message, &[])
            .map_err(|e| anyhow::anyhow!("the template is gone: {e}"))
    }

    fn ask(&mut self, when: &[u8]) -> anyhow::Result<()> {
        self.tell(when)?;
        self.asked += 1;
        Ok(())
    }

    /// Takes one answer if it comes within `wait_ms`.
    fn receive(&mut self, wait_ms: i32) -> anyhow::Result<Option<Spare>> {
        use anyhow::{bail, Context};
        if !readable(self.socket.as_raw_fd(), wait_ms) {
            return Ok(None);
        }
        let mut buf = [0u8; 4096];
        let (n, mut fds) = crate::server::recv_with_fds(self.socket.as_raw_fd(), &mut buf)
            .context("the template did not answer")?;
        if n == 0 {
            bail!("the template exited");
        }
        self.asked -= 1;
        let reply: serde_json::Value = serde_json::from_slice(&buf[..n])?;
        if let Some(error) = reply["error"].as_str() {
            bail!("the template could not fork: {error}");
        }
        let pid = reply["pid"]
            .as_i64()
            .context("the template's answer has no pid")? as i32;
        let (Some(plan), Some(pidfd)) = (fds.pop(), fds.pop()) else {
            bail!("the template's answer lacks the spare's descriptors");
        };
        Ok(Some(Spare {
            child: Some(crate::Child { pid, pidfd }),
            plan,
        }))
    }

    /// A spare: one already handed over, else one asked for now (up to 10 s).
    fn take(&mut self) -> anyhow::Result<Spare> {
        while self.asked > 0 {
            match self.receive(0)? {
                Some(spare) => self.spares.push_back(spare),
                None => break,
            }
        }
        if let Some(spare) = self.spares.pop_front() {
            return Ok(spare);
        }
        // A `next` still pending ends its pause on this `now`; its spare waits here
        // for the start after.
        self.ask(b"now")?;
        self.receive(10_000)?
            .ok_or_else(|| anyhow::anyhow!("the template did not answer within 10 s"))
    }
}

impl Template {
    /// Starts `argv` with the environment `env` (nothing else of ours) as a template and
    /// waits (up to 10 s) for its `ready`, then asks it for a first spare. The template
    /// runs in `view` (see [`View`]), so `argv[0]` is a path inside its root. It gets a
    /// parent-death SIGKILL tied to the *calling thread*: call this from a thread that
    /// lives as long as the template should.
    pub fn start(
        view: &View,
        argv: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Template> {
        use anyhow::Context;
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = crate::spawn::seqpacket_pair().context("socketpair")?;
        let mut command = std::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(std::process::Stdio::from(theirs));
        let enter_view = view.steps()?;
        // SAFETY: only system calls between fork and exec, on strings made before it.
        unsafe {
            command.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                enter_view.run()
            });
        }
        let process = command.spawn().with_context(|| {
            format!(
                "cannot start the template {} in {}",
                argv[0],
                view.root.display()
            )
        })?;
        // Our copy of the template's end goes now: a template that dies before its
        // `ready` shows as the end of the socket, not as a 10 s wait.
        drop(command);
        let mut buf = [0u8; 16];
        let n = if readable(ours.as_raw_fd(), 10_000) {
            // SAFETY: reading into a local buffer from our own socket.
            unsafe { libc::recv(ours.as_raw_fd(), buf.as_mut_ptr().cast(), 16, 0) }
        } else {
            -1
        };
        let mut control = Control {
            socket: ours,
            spares: std::collections::VecDeque::new(),
            asked: 0,
        };
        if n <= 0 || &buf[..n as usize] != b"ready" {
            anyhow::bail!("the template {} did not start", argv[0]);
        }
        let mut prepare = b"prepare".to_vec();
        prepare.extend(serde_json::to_vec(&preparation())?);
        control.tell(&prepare)?;
        control.ask(b"next")?;
        Ok(Template {
            control: std::sync::Mutex::new(control),
            process: std::sync::Mutex::new(process),
            seccomp: Filter::docker_default()
                .to_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            taught: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether no instance has taught the template yet (see [`Template::learn_from`]).
    pub fn wants_lesson(&self) -> bool {
        !self.taught.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Once per template: learns from `instance`, forked from it and past its first
    /// reply, which pages a start touches (`crate::lesson`), and has every spare from
    /// now on populate them while it waits. On failure the next instance may teach it.
    pub fn learn_from(&self, instance: &crate::Child) -> anyhow::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.taught.swap(true, Relaxed) {
            return Ok(());
        }
        let taught = lesson_message(instance).and_then(|m| self.control.lock().unwrap().tell(&m));
        if taught.is_err() {
            self.taught.store(false, Relaxed);
        }
        taught
    }

    /// Starts a sandbox for `spec` in the cgroup `entry` from a spare; `extra` goes
    /// into the plan for the template's own use (what to run in the child).
    pub fn fork(
        &self,
        spec: &Spec,
        entry: &Entry,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<crate::Child> {
        use anyhow::Context;
        let (plan, fds) = plan(spec, entry, &self.seccomp);
        let mut value = serde_json::to_value(plan)?;
        value
            .as_object_mut()
            .expect("a plan is an object")
            .extend(extra);
        let message = serde_json::to_vec(&value)?;
        let mut control = self.control.lock().unwrap();
        let mut spare = control.take()?;
        // The next spare, made while this start runs.
        if control.spares.is_empty() && control.asked == 0 {
            control.ask(b"next")?;
        }
        drop(control);
        crate::server::send_with_fds(spare.plan.as_raw_fd(), &message, &fds)
            .context("the spare is gone")?;
        Ok(spare.child.take().expect("an unused spare has its child"))
    }

    /// Whether the template process still runs.
    pub fn is_alive(&self) -> bool {
        matches!(self.process.lock().unwrap().try_wait(), Ok(None))
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        let mut process = self.process.lock().unwrap();
        let _ = process.kill();
        let _ = process.wait();
    }
}

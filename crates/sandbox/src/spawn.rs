use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use anyhow::{Context, Result};
use skiff_cgroups::Entry;

use crate::child::{self, Failure, Prepared};
use crate::seccomp::Filter;
use crate::spec::Spec;

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` (Linux 5.7, CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Creates sandboxes. Forking is only safe in a single-threaded process, so a spawner
/// can only be made in one: the `skiff run` CLI, or a spawner process forked before an
/// async runtime starts.
pub struct Spawner {
    filter: Filter,
    last_cap: u32,
    /// Clone sandboxes as siblings (CLONE_PARENT): our parent adopts them.
    adopt: bool,
}

/// A running sandbox's first process.
#[derive(Debug)]
pub struct Child {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    /// The shell's convention: the exit code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Exited(c) => c,
            ExitStatus::Signaled(s) => 128 + s,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnErrorKind {
    /// The command was not found in the sandbox (shells exit 127).
    NotFound,
    /// The command exists but cannot be executed (shells exit 126).
    NotExecutable,
    /// The sandbox could not be set up.
    Setup,
}

#[derive(Debug)]
pub struct SpawnError {
    pub kind: SpawnErrorKind,
    pub message: String,
    /// A failed child the caller must reap (spawns with [`Spawner::for_parent`]).
    pub orphan: Option<Child>,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpawnError {}

fn setup_error(message: impl Into<String>) -> SpawnError {
    SpawnError {
        kind: SpawnErrorKind::Setup,
        message: message.into(),
        orphan: None,
    }
}

impl Spawner {
    pub fn new() -> Result<Spawner> {
        let threads = std::fs::metadata("/proc/self/task")
            .map(|m| std::os::unix::fs::MetadataExt::nlink(&m).saturating_sub(2))
            .unwrap_or(1);
        anyhow::ensure!(
            threads <= 1,
            "a sandbox spawner must run in a single-threaded process ({threads} threads)"
        );
        Ok(Spawner {
            filter: Filter::docker_default(),
            last_cap: last_cap(),
            adopt: false,
        })
    }

    /// A spawner whose sandboxes are children of this process's parent (CLONE_PARENT),
    /// for a spawner process serving a multi-threaded parent: the parent holds their
    /// pidfds, reaps them and gets their exit status.
    pub fn for_parent() -> Result<Spawner> {
        Ok(Spawner {
            adopt: true,
            ..Spawner::new()?
        })
    }

    /// Starts `spec` in a new sandbox in the cgroup `entry`, and returns once the command
    /// has been exec'd (or failed to be).
    pub fn spawn(&self, spec: &Spec, entry: &Entry) -> Result<Child, SpawnError> {
        check_rootfs(spec)?;
        let (parent_end, child_end) = seqpacket_pair().map_err(|e| setup_error(e.to_string()))?;
        let prepared = Prepared::new(
            spec,
            entry,
            &self.filter,
            self.last_cap,
            child_end.as_raw_fd(),
        )
        .map_err(|e| setup_error(format!("{e:#}")))?;

        let mut flags =
            (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)
                as u64
                | CLONE_PIDFD;
        let mut pidfd: RawFd = -1;
        let mut args = CloneArgs {
            pidfd: &mut pidfd as *mut RawFd as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..CloneArgs::default()
        };
        if let Some(cgroup) = &entry.clone_into {
            flags |= CLONE_INTO_CGROUP;
            args.cgroup = cgroup.as_raw_fd() as u64;
        }
        if self.adopt {
            // With CLONE_PARENT the child signals its (new) parent as we would: the
            // kernel takes our exit signal and wants none given.
            flags |= libc::CLONE_PARENT as u64;
            args.exit_signal = 0;
        }
        args.flags = flags;
        let trampoline = Trampoline {
            prepared: &prepared,
            sock: child_end.as_raw_fd(),
            parent_end: parent_end.as_raw_fd(),
        };
        let pid = if spec.user_ns.is_some() {
            // The child waits for the parent to write its id maps, so the parent must
            // keep running: a plain fork-like clone.
            // SAFETY: clone3 without CLONE_VM forks; this process is single-threaded
            // (checked in `new`), so the child may run ordinary code until it execs.
            let pid = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &mut args as *mut CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                )
            };
            if pid == 0 {
                child_entry(&trampoline as *const Trampoline as *mut libc::c_void);
            }
            pid
        } else {
            // SAFETY: see `clone_vm`; the trampoline outlives the child's use of it,
            // since CLONE_VFORK suspends us until the child execs or exits.
            unsafe { clone_vm(&mut args, &trampoline) }
        };
        if pid < 0 {
            let err = std::io::Error::last_os_error();
            return Err(setup_error(format!("clone3 failed: {err}")));
        }
        drop(child_end);
        // SAFETY: the kernel stored a new pidfd that nothing else owns.
        let child = Child {
            pid: pid as i32,
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        };
        match self.supervise_setup(spec, &child, &parent_end, &prepared) {
            Ok(()) => Ok(child),
            Err(mut e) => {
                let _ = child.kill(libc::SIGKILL);
                if self.adopt {
                    // Not ours to reap: hand it to the parent with the error.
                    e.orphan = Some(child);
                } else {
                    let _ = child.wait();
                }
                Err(e)
            }
        }
    }

    /// Serves the child's requests (user-namespace maps) until it execs (EOF) or
    /// reports a failure.
    fn supervise_setup(
        &self,
        spec: &Spec,
        child: &Child,
        sock: &OwnedFd,
        prepared: &Prepared,
    ) -> Result<(), SpawnError> {
        loop {
            let mut msg = [0u8; child::MESSAGE_LEN];
            // SAFETY: reading into a local buffer from a socket we own.
            let n = unsafe { libc::read(sock.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
            match n {
                0 => return Ok(()),
                n if n < 0 => {
                    let err = std::io::Error::last_os_error();
                    if err.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(setup_error(format!(
                        "lost the sandbox's setup channel: {err}"
                    )));
                }
                _ => {}
            }
            match child::Message::decode(&msg) {
                child::Message::NeedIdMaps => {
                    let map = spec
                        .user_ns
                        .expect("child asks for maps only with a user ns");
                    write_id_maps(child.pid, map.host, map.count).map_err(|e| {
                        setup_error(format!("cannot map user namespace ids: {e:#}"))
                    })?;
                    // SAFETY: one byte from a local buffer.
                    unsafe { libc::write(sock.as_raw_fd(), b"G".as_ptr().cast(), 1) };
                }
                child::Message::Failed(failed) => {
                    let _ = child.wait();
                    return Err(describe_failure(spec, prepared, &failed));
                }
            }
        }
    }
}

/// What the child needs, reachable from its own stack.
struct Trampoline<'a> {
    prepared: &'a Prepared,
    sock: RawFd,
    parent_end: RawFd,
}

extern "C" fn child_entry(arg: *mut libc::c_void) -> ! {
    // SAFETY: `arg` is the parent's Trampoline, alive while the child runs (the parent
    // is suspended by CLONE_VFORK, or this is a forked copy of its memory).
    let t = unsafe { &*(arg as *const Trampoline) };
    // SAFETY: closing this process's copy of the parent's end of the socket.
    unsafe { libc::close(t.parent_end) };
    child::run(t.prepared, t.sock)
}

/// The child's stack for `clone_vm`. One suffices: a spawner is single-threaded and
/// CLONE_VFORK keeps it suspended until the child has exec'd.
const CHILD_STACK_SIZE: usize = 64 << 10;
#[repr(C, align(16))]
struct ChildStack([u8; CHILD_STACK_SIZE]);
static mut CHILD_STACK: ChildStack = ChildStack([0; CHILD_STACK_SIZE]);

/// `clone3` with CLONE_VM | CLONE_VFORK, as posix_spawn does: the child borrows our
/// memory instead of copying the page tables (and tearing the copy down at exec), which
/// took ~0.13 ms of every start here. The child runs `child_entry` on its own stack.
///
/// # Safety
/// The calling process must be single-threaded, and the child must not allocate or
/// touch shared state beyond `trampoline` (it only makes syscalls and execs).
unsafe fn clone_vm(args: &mut CloneArgs, trampoline: &Trampoline) -> i64 {
    const CLONE_VM_VFORK: u64 = (libc::CLONE_VM | libc::CLONE_VFORK) as u64;
    args.flags |= CLONE_VM_VFORK;
    args.stack = std::ptr::addr_of_mut!(CHILD_STACK) as u64;
    args.stack_size = CHILD_STACK_SIZE as u64;
    let ret: i64;
    // In the child, clone3 returns 0 on the new stack: call child_entry(trampoline)
    // from there; it never returns. r12 and r13 survive the syscall.
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "mov rdi, r12",
        "call r13",
        "ud2",
        "2:",
        inlateout("rax") libc::SYS_clone3 => ret,
        in("rdi") args as *mut CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") trampoline as *const Trampoline as *mut libc::c_void,
        in("r13") child_entry as extern "C" fn(*mut libc::c_void) -> !,
        lateout("rcx") _,
        lateout("r11") _,
    );
    if ret < 0 {
        // SAFETY: errno is ours; raw syscalls report failure as -errno.
        *libc::__errno_location() = -ret as i32;
        return -1;
    }
    ret
}

/// The highest capability number this kernel knows.
pub(crate) fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

impl Child {
    pub fn kill(&self, signal: i32) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal on a pidfd we own; no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reaps the child (blocking).
    pub fn wait(&self) -> std::io::Result<ExitStatus> {
        wait_pidfd(self.pidfd.as_raw_fd(), 0).map(|s| s.expect("a blocking wait returns a status"))
    }

    /// Reaps the child if it has exited.
    pub fn try_wait(&self) -> std::io::Result<Option<ExitStatus>> {
        wait_pidfd(self.pidfd.as_raw_fd(), libc::WNOHANG)
    }
}

fn wait_pidfd(pidfd: RawFd, options: i32) -> std::io::Result<Option<ExitStatus>> {
    const P_PIDFD: libc::idtype_t = 3;
    loop {
        // SAFETY: zeroed siginfo is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::waitid(
                P_PIDFD,
                pidfd as libc::id_t,
                &mut info,
                libc::WEXITED | options,
            )
        };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: waitid filled in a SIGCHLD siginfo (or left it zeroed under WNOHANG).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        return Ok(Some(if info.si_code == libc::CLD_EXITED {
            ExitStatus::Exited(status)
        } else {
            ExitStatus::Signaled(status)
        }));
    }
}

/// Checks what the rootfs must have before forking, so mistakes get plain messages.
fn check_rootfs(spec: &Spec) -> Result<(), SpawnError> {
    let root = &spec.rootfs;
    if !root.is_dir() {
        return Err(setup_error(format!(
            "rootfs {} does not exist or is not a directory",
            root.display()
        )));
    }
    let mut needed = vec!["proc", "dev", "tmp"];
    if spec.work.is_some() {
        needed.push("work");
    }
    needed.extend(spec.tmpfs.iter().map(|p| p.trim_start_matches('/')));
    for dir in needed {
        if !root.join(dir).is_dir() {
            return Err(setup_error(format!(
                "rootfs {} has no /{dir} directory to mount on",
                root.display()
            )));
        }
    }
    if let Some(work) = &spec.work {
        if !work.is_dir() {
            return Err(setup_error(format!(
                "work directory {} does not exist",
                work.display()
            )));
        }
    }
    Ok(())
}

fn describe_failure(spec: &Spec, prepared: &Prepared, failed: &Failure) -> SpawnError {
    let err = std::io::Error::from_raw_os_error(failed.error);
    let cmd = &spec.argv[0];
    if failed.stage == i32::from(child::EXEC) {
        let kind = match failed.error {
            libc::ENOENT | libc::ENOTDIR => SpawnErrorKind::NotFound,
            _ => SpawnErrorKind::NotExecutable,
        };
        let message = match kind {
            SpawnErrorKind::NotFound => format!("command not found in the sandbox: {cmd}"),
            _ => format!("cannot execute {cmd} in the sandbox: {err}"),
        };
        return SpawnError {
            kind,
            message,
            orphan: None,
        };
    }
    let what = prepared.describe(failed);
    setup_error(format!("sandbox setup failed: cannot {what}: {err}"))
}

fn write_id_maps(pid: i32, host: u32, count: u32) -> Result<()> {
    let proc = Path::new("/proc").join(pid.to_string());
    std::fs::write(proc.join("setgroups"), "deny").context("setgroups")?;
    let map = format!("0 {host} {count}\n");
    std::fs::write(proc.join("uid_map"), &map).context("uid_map")?;
    std::fs::write(proc.join("gid_map"), &map).context("gid_map")?;
    Ok(())
}

pub(crate) fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two new descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn cstring(s: impl Into<Vec<u8>>) -> Result<CString> {
    CString::new(s).context("string contains a NUL byte")
}

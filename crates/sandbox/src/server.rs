//! A spawner in a process of its own, for a multi-threaded caller (the daemon).
//!
//! Forking a multi-threaded process is unsafe, so the caller forks this server while it
//! is still single-threaded, before its async runtime starts. Requests travel over a
//! SEQPACKET socket: the spec as JSON, its descriptors (stdio, cgroup entry, network
//! namespace) by SCM_RIGHTS. The server clones sandboxes with CLONE_PARENT, so they are
//! the caller's children: the reply carries a pidfd the caller waits on for the exit
//! status, exactly as with a local [`Spawner`].

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use skiff_cgroups::Entry;

use crate::spawn::{Child, SpawnError, SpawnErrorKind, Spawner};
use crate::spec::{IdMap, Spec};

/// Descriptors one request can carry: stdio, a cgroup dir, v1 joins, a netns.
const MAX_FDS: usize = 16;
const MAX_MESSAGE: usize = 256 << 10;

/// The caller's handle on the spawner process.
pub struct RemoteSpawner {
    sock: Mutex<OwnedFd>,
    pid: i32,
}

/// A spec without its descriptors, which travel beside it.
#[derive(Serialize, Deserialize)]
struct WireSpec {
    id: String,
    rootfs: PathBuf,
    dev_template: PathBuf,
    argv: Vec<String>,
    env: Vec<String>,
    cwd: String,
    uid: u32,
    gid: u32,
    user_ns: Option<(u32, u32)>,
    work: Option<PathBuf>,
    tmpfs: Vec<String>,
    die_with_parent: bool,
    max_open_files: u64,
    /// Which descriptors follow stdio: a clone_into dir, how many joins, a netns.
    clone_into: bool,
    joins: usize,
    netns: bool,
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Started { pid: i32 },
    Failed { kind: u8, message: String },
}

impl RemoteSpawner {
    /// Forks the spawner process. Call while this process is single-threaded.
    pub fn start() -> Result<RemoteSpawner> {
        let (ours, theirs) = crate::spawn::seqpacket_pair().context("socketpair")?;
        // SAFETY: the caller guarantees a single thread; the child only runs `serve`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork the spawner");
        }
        if pid == 0 {
            drop(ours);
            // SAFETY: plain prctl; the spawner must not outlive its caller.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            let code = match serve(theirs) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("skiff: spawner: {e:#}");
                    1
                }
            };
            // SAFETY: leave without running the caller's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        drop(theirs);
        Ok(RemoteSpawner {
            sock: Mutex::new(ours),
            pid,
        })
    }

    /// The spawner process's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Starts `spec` in the cgroup `entry`, as [`Spawner::spawn`] does.
    pub fn spawn(&self, spec: &Spec, entry: &Entry) -> Result<Child, SpawnError> {
        let wire = WireSpec {
            id: spec.id.clone(),
            rootfs: spec.rootfs.clone(),
            dev_template: spec.dev_template.clone(),
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            cwd: spec.cwd.clone(),
            uid: spec.uid,
            gid: spec.gid,
            user_ns: spec.user_ns.map(|m| (m.host, m.count)),
            work: spec.work.clone(),
            tmpfs: spec.tmpfs.clone(),
            die_with_parent: spec.die_with_parent,
            max_open_files: spec.max_open_files,
            clone_into: entry.clone_into.is_some(),
            joins: entry.join.len(),
            netns: spec.netns.is_some(),
        };
        let mut fds: Vec<RawFd> = spec.stdio.to_vec();
        fds.extend(entry.clone_into.as_ref().map(|f| f.as_raw_fd()));
        fds.extend(entry.join.iter().map(|f| f.as_raw_fd()));
        fds.extend(spec.netns.as_ref().map(|f| f.as_raw_fd()));
        let failed = |message: String| SpawnError {
            kind: SpawnErrorKind::Setup,
            message,
            orphan: None,
        };
        let request = serde_json::to_vec(&wire).map_err(|e| failed(e.to_string()))?;
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        send_with_fds(sock.as_raw_fd(), &request, &fds)
            .map_err(|e| failed(format!("the spawner is gone: {e}")))?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let (n, mut received) = recv_with_fds(sock.as_raw_fd(), &mut buf)
            .map_err(|e| failed(format!("the spawner is gone: {e}")))?;
        drop(sock);
        if n == 0 {
            return Err(failed("the spawner exited".into()));
        }
        let reply: Reply = serde_json::from_slice(&buf[..n]).map_err(|e| failed(e.to_string()))?;
        let pidfd = received.pop();
        match (reply, pidfd) {
            (Reply::Started { pid }, Some(pidfd)) => Ok(Child { pid, pidfd }),
            (Reply::Failed { kind, message }, pidfd) => {
                // A child that failed before exec is ours to reap.
                if let Some(pidfd) = pidfd {
                    let _ = Child { pid: 0, pidfd }.wait();
                }
                Err(SpawnError {
                    kind: match kind {
                        1 => SpawnErrorKind::NotFound,
                        2 => SpawnErrorKind::NotExecutable,
                        _ => SpawnErrorKind::Setup,
                    },
                    message,
                    orphan: None,
                })
            }
            (Reply::Started { .. }, None) => Err(failed("the spawner sent no pidfd".into())),
        }
    }
}

/// The spawner process's loop: one request, one reply, until the caller hangs up.
fn serve(sock: OwnedFd) -> Result<()> {
    let spawner = Spawner::for_parent()?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (n, fds) = recv_with_fds(sock.as_raw_fd(), &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let (reply, pidfd) = match serde_json::from_slice::<WireSpec>(&buf[..n]) {
            Ok(wire) => handle(&spawner, wire, fds),
            Err(e) => (
                Reply::Failed {
                    kind: 0,
                    message: format!("bad request: {e}"),
                },
                None,
            ),
        };
        let bytes = serde_json::to_vec(&reply)?;
        let fds: Vec<RawFd> = pidfd.iter().map(|f| f.as_raw_fd()).collect();
        send_with_fds(sock.as_raw_fd(), &bytes, &fds)?;
    }
}

fn handle(spawner: &Spawner, wire: WireSpec, fds: Vec<OwnedFd>) -> (Reply, Option<OwnedFd>) {
    let expected = 3 + wire.clone_into as usize + wire.joins + wire.netns as usize;
    if fds.len() != expected {
        let message = format!("expected {expected} descriptors, got {}", fds.len());
        return (Reply::Failed { kind: 0, message }, None);
    }
    let mut fds = fds.into_iter();
    let stdio: Vec<OwnedFd> = fds.by_ref().take(3).collect();
    let entry = Entry {
        clone_into: if wire.clone_into { fds.next() } else { None },
        join: fds.by_ref().take(wire.joins).collect(),
    };
    let mut spec = Spec::new(&wire.id, wire.rootfs, wire.dev_template, wire.argv);
    spec.env = wire.env;
    spec.cwd = wire.cwd;
    (spec.uid, spec.gid) = (wire.uid, wire.gid);
    spec.user_ns = wire.user_ns.map(|(host, count)| IdMap { host, count });
    spec.work = wire.work;
    spec.tmpfs = wire.tmpfs;
    spec.die_with_parent = wire.die_with_parent;
    spec.max_open_files = wire.max_open_files;
    spec.netns = if wire.netns { fds.next() } else { None };
    spec.stdio = [
        stdio[0].as_raw_fd(),
        stdio[1].as_raw_fd(),
        stdio[2].as_raw_fd(),
    ];
    match spawner.spawn(&spec, &entry) {
        Ok(child) => (Reply::Started { pid: child.pid }, Some(child.pidfd)),
        Err(e) => {
            let kind = match e.kind {
                SpawnErrorKind::NotFound => 1,
                SpawnErrorKind::NotExecutable => 2,
                SpawnErrorKind::Setup => 0,
            };
            let orphan = e.orphan.map(|c| c.pidfd);
            (
                Reply::Failed {
                    kind,
                    message: e.message,
                },
                orphan,
            )
        }
    }
}

/// Sends `data` with the descriptors `fds` (SCM_RIGHTS) on a Unix socket.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    // u64s: a control buffer must be aligned for cmsghdr, which a byte vector is not.
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    // SAFETY: msghdr and its control buffer are built per the cmsg(3) rules.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32);
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = len as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one message into `buf` with the descriptors that came with it.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    // u64s: a control buffer must be aligned for cmsghdr, which a byte vector is not.
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    // SAFETY: as in send_with_fds; received descriptors become OwnedFds once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = (control.len() * 8) as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        };
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = payload / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok((n, fds))
    }
}

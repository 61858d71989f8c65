//! The child side of a spawn: everything between `clone3` and `execve`.
//!
//! All strings are prepared by the parent before the clone, so the child only makes
//! syscalls. Any failure is reported to the parent as (stage, index, errno) over the
//! setup socket and the child exits; the socket is close-on-exec, so EOF means success.

use std::ffi::{c_char, CString};
use std::os::fd::{AsRawFd, RawFd};

use anyhow::Result;
use skiff_cgroups::Entry;

use crate::seccomp::Filter;
use crate::spawn::cstring;
use crate::spec::Spec;

pub(crate) const MESSAGE_LEN: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum Stage {
    Stdio = 1,
    JoinCgroup,
    CgroupNs,
    Netns,
    Private,
    BindRoot,
    RemountRoot,
    MountProc,
    MaskProc,
    ReadonlyProc,
    MountDev,
    DevShm,
    MountTmp,
    MountTmpfs,
    BindWork,
    PivotRoot,
    Hostname,
    Rlimit,
    Chdir,
    UserNs,
    SetIds,
    Caps,
    NoNewPrivs,
    Seccomp,
    Exec,
}

impl Stage {
    fn from_u16(v: u16) -> Stage {
        const ALL: [Stage; 25] = [
            Stage::Stdio,
            Stage::JoinCgroup,
            Stage::CgroupNs,
            Stage::Netns,
            Stage::Private,
            Stage::BindRoot,
            Stage::RemountRoot,
            Stage::MountProc,
            Stage::MaskProc,
            Stage::ReadonlyProc,
            Stage::MountDev,
            Stage::DevShm,
            Stage::MountTmp,
            Stage::MountTmpfs,
            Stage::BindWork,
            Stage::PivotRoot,
            Stage::Hostname,
            Stage::Rlimit,
            Stage::Chdir,
            Stage::UserNs,
            Stage::SetIds,
            Stage::Caps,
            Stage::NoNewPrivs,
            Stage::Seccomp,
            Stage::Exec,
        ];
        ALL.into_iter()
            .find(|s| *s as u16 == v)
            .unwrap_or(Stage::Exec)
    }
}

/// What the child tells the parent before it execs.
pub(crate) enum Message {
    /// The child unshared its user namespace; the parent must write the id maps.
    NeedIdMaps,
    Failed {
        stage: Stage,
        index: u16,
        errno: i32,
    },
}

impl Message {
    pub(crate) fn decode(buf: &[u8; MESSAGE_LEN]) -> Message {
        if buf[0] == b'U' {
            return Message::NeedIdMaps;
        }
        Message::Failed {
            stage: Stage::from_u16(u16::from_ne_bytes([buf[0], buf[1]])),
            index: u16::from_ne_bytes([buf[2], buf[3]]),
            errno: i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]),
        }
    }
}

/// runc's masked /proc files and directories (the /sys ones do not apply: skiff mounts
/// no /sys).
pub(crate) const MASKED_FILES: [&str; 7] = [
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
];
pub(crate) const MASKED_DIRS: [&str; 3] = ["acpi", "asound", "scsi"];
pub(crate) const READONLY: [&str; 5] = ["bus", "fs", "irq", "sys", "sysrq-trigger"];
/// Mount options of /dev/shm, /tmp (and --tmpfs paths), and masked /proc directories.
pub(crate) const SHM_OPTIONS: &str = "mode=1777,size=64m";
pub(crate) const TMP_OPTIONS: &str = "mode=1777";
pub(crate) const MASK_OPTIONS: &str = "size=0";

/// A spawn's strings and descriptors, made before the clone.
pub(crate) struct Prepared<'a> {
    stdio: [RawFd; 3],
    die_with_parent: bool,
    join: Vec<RawFd>,
    netns: Option<RawFd>,
    root: CString,
    proc_dir: CString,
    masked_files: Vec<CString>,
    masked_dirs: Vec<CString>,
    readonly: Vec<CString>,
    dev_template: CString,
    dev: CString,
    dev_shm: CString,
    tmp: CString,
    tmpfs: Vec<CString>,
    work: Option<(CString, CString)>,
    hostname: CString,
    cwd: CString,
    user_ns: bool,
    uid: u32,
    gid: u32,
    max_open_files: u64,
    last_cap: u32,
    filter: &'a Filter,
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    _env: Vec<CString>,
    env_ptrs: Vec<*const c_char>,
    s: Consts,
}

/// Literal strings the child passes to mount(2).
struct Consts {
    proc: CString,
    tmpfs: CString,
    dev_null: CString,
    dot: CString,
    slash: CString,
    opt_shm: CString,
    opt_tmp: CString,
    opt_mask: CString,
}

impl<'a> Prepared<'a> {
    pub(crate) fn new(
        spec: &Spec,
        entry: &Entry,
        filter: &'a Filter,
        last_cap: u32,
    ) -> Result<Prepared<'a>> {
        let root = spec.rootfs.canonicalize()?;
        let under = |rel: &str| cstring(root.join(rel).into_os_string().into_encoded_bytes());
        let proc_dir = under("proc")?;
        let masked_files = MASKED_FILES
            .iter()
            .map(|f| under(&format!("proc/{f}")))
            .collect::<Result<_>>()?;
        let masked_dirs = MASKED_DIRS
            .iter()
            .map(|f| under(&format!("proc/{f}")))
            .collect::<Result<_>>()?;
        let readonly = READONLY
            .iter()
            .map(|f| under(&format!("proc/{f}")))
            .collect::<Result<_>>()?;
        let tmpfs = spec
            .tmpfs
            .iter()
            .map(|p| under(p.trim_start_matches('/')))
            .collect::<Result<_>>()?;
        let work = match &spec.work {
            Some(dir) => Some((
                cstring(dir.canonicalize()?.into_os_string().into_encoded_bytes())?,
                under("work")?,
            )),
            None => None,
        };
        let argv: Vec<CString> = spec
            .argv
            .iter()
            .map(|a| cstring(a.as_str()))
            .collect::<Result<_>>()?;
        let env: Vec<CString> = spec
            .env
            .iter()
            .map(|e| cstring(e.as_str()))
            .collect::<Result<_>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Ok(Prepared {
            stdio: spec.stdio,
            die_with_parent: spec.die_with_parent,
            join: entry.join.iter().map(|f| f.as_raw_fd()).collect(),
            netns: spec.netns.as_ref().map(|f| f.as_raw_fd()),
            root: cstring(root.clone().into_os_string().into_encoded_bytes())?,
            proc_dir,
            masked_files,
            masked_dirs,
            readonly,
            dev_template: cstring(
                spec.dev_template
                    .clone()
                    .into_os_string()
                    .into_encoded_bytes(),
            )?,
            dev: under("dev")?,
            dev_shm: under("dev/shm")?,
            tmp: under("tmp")?,
            tmpfs,
            work,
            hostname: cstring(spec.id.as_str())?,
            cwd: cstring(spec.cwd.as_str())?,
            user_ns: spec.user_ns.is_some(),
            uid: spec.uid,
            gid: spec.gid,
            max_open_files: spec.max_open_files,
            last_cap,
            filter,
            candidates: spec
                .exec_candidates()
                .into_iter()
                .map(cstring)
                .collect::<Result<_>>()?,
            argv_ptrs: ptrs(&argv),
            _argv: argv,
            env_ptrs: ptrs(&env),
            _env: env,
            s: Consts {
                proc: cstring("proc")?,
                tmpfs: cstring("tmpfs")?,
                dev_null: cstring("/dev/null")?,
                dot: cstring(".")?,
                slash: cstring("/")?,
                opt_shm: cstring(SHM_OPTIONS)?,
                opt_tmp: cstring(TMP_OPTIONS)?,
                opt_mask: cstring(MASK_OPTIONS)?,
            },
        })
    }

    /// Human words for a failed stage, for the parent's error message.
    pub(crate) fn describe(&self, stage: Stage, index: u16) -> String {
        let i = index as usize;
        let root = self.root.to_string_lossy();
        let path = |c: Option<&CString>| {
            c.map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        match stage {
            Stage::Stdio => "set up stdin/stdout/stderr".into(),
            Stage::JoinCgroup => "join the sandbox's cgroup".into(),
            Stage::CgroupNs => "create a cgroup namespace".into(),
            Stage::Netns => "join the network namespace".into(),
            Stage::Private => "make mounts private".into(),
            Stage::BindRoot => format!("bind-mount the rootfs {root}"),
            Stage::RemountRoot => format!("make the rootfs {root} read-only"),
            Stage::MountProc => "mount /proc".into(),
            Stage::MaskProc => format!(
                "mask {}",
                path(self.masked_files.iter().chain(&self.masked_dirs).nth(i))
            ),
            Stage::ReadonlyProc => format!("make {} read-only", path(self.readonly.get(i))),
            Stage::MountDev => "mount /dev".into(),
            Stage::DevShm => "mount /dev/shm".into(),
            Stage::MountTmp => "mount /tmp".into(),
            Stage::MountTmpfs => format!("mount a tmpfs on {}", path(self.tmpfs.get(i))),
            Stage::BindWork => "bind-mount the work directory at /work".into(),
            Stage::PivotRoot => "pivot_root into the rootfs".into(),
            Stage::Hostname => "set the hostname".into(),
            Stage::Rlimit => "set resource limits".into(),
            Stage::Chdir => format!("change to the directory {}", self.cwd.to_string_lossy()),
            Stage::UserNs => "create a user namespace".into(),
            Stage::SetIds => format!("switch to uid {} gid {}", self.uid, self.gid),
            Stage::Caps => "drop capabilities".into(),
            Stage::NoNewPrivs => "set no_new_privs".into(),
            Stage::Seccomp => "install the seccomp filter".into(),
            Stage::Exec => "execute the command".into(),
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn fail(sock: RawFd, stage: Stage, index: usize, errno: i32) -> ! {
    let mut msg = [0u8; MESSAGE_LEN];
    msg[0..2].copy_from_slice(&(stage as u16).to_ne_bytes());
    msg[2..4].copy_from_slice(&(index as u16).to_ne_bytes());
    msg[4..8].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: plain syscalls on our own descriptors.
    unsafe {
        libc::write(sock, msg.as_ptr().cast(), msg.len());
        libc::_exit(125)
    }
}

/// Calls `f`; on a negative result reports `stage` and exits.
macro_rules! check {
    ($sock:expr, $stage:expr, $index:expr, $call:expr) => {
        // SAFETY: every call passes NUL-terminated strings and descriptors prepared by
        // the parent, which stay alive in this forked copy of its memory.
        #[allow(unused_unsafe)]
        let result = unsafe { $call };
        if result < 0 {
            fail($sock, $stage, $index, errno());
        }
    };
}

fn mount(
    src: &CString,
    dst: &CString,
    fstype: Option<&CString>,
    flags: libc::c_ulong,
    data: Option<&CString>,
) -> i32 {
    // SAFETY: valid C strings or NULL.
    unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    }
}

/// Sets up the sandbox from inside and execs. Never returns.
pub(crate) fn run(p: &Prepared, sock: RawFd) -> ! {
    // Standard streams first, so the command's output goes where the caller asked.
    for (target, &fd) in p.stdio.iter().enumerate() {
        if fd != target as RawFd {
            check!(sock, Stage::Stdio, target, libc::dup2(fd, target as RawFd));
        }
    }
    for &fd in &p.join {
        check!(
            sock,
            Stage::JoinCgroup,
            0,
            libc::write(fd, b"0".as_ptr().cast(), 1)
        );
    }
    // After joining, so the namespace's root is the sandbox's own cgroup.
    check!(
        sock,
        Stage::CgroupNs,
        0,
        libc::unshare(libc::CLONE_NEWCGROUP)
    );
    if let Some(fd) = p.netns {
        check!(sock, Stage::Netns, 0, libc::setns(fd, libc::CLONE_NEWNET));
    }

    mount_root(p, sock);

    let host = &p.hostname;
    check!(
        sock,
        Stage::Hostname,
        0,
        libc::sethostname(host.as_ptr(), host.as_bytes().len())
    );
    let nofile = libc::rlimit {
        rlim_cur: p.max_open_files,
        rlim_max: p.max_open_files,
    };
    let nocore = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    check!(
        sock,
        Stage::Rlimit,
        0,
        libc::setrlimit(libc::RLIMIT_NOFILE, &nofile)
    );
    check!(
        sock,
        Stage::Rlimit,
        1,
        libc::setrlimit(libc::RLIMIT_CORE, &nocore)
    );
    check!(sock, Stage::SetIds, 0, libc::setgroups(0, std::ptr::null()));

    if p.user_ns {
        // Last, after every mount: the other namespaces stay owned by the host's user
        // namespace, so root inside holds no power over them.
        check!(sock, Stage::UserNs, 0, libc::unshare(libc::CLONE_NEWUSER));
        let mut reply = [0u8; 1];
        check!(
            sock,
            Stage::UserNs,
            1,
            libc::write(sock, b"U".as_ptr().cast(), 1)
        );
        // SAFETY: one byte into a local buffer.
        if unsafe { libc::read(sock, reply.as_mut_ptr().cast(), 1) } != 1 {
            fail(sock, Stage::UserNs, 2, libc::EPIPE);
        }
    }

    drop_privileges(p, sock);

    check!(sock, Stage::Chdir, 0, libc::chdir(p.cwd.as_ptr()));
    if p.die_with_parent {
        // After the uid change, which would clear it. If the parent died before this,
        // its end of the socket is closed: give up rather than run unsupervised.
        check!(
            sock,
            Stage::Caps,
            1,
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL)
        );
        let mut pfd = libc::pollfd {
            fd: sock,
            events: 0,
            revents: 0,
        };
        // SAFETY: one pollfd on our own socket.
        if unsafe { libc::poll(&mut pfd, 1, 0) } > 0 && pfd.revents & libc::POLLHUP != 0 {
            // SAFETY: plain exit.
            unsafe { libc::_exit(125) };
        }
    }
    // SAFETY: resetting signal state inherited from the parent (Rust ignores SIGPIPE;
    // `skiff run` blocks the signals it forwards).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // Every inherited descriptor but the standard streams closes at exec.
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    check!(
        sock,
        Stage::NoNewPrivs,
        0,
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    );
    if let Err(e) = p.filter.apply() {
        fail(
            sock,
            Stage::Seccomp,
            0,
            e.raw_os_error().unwrap_or(libc::EINVAL),
        );
    }
    let mut first_error = libc::ENOENT;
    for cand in &p.candidates {
        // SAFETY: NULL-terminated pointer arrays into CStrings owned by `p`.
        unsafe { libc::execve(cand.as_ptr(), p.argv_ptrs.as_ptr(), p.env_ptrs.as_ptr()) };
        let e = errno();
        // As execvp: remember a "found but not executable" over later misses.
        if e != libc::ENOENT && e != libc::ENOTDIR && first_error == libc::ENOENT {
            first_error = e;
        }
    }
    fail(sock, Stage::Exec, 0, first_error)
}

fn mount_root(p: &Prepared, sock: RawFd) {
    let s = &p.s;
    let none = None;
    let nosuid_nodev = (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong;
    let nosuid_nodev_noexec = nosuid_nodev | libc::MS_NOEXEC;
    check!(
        sock,
        Stage::Private,
        0,
        mount(
            &s.slash,
            &s.slash,
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            none
        )
    );
    check!(
        sock,
        Stage::BindRoot,
        0,
        mount(&p.root, &p.root, none, libc::MS_BIND, none)
    );
    check!(
        sock,
        Stage::RemountRoot,
        0,
        mount(
            &p.root,
            &p.root,
            none,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | nosuid_nodev,
            none
        )
    );
    check!(
        sock,
        Stage::MountProc,
        0,
        mount(
            &s.proc,
            &p.proc_dir,
            Some(&s.proc),
            nosuid_nodev_noexec,
            none
        )
    );
    for (i, file) in p.masked_files.iter().enumerate() {
        if mount(&s.dev_null, file, none, libc::MS_BIND, none) < 0 && errno() != libc::ENOENT {
            fail(sock, Stage::MaskProc, i, errno());
        }
    }
    for (i, dir) in p.masked_dirs.iter().enumerate() {
        let flags = libc::MS_RDONLY | nosuid_nodev_noexec;
        if mount(&s.tmpfs, dir, Some(&s.tmpfs), flags, Some(&s.opt_mask)) < 0
            && errno() != libc::ENOENT
        {
            fail(sock, Stage::MaskProc, p.masked_files.len() + i, errno());
        }
    }
    for (i, path) in p.readonly.iter().enumerate() {
        if mount(path, path, none, libc::MS_BIND, none) < 0 {
            if errno() == libc::ENOENT {
                continue;
            }
            fail(sock, Stage::ReadonlyProc, i, errno());
        }
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | nosuid_nodev_noexec;
        check!(
            sock,
            Stage::ReadonlyProc,
            i,
            mount(path, path, none, flags, none)
        );
    }

    check!(
        sock,
        Stage::MountDev,
        0,
        mount(
            &p.dev_template,
            &p.dev,
            none,
            libc::MS_BIND | libc::MS_REC,
            none
        )
    );
    check!(
        sock,
        Stage::DevShm,
        0,
        mount(
            &s.tmpfs,
            &p.dev_shm,
            Some(&s.tmpfs),
            nosuid_nodev_noexec,
            Some(&s.opt_shm)
        )
    );
    check!(
        sock,
        Stage::MountTmp,
        0,
        mount(
            &s.tmpfs,
            &p.tmp,
            Some(&s.tmpfs),
            nosuid_nodev,
            Some(&s.opt_tmp)
        )
    );
    for (i, path) in p.tmpfs.iter().enumerate() {
        check!(
            sock,
            Stage::MountTmpfs,
            i,
            mount(
                &s.tmpfs,
                path,
                Some(&s.tmpfs),
                nosuid_nodev,
                Some(&s.opt_tmp)
            )
        );
    }
    if let Some((src, dst)) = &p.work {
        check!(
            sock,
            Stage::BindWork,
            0,
            mount(src, dst, none, libc::MS_BIND, none)
        );
        check!(
            sock,
            Stage::BindWork,
            1,
            mount(
                dst,
                dst,
                none,
                libc::MS_BIND | libc::MS_REMOUNT | nosuid_nodev,
                none
            )
        );
    }
    // runc's trick: pivot onto the new root with the old one stacked beneath, then
    // detach the old one; no put_old directory is needed in a read-only rootfs.
    check!(sock, Stage::PivotRoot, 0, libc::chdir(p.root.as_ptr()));
    check!(
        sock,
        Stage::PivotRoot,
        1,
        libc::syscall(libc::SYS_pivot_root, s.dot.as_ptr(), s.dot.as_ptr()) as i32
    );
    check!(
        sock,
        Stage::PivotRoot,
        2,
        libc::umount2(s.dot.as_ptr(), libc::MNT_DETACH)
    );
    check!(sock, Stage::PivotRoot, 3, libc::chdir(s.slash.as_ptr()));
}

/// Lock root's special powers off before dropping: exec as uid 0 grants nothing.
pub(crate) const SECBITS: libc::c_ulong = 0x01 | 0x02 | 0x08 | 0x20 | 0x40 | 0x80;

fn drop_privileges(p: &Prepared, sock: RawFd) {
    check!(
        sock,
        Stage::Caps,
        0,
        libc::prctl(libc::PR_SET_SECUREBITS, SECBITS)
    );
    for cap in 0..=p.last_cap {
        check!(
            sock,
            Stage::Caps,
            2,
            libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong)
        );
    }
    check!(
        sock,
        Stage::Caps,
        3,
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0
        )
    );
    check!(sock, Stage::SetIds, 0, libc::setresgid(p.gid, p.gid, p.gid));
    check!(sock, Stage::SetIds, 0, libc::setresuid(p.uid, p.uid, p.uid));
    // uid 0 keeps its capability sets across setresuid: clear them explicitly.
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    check!(
        sock,
        Stage::Caps,
        4,
        libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as i32
    );
}

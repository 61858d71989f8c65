//! The child side of a spawn: everything between `clone3` and `execve`.
//!
//! The sandbox itself is built by the entry every path shares (`entry.c`, see
//! `entry.h`), from values the parent prepares before the clone, so the child only makes
//! syscalls. Any failure is reported to the parent as (stage, index, errno) over the
//! setup socket and the child exits; the socket is close-on-exec, so EOF means success.

use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, RawFd};

use anyhow::Result;
use skiff_cgroups::Entry;

use crate::seccomp::Filter;
use crate::spawn::cstring;
use crate::spec::Spec;

pub(crate) const MESSAGE_LEN: usize = 8;

/// The stage of a failed exec; the entry's own stages are numbered from 1 (entry.c).
pub(crate) const EXEC: u16 = 0;

/// What the child tells the parent before it execs.
pub(crate) enum Message {
    /// The child unshared its user namespace; the parent must write the id maps.
    NeedIdMaps,
    Failed(Failure),
}

impl Message {
    pub(crate) fn decode(buf: &[u8; MESSAGE_LEN]) -> Message {
        if buf[0] == b'U' {
            return Message::NeedIdMaps;
        }
        Message::Failed(Failure {
            stage: u16::from_ne_bytes([buf[0], buf[1]]).into(),
            index: u16::from_ne_bytes([buf[2], buf[3]]).into(),
            error: i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]),
        })
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
/// Lock root's special powers off before dropping: exec as uid 0 grants nothing.
pub(crate) const SECBITS: u64 = 0x01 | 0x02 | 0x08 | 0x20 | 0x40 | 0x80;

/// `struct skiff_prep` (entry.h).
#[repr(C)]
struct Prep {
    masked_files: *const *const c_char,
    masked_dirs: *const *const c_char,
    readonly: *const *const c_char,
    mask_options: *const c_char,
    last_cap: u32,
    leave_chroot: i32,
}

/// `struct skiff_plan` (entry.h).
#[repr(C)]
struct Plan {
    root: *const c_char,
    dev_template: *const c_char,
    shm_options: *const c_char,
    tmp_options: *const c_char,
    tmpfs: *const *const c_char,
    work: *const c_char,
    hostname: *const c_char,
    cwd: *const c_char,
    joins: *const i32,
    n_joins: u32,
    cgroup: i32,
    netns: i32,
    user_ns_sock: i32,
    uid: u32,
    gid: u32,
    max_open_files: u64,
    securebits: u64,
    die_with_parent: i32,
    parent_sock: i32,
    stdio: [i32; 3],
    channel: i32,
    close_rest: i32,
    before_lock: Option<extern "C" fn(*mut c_void) -> c_int>,
    before_lock_arg: *mut c_void,
    seccomp: *const c_void,
    seccomp_len: u32,
}

/// `struct skiff_failure` (entry.h).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Failure {
    pub(crate) stage: i32,
    pub(crate) index: i32,
    pub(crate) error: i32,
}

extern "C" {
    fn skiff_prepare(prep: *const Prep, failed: *mut Failure) -> c_int;
    fn skiff_enter(plan: *const Plan, failed: *mut Failure) -> c_int;
    fn skiff_describe(
        prep: *const Prep,
        plan: *const Plan,
        failed: *const Failure,
        buf: *mut c_char,
        cap: usize,
    );
    #[cfg(test)]
    fn skiff_plan_size() -> usize;
}

/// A spawn's strings and descriptors, made before the clone, and the entry's structs
/// pointing into them (heap data, which stays put when this moves).
pub(crate) struct Prepared {
    prep: Prep,
    plan: Plan,
    _strings: Vec<CString>,
    _lists: [Vec<*const c_char>; 4],
    _joins: Vec<i32>,
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    _env: Vec<CString>,
    env_ptrs: Vec<*const c_char>,
}

/// NULL-terminated pointers to `v`'s strings.
fn pointers(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

impl Prepared {
    /// What the child of a spawn of `spec` into `entry` needs; `sock` is its end of the
    /// setup socket.
    pub(crate) fn new(
        spec: &Spec,
        entry: &Entry,
        filter: &Filter,
        last_cap: u32,
        sock: RawFd,
    ) -> Result<Prepared> {
        let root = spec.rootfs.canonicalize()?;
        let bytes = |p: std::path::PathBuf| p.into_os_string().into_encoded_bytes();
        let names = |list: &[&str]| list.iter().map(|s| cstring(*s)).collect::<Result<Vec<_>>>();
        let masked_files = names(&MASKED_FILES)?;
        let masked_dirs = names(&MASKED_DIRS)?;
        let readonly = names(&READONLY)?;
        let tmpfs = spec
            .tmpfs
            .iter()
            .map(|p| cstring(bytes(root.join(p.trim_start_matches('/')))))
            .collect::<Result<Vec<_>>>()?;
        let work = match &spec.work {
            Some(dir) => Some(cstring(bytes(dir.canonicalize()?))?),
            None => None,
        };
        let strings = [
            cstring(bytes(root.clone()))?,
            cstring(bytes(spec.dev_template.clone()))?,
            cstring(SHM_OPTIONS)?,
            cstring(TMP_OPTIONS)?,
            cstring(MASK_OPTIONS)?,
            cstring(spec.id.as_str())?,
            cstring(spec.cwd.as_str())?,
        ];
        let s = |i: usize| strings[i].as_ptr();
        let lists = [
            pointers(&masked_files),
            pointers(&masked_dirs),
            pointers(&readonly),
            pointers(&tmpfs),
        ];
        let joins: Vec<i32> = entry.join.iter().map(|f| f.as_raw_fd()).collect();
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
        let program = filter.instructions();
        let prep = Prep {
            masked_files: lists[0].as_ptr(),
            masked_dirs: lists[1].as_ptr(),
            readonly: lists[2].as_ptr(),
            mask_options: s(4),
            last_cap,
            leave_chroot: 0,
        };
        let plan = Plan {
            root: s(0),
            dev_template: s(1),
            shm_options: s(2),
            tmp_options: s(3),
            tmpfs: lists[3].as_ptr(),
            work: work.as_ref().map_or(std::ptr::null(), |w| w.as_ptr()),
            hostname: s(5),
            cwd: s(6),
            joins: joins.as_ptr(),
            n_joins: joins.len() as u32,
            // A spawn clones straight into its v2 cgroup.
            cgroup: -1,
            netns: spec.netns.as_ref().map_or(-1, |f| f.as_raw_fd()),
            user_ns_sock: if spec.user_ns.is_some() { sock } else { -1 },
            uid: spec.uid,
            gid: spec.gid,
            max_open_files: spec.max_open_files,
            securebits: SECBITS,
            die_with_parent: spec.die_with_parent.into(),
            parent_sock: sock,
            stdio: spec.stdio,
            channel: -1,
            close_rest: 0,
            before_lock: None,
            before_lock_arg: std::ptr::null_mut(),
            seccomp: program.as_ptr().cast(),
            seccomp_len: program.len() as u32,
        };
        // Moved, not copied: the pointers above stay good.
        let mut strings = Vec::from(strings);
        strings.extend(masked_files);
        strings.extend(masked_dirs);
        strings.extend(readonly);
        strings.extend(tmpfs);
        strings.extend(work);
        Ok(Prepared {
            prep,
            plan,
            _strings: strings,
            _lists: lists,
            _joins: joins,
            candidates: spec
                .exec_candidates()
                .into_iter()
                .map(cstring)
                .collect::<Result<_>>()?,
            argv_ptrs: pointers(&argv),
            _argv: argv,
            env_ptrs: pointers(&env),
            _env: env,
        })
    }

    /// Human words for a failed step, for the parent's error message.
    pub(crate) fn describe(&self, failed: &Failure) -> String {
        let mut buf = [0u8; 512];
        // SAFETY: the structs point into strings `self` owns; the entry writes at most
        // `buf.len()` bytes, NUL-terminated.
        unsafe {
            skiff_describe(
                &self.prep,
                &self.plan,
                failed,
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn fail(sock: RawFd, failed: Failure) -> ! {
    let mut msg = [0u8; MESSAGE_LEN];
    msg[0..2].copy_from_slice(&(failed.stage as u16).to_ne_bytes());
    msg[2..4].copy_from_slice(&(failed.index as u16).to_ne_bytes());
    msg[4..8].copy_from_slice(&failed.error.to_ne_bytes());
    // SAFETY: plain syscalls on our own descriptors.
    unsafe {
        libc::write(sock, msg.as_ptr().cast(), msg.len());
        libc::_exit(125)
    }
}

/// Enters the sandbox and execs. Never returns.
pub(crate) fn run(p: &Prepared, sock: RawFd) -> ! {
    let mut failed = Failure::default();
    // SAFETY: the structs point into memory the parent prepared, alive in this child
    // (a vfork'd child borrows it, a forked one has a copy); the entry only makes
    // system calls.
    let entered = unsafe {
        skiff_prepare(&p.prep, &mut failed) >= 0 && skiff_enter(&p.plan, &mut failed) >= 0
    };
    if !entered {
        fail(sock, failed);
    }
    // SAFETY: resetting signal state inherited from the parent (Rust ignores SIGPIPE;
    // `skiff run` blocks the signals it forwards).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
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
    fail(
        sock,
        Failure {
            stage: EXEC.into(),
            index: 0,
            error: first_error,
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_plan_struct_matches_the_entrys() {
        // SAFETY: a constant from the entry.
        let size = unsafe { super::skiff_plan_size() };
        assert_eq!(std::mem::size_of::<super::Plan>(), size);
    }
}

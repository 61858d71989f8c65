//! The sandbox's seccomp filter: an allowlist modelled on Docker's default profile, as
//! hand-built classic BPF for x86_64.
//!
//! Layout: check the architecture (anything but x86_64 is killed), refuse x32 numbers,
//! handle the few syscalls that need argument checks (clone, clone3, ioctl,
//! personality), answer ENOSYS for numbers newer than this list knows (so a libc falls
//! back, as it does on an older kernel), then a binary search over the sorted allowed
//! ranges: O(log n) comparisons per syscall instead of one per allowed syscall.

use std::io;

/// Syscalls Docker's default profile allows without capabilities, as inclusive ranges
/// of x86_64 numbers. Left out, besides what needs a capability there (mount, umount2,
/// pivot_root, chroot, setns, unshare, sethostname, reboot, swapon/off, module and
/// kexec calls, clock and time setting, iopl/ioperm, quotactl, acct, keyring calls,
/// fanotify_init, open_by_handle_at, syslog, vhangup, NUMA policy calls, lookup_dcookie,
/// bpf, perf_event_open, userfaultfd): ptrace, process_vm_readv/writev, kcmp and
/// pidfd_getfd (a function has no business inspecting other processes), io_uring (a
/// recurring source of kernel escapes; Docker blocks it too), and the new mount API.
const ALLOWED: &[(u32, u32)] = &[
    (0, 55),    // read .. getsockopt
    (57, 100),  // fork .. times (56 clone is checked apart)
    (102, 102), // getuid
    (104, 133), // getgid .. mknod (101 ptrace, 103 syslog out)
    (137, 138), // statfs, fstatfs (134 uselib, 136 ustat out; 135 personality apart)
    (140, 152), // getpriority .. munlockall (139 sysfs out)
    (154, 154), // modify_ldt
    (157, 160), // prctl, arch_prctl, adjtimex, setrlimit
    (162, 162), // sync
    (186, 211), // gettid .. get_thread_area
    (213, 226), // epoll_create .. timer_delete (212 lookup_dcookie out)
    (228, 235), // clock_gettime .. utimes (227 clock_settime out)
    (240, 245), // mq_*
    (247, 247), // waitid
    (251, 255), // ioprio_*, inotify_*
    (257, 271), // openat .. ppoll (256 migrate_pages out, 272 unshare out)
    (273, 278), // set_robust_list .. vmsplice
    (280, 297), // utimensat .. rt_tgsigqueueinfo (279 move_pages out)
    (299, 299), // recvmmsg
    (301, 302), // fanotify_mark, prlimit64
    (306, 307), // syncfs, sendmmsg
    (309, 309), // getcpu
    (314, 319), // sched_setattr .. memfd_create
    (322, 322), // execveat
    (324, 334), // membarrier .. rseq
    (424, 424), // pidfd_send_signal
    (434, 434), // pidfd_open
    (436, 437), // close_range, openat2
    (439, 439), // faccessat2
    (441, 441), // epoll_pwait2
    (444, 449), // landlock_*, memfd_secret, process_mrelease, futex_waitv
    (451, 456), // cachestat, fchmodat2, map_shadow_stack, futex_wake/wait/requeue
];

/// The newest syscall number the list above knows.
const KNOWN_MAX: u32 = 456;

const SYS_IOCTL: u32 = 16;
const SYS_CLONE: u32 = 56;
const SYS_PERSONALITY: u32 = 135;
const SYS_CLONE3: u32 = 435;
/// Docker's mask of namespace flags a plain clone may not pass.
const CLONE_NAMESPACES: u32 = 0x7E02_0000;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
/// Personalities Docker allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32,
/// and the query value.
const PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
const RET_ENOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;

// Classic BPF opcodes.
const LD_ABS_W: u16 = 0x20;
const JEQ: u16 = 0x15;
const JGE: u16 = 0x35;
const JGT: u16 = 0x25;
const JSET: u16 = 0x45;
const RET: u16 = 0x06;

// Offsets in struct seccomp_data; an argument's low 32 bits (little-endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

/// A compiled filter, built once before fork; applying it is a single syscall.
pub struct Filter {
    program: Vec<libc::sock_filter>,
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn ret(k: u32) -> libc::sock_filter {
    insn(RET, 0, 0, k)
}

/// Binary search over `ranges`: ALLOW inside one, EPERM outside all.
fn search(ranges: &[(u32, u32)]) -> Vec<libc::sock_filter> {
    if ranges.is_empty() {
        return vec![ret(RET_EPERM)];
    }
    let mid = ranges.len() / 2;
    let (lo, hi) = ranges[mid];
    let left = search(&ranges[..mid]);
    let right = search(&ranges[mid + 1..]);
    let skip_left = u8::try_from(1 + left.len()).expect("filter subtree fits a BPF jump");
    let mut code = vec![
        insn(JGE, 0, 2, lo),         // below lo: to the left subtree
        insn(JGT, skip_left, 0, hi), // above hi: to the right subtree
        ret(RET_ALLOW),
    ];
    code.extend(left);
    code.extend(right);
    code
}

impl Filter {
    /// Docker-default-like allowlist for x86_64.
    pub fn docker_default() -> Filter {
        let mut p = vec![
            insn(LD_ABS_W, 0, 0, ARCH),
            insn(JEQ, 1, 0, AUDIT_ARCH_X86_64),
            ret(RET_KILL_PROCESS),
            insn(LD_ABS_W, 0, 0, NR),
            insn(JGE, 0, 1, X32_SYSCALL_BIT),
            ret(RET_EPERM),
        ];
        // Syscalls with argument checks: each test jumps to its block, laid out below.
        let clone = vec![
            insn(LD_ABS_W, 0, 0, arg_low(0)),
            insn(JSET, 0, 1, CLONE_NAMESPACES),
            ret(RET_EPERM),
            ret(RET_ALLOW),
        ];
        let ioctl = vec![
            insn(LD_ABS_W, 0, 0, arg_low(1)),
            insn(JEQ, 1, 0, TIOCSTI),
            insn(JEQ, 0, 1, TIOCLINUX),
            ret(RET_EPERM),
            ret(RET_ALLOW),
        ];
        let mut personality = vec![insn(LD_ABS_W, 0, 0, arg_low(0))];
        for (i, value) in PERSONALITIES.iter().enumerate() {
            // Match: jump over the remaining tests and the EPERM to the ALLOW.
            let to_allow = (PERSONALITIES.len() - i) as u8;
            personality.push(insn(JEQ, to_allow, 0, *value));
        }
        personality.extend([ret(RET_EPERM), ret(RET_ALLOW)]);
        let clone3 = vec![ret(RET_ENOSYS)];
        let blocks = [
            (SYS_CLONE, clone),
            (SYS_IOCTL, ioctl),
            (SYS_PERSONALITY, personality),
            (SYS_CLONE3, clone3),
        ];
        let tail = search(ALLOWED);
        // Dispatch: one JEQ per block, then the ENOSYS guard, then the search; blocks
        // follow the search.
        let dispatch_len = blocks.len();
        let guard_len = 2;
        let mut offset = (dispatch_len - 1 + guard_len + tail.len()) as u32;
        for (i, (nr, block)) in blocks.iter().enumerate() {
            let jump = u8::try_from(offset - i as u32).expect("dispatch jump fits");
            p.push(insn(JEQ, jump, 0, *nr));
            offset += block.len() as u32;
        }
        p.push(insn(JGT, 0, 1, KNOWN_MAX));
        p.push(ret(RET_ENOSYS));
        p.extend(tail);
        for (_, block) in blocks {
            p.extend(block);
        }
        Filter { program: p }
    }

    /// Installs the filter on the calling thread. The caller has set
    /// `PR_SET_NO_NEW_PRIVS`. Async-signal-safe: no allocation, no locks.
    pub fn apply(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prog points at a valid program that outlives the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.program.len()
    }

    pub fn is_empty(&self) -> bool {
        self.program.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_disjoint_and_jumps_in_bounds() {
        for pair in ALLOWED.windows(2) {
            assert!(pair[0].1 < pair[1].0, "{pair:?}");
        }
        let filter = Filter::docker_default();
        let p = &filter.program;
        assert!(p.len() < 400, "{} instructions", p.len());
        for (i, ins) in p.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(
                    i + 1 + (ins.jt as usize) < p.len(),
                    "jt out of bounds at {i}"
                );
                assert!(
                    i + 1 + (ins.jf as usize) < p.len(),
                    "jf out of bounds at {i}"
                );
            }
        }
        assert_eq!(p.last().unwrap().code, RET);
    }

    /// Runs `check` in a forked child under the filter; returns its exit code.
    fn under_filter(check: fn() -> i32) -> i32 {
        let filter = Filter::docker_default();
        // SAFETY: the child only makes syscalls and exits.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if filter.apply().is_err() {
                    libc::_exit(100);
                }
                libc::_exit(check());
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert!(libc::WIFEXITED(status), "child died: {status:#x}");
            libc::WEXITSTATUS(status)
        }
    }

    fn errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Each check returns 0 when the outcome is the expected one, or its own number.
    #[test]
    fn allows_ordinary_calls() {
        assert_eq!(
            under_filter(|| unsafe {
                if libc::getpid() <= 0 {
                    return 1;
                }
                let pid = libc::fork();
                if pid == 0 {
                    libc::_exit(0);
                }
                if pid < 0 || libc::waitpid(pid, std::ptr::null_mut(), 0) != pid {
                    return 2;
                }
                if libc::personality(0xffff_ffff) < 0 {
                    return 3;
                }
                let mut buf = [0u8; 8];
                if libc::getrandom(buf.as_mut_ptr().cast(), 8, 0) != 8 {
                    return 4;
                }
                0
            }),
            0
        );
    }

    #[test]
    fn refuses_privileged_and_escape_calls() {
        assert_eq!(
            under_filter(|| unsafe {
                let denied = |r: i64| r < 0 && errno() == libc::EPERM;
                let checks = [
                    denied(libc::mount(
                        c"none".as_ptr(),
                        c"/tmp".as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    ) as i64),
                    denied(libc::unshare(libc::CLONE_NEWNS) as i64),
                    denied(libc::setns(0, 0) as i64),
                    denied(libc::ptrace(libc::PTRACE_ATTACH, 1, 0, 0)),
                    denied(libc::syscall(libc::SYS_init_module, 0, 0, 0)),
                    denied(libc::syscall(libc::SYS_finit_module, 0, 0, 0)),
                    denied(libc::syscall(libc::SYS_keyctl, 0, 0, 0)),
                    denied(libc::syscall(libc::SYS_bpf, 0, 0, 0)),
                    denied(libc::syscall(libc::SYS_io_uring_setup, 1, 0)),
                    denied(libc::syscall(
                        libc::SYS_clone,
                        libc::CLONE_NEWUSER,
                        0,
                        0,
                        0,
                        0,
                    )),
                    denied(libc::ioctl(0, libc::TIOCSTI as _, c"x".as_ptr()) as i64),
                    denied(libc::personality(0x0040_0000) as i64),
                    libc::syscall(libc::SYS_clone3, 0, 0) < 0 && errno() == libc::ENOSYS,
                    libc::syscall(1000) < 0 && errno() == libc::ENOSYS,
                ];
                checks
                    .iter()
                    .position(|ok| !ok)
                    .map_or(0, |i| 10 + i as i32)
            }),
            0
        );
    }
}

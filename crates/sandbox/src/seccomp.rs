//! The sandbox's seccomp filter: an allowlist modelled on Docker's default profile
//! (moby's profiles/seccomp/default.json, for a container without added capabilities),
//! as hand-built classic BPF for x86_64.
//!
//! Layout of the program:
//!
//! 1. Load `arch`; anything but x86_64 (an `int 0x80` i386 call, say) kills the process.
//! 2. Load `nr`; x32 numbers (bit 30 set) and everything above them get EPERM.
//! 3. A balanced binary search tree over sorted, disjoint ranges of syscall numbers. A
//!    node is `[JGE lo][JGT hi][range code][tree below lo][tree above hi]`: inside the
//!    range its code runs (RET ALLOW for a plain allowed run, an argument check for
//!    clone, ioctl, personality and socket), below or above it the search goes on in that
//!    half, and an empty half is RET EPERM. Contiguous allowed numbers are one range, so
//!    a syscall costs about two comparisons per level, ~12 in all, not one per rule. The
//!    last range, numbers newer than the table, answers ENOSYS.
//!
//! The jump to the upper half must pass the lower half, and conditional jumps only reach
//! 255 instructions ahead; when a lower half is bigger than that the node goes through
//! an unconditional `JA` (32-bit offset) instead. The current tree never needs it.
//!
//! Argument checks compare only the low 32 bits of an argument. The kernel reads ioctl's
//! request, personality's value and socket's domain as 32-bit ints, so a 64-bit
//! comparison could be dodged by setting high bits the kernel then drops (the classic
//! TIOCSTI bypass); the clone namespace flags all live in the low word.

use std::mem::offset_of;

/// Syscalls allowed outright, as inclusive ranges of x86_64 numbers: Docker's
/// unconditional list (which covers kernels up to 6.13), less clock_adjtime (a function
/// has no use for the clock discipline; setting it needs a capability anyway) and
/// name_to_handle_at (a handle is only good for open_by_handle_at, which is refused).
/// The gaps are what Docker grants only with a capability, what it never allows, and
/// the calls with argument checks below.
const ALLOWED: &[(u32, u32)] = &[
    (0, 15),    // read .. rt_sigreturn
    (17, 40),   // pread64 .. sendfile (16 ioctl is checked)
    (42, 55),   // connect .. getsockopt (41 socket is checked)
    (57, 100),  // fork .. times (56 clone is checked)
    (102, 102), // getuid (101 ptrace out)
    (104, 133), // getgid .. mknod (103 syslog out)
    (137, 138), // statfs, fstatfs (134 uselib, 136 ustat out; 135 personality checked)
    (140, 152), // getpriority .. munlockall (139 sysfs out)
    (154, 154), // modify_ldt (153 vhangup out)
    (157, 160), // prctl, arch_prctl, adjtimex, setrlimit (155 pivot_root, 156 _sysctl out)
    (162, 162), // sync (161 chroot out)
    // 163..185 out: acct, settimeofday, mount, umount2, swapon/off, reboot, sethostname,
    // setdomainname, iopl, ioperm, module calls, quotactl, unimplemented numbers.
    (186, 211), // gettid .. get_thread_area
    (213, 226), // epoll_create .. timer_delete (212 lookup_dcookie out)
    (228, 235), // clock_gettime .. utimes (227 clock_settime out)
    (240, 245), // mq_open .. mq_getsetattr (236 vserver, 237..239 NUMA policy out)
    (247, 247), // waitid (246 kexec_load out)
    (251, 255), // ioprio_set .. inotify_rm_watch (248..250 add_key, request_key, keyctl out)
    (257, 271), // openat .. ppoll (256 migrate_pages out)
    (273, 278), // set_robust_list .. vmsplice (272 unshare out)
    (280, 297), // utimensat .. rt_tgsigqueueinfo (279 move_pages out)
    (299, 299), // recvmmsg (298 perf_event_open out)
    (301, 302), // fanotify_mark, prlimit64 (300 fanotify_init out)
    // 303 name_to_handle_at, 304 open_by_handle_at, 305 clock_adjtime out.
    (306, 307), // syncfs, sendmmsg
    (309, 309), // getcpu (308 setns out)
    (314, 319), // sched_setattr .. memfd_create (310..313 process_vm_*, kcmp, finit_module out)
    (322, 322), // execveat (320 kexec_file_load, 321 bpf out)
    // 324..336: membarrier .. rseq, plus uretprobe and uprobe, which only the kernel's own
    // probe trampolines can call (anyone else gets SIGILL). 323 userfaultfd out.
    (324, 336),
    (424, 424), // pidfd_send_signal
    (434, 434), // pidfd_open (425..427 io_uring, 428..433 new mount API out)
    (436, 437), // close_range, openat2 (435 clone3 answers ENOSYS)
    (439, 439), // faccessat2 (438 pidfd_getfd out)
    (441, 441), // epoll_pwait2 (440 process_madvise out)
    // 442 mount_setattr, 443 quotactl_fd out.
    (444, 449), // landlock_*, memfd_secret, process_mrelease, futex_waitv
    (451, 458), // cachestat .. futex_requeue, statmount, listmount (450 NUMA policy out)
    (462, 466), // mseal, setxattrat .. removexattrat (459..461 lsm_* out)
];

/// The newest syscall the profile knows. Newer numbers answer ENOSYS rather than EPERM,
/// as runc does for Docker's profile, so a libc falls back as on an older kernel.
const NEWEST_KNOWN: u32 = 466;

/// Docker's mask of namespace flags a plain clone may not pass.
const CLONE_NAMESPACES: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;
const _: () = assert!(CLONE_NAMESPACES == 0x7E02_0000);

/// ioctls that push input into a terminal or poke the console: refused.
const TTY_INJECTION: [u32; 2] = [libc::TIOCSTI as u32, libc::TIOCLINUX as u32];
/// Socket families Docker refuses: AF_ALG (kernel crypto) and AF_VSOCK (host sockets).
const SOCKET_FAMILIES_REFUSED: [u32; 2] = [38, 40];
/// Personalities Docker allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32,
/// and the query value.
const PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

// Classic BPF opcodes used here.
const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGT: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

// Offsets in struct seccomp_data; an argument's low half (x86_64 is little-endian).
const NR: u32 = offset_of!(libc::seccomp_data, nr) as u32;
const ARCH: u32 = offset_of!(libc::seccomp_data, arch) as u32;
const fn arg_low(i: u32) -> u32 {
    offset_of!(libc::seccomp_data, args) as u32 + 8 * i
}

/// A compiled filter, built once before fork; applying it is a single syscall.
pub struct Filter {
    program: Vec<libc::sock_filter>,
}

/// Syscall numbers `lo..=hi` and the straight-line code (ending in returns) they run.
struct Range {
    lo: u32,
    hi: u32,
    code: Vec<libc::sock_filter>,
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn ret(k: u32) -> libc::sock_filter {
    insn(RET, 0, 0, k)
}

fn offset(n: usize) -> u8 {
    u8::try_from(n).expect("short BPF jump fits in a u8")
}

fn single(nr: libc::c_long, code: Vec<libc::sock_filter>) -> Range {
    let nr = nr as u32;
    Range {
        lo: nr,
        hi: nr,
        code,
    }
}

/// Returns `matched` if argument `arg` (low 32 bits) is one of `values`, else `other`.
fn on_arg(arg: u32, values: &[u32], matched: u32, other: u32) -> Vec<libc::sock_filter> {
    let mut code = vec![insn(LD_ABS, 0, 0, arg_low(arg))];
    for (i, &value) in values.iter().enumerate() {
        // A match skips the remaining tests and the `other` return.
        code.push(insn(JEQ, offset(values.len() - i), 0, value));
    }
    code.extend([ret(other), ret(matched)]);
    code
}

/// Binary search over `ranges` (sorted, disjoint), laid out as the module docs say.
fn search(ranges: &[Range]) -> Vec<libc::sock_filter> {
    if ranges.is_empty() {
        return vec![ret(RET_EPERM)];
    }
    let mid = ranges.len() / 2;
    let Range { lo, hi, code } = &ranges[mid];
    let below = search(&ranges[..mid]);
    let above = search(&ranges[mid + 1..]);
    // From just after the JGT (or the JA) to the upper half.
    let to_above = code.len() + below.len();
    let mut out = Vec::with_capacity(3 + to_above + above.len());
    match u8::try_from(to_above) {
        Ok(jt) => {
            out.push(insn(JGE, 0, offset(1 + code.len()), *lo));
            out.push(insn(JGT, jt, 0, *hi));
        }
        Err(_) => {
            out.push(insn(JGE, 0, offset(2 + code.len()), *lo));
            out.push(insn(JGT, 0, 1, *hi));
            out.push(insn(JA, 0, 0, to_above as u32));
        }
    }
    out.extend_from_slice(code);
    out.extend(below);
    out.extend(above);
    out
}

impl Filter {
    /// Docker-default-like allowlist for x86_64.
    pub fn docker_default() -> Filter {
        let allow = || vec![ret(RET_ALLOW)];
        let mut ranges: Vec<Range> = ALLOWED
            .iter()
            .map(|&(lo, hi)| Range {
                lo,
                hi,
                code: allow(),
            })
            .collect();
        ranges.extend([
            single(
                libc::SYS_clone,
                vec![
                    insn(LD_ABS, 0, 0, arg_low(0)),
                    insn(JSET, 0, 1, CLONE_NAMESPACES),
                    ret(RET_EPERM),
                    ret(RET_ALLOW),
                ],
            ),
            // No namespace check is possible on clone3's flags (they sit in memory), so
            // it answers ENOSYS, as in Docker: libcs then fall back to clone.
            single(libc::SYS_clone3, vec![ret(RET_ENOSYS)]),
            single(
                libc::SYS_ioctl,
                on_arg(1, &TTY_INJECTION, RET_EPERM, RET_ALLOW),
            ),
            single(
                libc::SYS_personality,
                on_arg(0, &PERSONALITIES, RET_ALLOW, RET_EPERM),
            ),
            single(
                libc::SYS_socket,
                on_arg(0, &SOCKET_FAMILIES_REFUSED, RET_EPERM, RET_ALLOW),
            ),
            Range {
                lo: NEWEST_KNOWN + 1,
                hi: X32_SYSCALL_BIT - 1,
                code: vec![ret(RET_ENOSYS)],
            },
        ]);
        ranges.sort_by_key(|r| r.lo);
        assert!(
            ranges.windows(2).all(|w| w[0].hi < w[1].lo),
            "seccomp ranges overlap"
        );
        let mut program = vec![
            insn(LD_ABS, 0, 0, ARCH),
            insn(JEQ, 1, 0, AUDIT_ARCH_X86_64),
            ret(RET_KILL_PROCESS),
            insn(LD_ABS, 0, 0, NR),
            insn(JGE, 0, 1, X32_SYSCALL_BIT),
            ret(RET_EPERM),
        ];
        program.extend(search(&ranges));
        // The kernel's limit; it also makes the u16 length the kernel takes exact.
        assert!(program.len() <= libc::BPF_MAXINSNS as usize);
        Filter { program }
    }

    /// The program as the kernel reads it: 8 bytes per instruction (code u16, jt u8,
    /// jf u8, k u32, native endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.program.len() * 8);
        for i in &self.program {
            out.extend_from_slice(&i.code.to_ne_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_ne_bytes());
        }
        out
    }

    /// The program, for the sandbox entry to install.
    pub(crate) fn instructions(&self) -> &[libc::sock_filter] {
        &self.program
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    const AUDIT_ARCH_I386: u32 = 0x4000_0003;

    /// Every jump lands inside the program, and the program ends in a return.
    fn assert_jumps_in_bounds(p: &[libc::sock_filter]) {
        for (i, ins) in p.iter().enumerate() {
            let targets = match ins.code {
                JA => vec![ins.k as usize],
                JEQ | JGT | JGE | JSET => vec![ins.jt as usize, ins.jf as usize],
                LD_ABS | RET => vec![],
                code => panic!("unexpected opcode {code:#x} at {i}"),
            };
            for t in targets {
                assert!(i + 1 + t < p.len(), "jump out of bounds at {i}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(RET));
    }

    /// Runs `p` the way the kernel would, for the opcodes this module emits; returns
    /// the action and how many instructions ran.
    fn run(p: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; std::mem::size_of::<libc::seccomp_data>()];
        data[NR as usize..][..4].copy_from_slice(&nr.to_ne_bytes());
        data[ARCH as usize..][..4].copy_from_slice(&arch.to_ne_bytes());
        for (i, arg) in (0..).zip(args) {
            data[arg_low(i) as usize..][..8].copy_from_slice(&arg.to_ne_bytes());
        }
        let (mut pc, mut acc, mut steps) = (0, 0u32, 0);
        loop {
            let ins = p[pc];
            pc += 1;
            steps += 1;
            let taken = match ins.code {
                LD_ABS => {
                    let k = ins.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                    continue;
                }
                JA => {
                    pc += ins.k as usize;
                    continue;
                }
                RET => return (ins.k, steps),
                JEQ => acc == ins.k,
                JGT => acc > ins.k,
                JGE => acc >= ins.k,
                JSET => acc & ins.k != 0,
                code => panic!("unexpected opcode {code:#x}"),
            };
            pc += usize::from(if taken { ins.jt } else { ins.jf });
        }
    }

    fn decide(nr: libc::c_long, args: [u64; 6]) -> u32 {
        let p = Filter::docker_default().program;
        run(&p, AUDIT_ARCH_X86_64, nr as u32, args).0
    }

    #[test]
    fn program_is_small_balanced_and_in_bounds() {
        let p = Filter::docker_default().program;
        assert_jumps_in_bounds(&p);
        // Header, 41 tree nodes with their code, 42 EPERM leaves.
        assert_eq!(p.len(), 189);
        // Balanced: 6 header instructions, 2 per level for 6 levels, then the longest
        // range code (personality's 7) or an EPERM leaf.
        let longest = (0..=NEWEST_KNOWN + 1)
            .map(|nr| run(&p, AUDIT_ARCH_X86_64, nr, [0; 6]).1)
            .max();
        assert!(longest <= Some(6 + 2 * 6 + 7), "longest path {longest:?}");
    }

    #[test]
    fn every_number_gets_the_table_decision() {
        let p = Filter::docker_default().program;
        let special = [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
        ]
        .map(|n| n as u32);
        let numbers =
            (0..2000).chain([0x3fff_ffff, X32_SYSCALL_BIT, X32_SYSCALL_BIT | 39, u32::MAX]);
        for nr in numbers {
            let expected = if nr >= X32_SYSCALL_BIT {
                RET_EPERM
            } else if ALLOWED.iter().any(|&(lo, hi)| (lo..=hi).contains(&nr)) {
                RET_ALLOW
            } else if special.contains(&nr) {
                continue; // argument-dependent, checked below
            } else if nr > NEWEST_KNOWN {
                RET_ENOSYS
            } else {
                RET_EPERM
            };
            assert_eq!(
                run(&p, AUDIT_ARCH_X86_64, nr, [0; 6]).0,
                expected,
                "syscall {nr}"
            );
            assert_eq!(run(&p, AUDIT_ARCH_I386, nr, [0; 6]).0, RET_KILL_PROCESS);
        }
    }

    #[test]
    fn argument_checks() {
        let namespaces = [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWCGROUP,
        ];
        for flag in namespaces {
            let flags = (flag | libc::SIGCHLD) as u64;
            assert_eq!(decide(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), RET_EPERM);
        }
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        let tiocsti = libc::TIOCSTI as u64;
        // (syscall, argument, its value, verdict)
        let cases: &[(libc::c_long, usize, u64, u32)] = &[
            (libc::SYS_clone, 0, libc::SIGCHLD as u64, RET_ALLOW),
            (libc::SYS_clone, 0, thread, RET_ALLOW),
            (libc::SYS_clone3, 1, 88, RET_ENOSYS),
            (libc::SYS_ioctl, 1, tiocsti, RET_EPERM),
            (libc::SYS_ioctl, 1, 1 << 32 | tiocsti, RET_EPERM),
            (libc::SYS_ioctl, 1, libc::TIOCLINUX as u64, RET_EPERM),
            (libc::SYS_ioctl, 1, libc::TIOCGWINSZ as u64, RET_ALLOW),
            (libc::SYS_ioctl, 1, libc::FIONREAD as u64, RET_ALLOW),
            (libc::SYS_personality, 0, 0xffff_ffff, RET_ALLOW),
            (libc::SYS_personality, 0, 0x2_0008, RET_ALLOW),
            (libc::SYS_personality, 0, 0x40_0000, RET_EPERM),
            (libc::SYS_socket, 0, libc::AF_INET as u64, RET_ALLOW),
            (libc::SYS_socket, 0, libc::AF_NETLINK as u64, RET_ALLOW),
            (libc::SYS_socket, 0, 39, RET_ALLOW),
            (libc::SYS_socket, 0, 38, RET_EPERM),
            (libc::SYS_socket, 0, 40, RET_EPERM),
            (libc::SYS_socket, 0, 1 << 32 | 40, RET_EPERM),
        ];
        for &(nr, i, value, expected) in cases {
            let mut args = [0; 6];
            args[i] = value;
            let verdict = decide(nr, args);
            assert_eq!(verdict, expected, "syscall {nr} with arg {i} = {value:#x}");
        }
    }

    #[test]
    fn privileged_and_escape_calls_are_refused() {
        let refused = [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_setns,
            libc::SYS_unshare,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_kcmp,
            libc::SYS_pidfd_getfd,
            libc::SYS_process_madvise,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_reboot,
            libc::SYS_swapon,
            libc::SYS_swapoff,
            libc::SYS_acct,
            libc::SYS_settimeofday,
            libc::SYS_clock_settime,
            libc::SYS_clock_adjtime,
            libc::SYS_sethostname,
            libc::SYS_setdomainname,
            libc::SYS_iopl,
            libc::SYS_ioperm,
            libc::SYS_quotactl,
            libc::SYS_quotactl_fd,
            libc::SYS_lookup_dcookie,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_userfaultfd,
            libc::SYS_open_by_handle_at,
            libc::SYS_name_to_handle_at,
            libc::SYS_fanotify_init,
            libc::SYS_syslog,
            libc::SYS_mbind,
            libc::SYS_set_mempolicy,
            libc::SYS_get_mempolicy,
            libc::SYS_set_mempolicy_home_node,
            libc::SYS_move_pages,
            libc::SYS_migrate_pages,
            libc::SYS_vhangup,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_move_mount,
            libc::SYS_open_tree,
            libc::SYS_mount_setattr,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_uselib,
            libc::SYS_ustat,
            libc::SYS_sysfs,
            459, // lsm_get_self_attr
            460, // lsm_set_self_attr
            461, // lsm_list_modules
        ];
        for nr in refused {
            assert_eq!(decide(nr, [0; 6]), RET_EPERM, "syscall {nr}");
        }
    }

    #[test]
    fn ordinary_and_recent_calls_are_allowed() {
        let allowed = [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_wait4,
            libc::SYS_futex,
            libc::SYS_epoll_create1,
            libc::SYS_epoll_pwait2,
            libc::SYS_io_setup,
            libc::SYS_io_pgetevents,
            libc::SYS_memfd_create,
            libc::SYS_memfd_secret,
            libc::SYS_pidfd_open,
            libc::SYS_pidfd_send_signal,
            libc::SYS_close_range,
            libc::SYS_rseq,
            libc::SYS_statx,
            libc::SYS_faccessat2,
            libc::SYS_openat2,
            libc::SYS_landlock_create_ruleset,
            libc::SYS_landlock_add_rule,
            libc::SYS_landlock_restrict_self,
            libc::SYS_process_mrelease,
            libc::SYS_futex_waitv,
            libc::SYS_fchmodat2,
            libc::SYS_mseal,
            libc::SYS_seccomp,
            libc::SYS_prctl,
            libc::SYS_arch_prctl,
            libc::SYS_adjtimex,
            libc::SYS_bind,
            libc::SYS_socketpair,
            libc::SYS_sendmmsg,
            451, // cachestat
            453, // map_shadow_stack
            454, // futex_wake
            455, // futex_wait
            456, // futex_requeue
            457, // statmount
            458, // listmount
            464, // getxattrat
        ];
        for nr in allowed {
            assert_eq!(decide(nr, [0; 6]), RET_ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn far_upper_halves_go_through_ja() {
        // 300 single-number ranges: the root's lower half is far past 255 instructions.
        let ranges: Vec<Range> = (0..300)
            .map(|i| Range {
                lo: 2 * i,
                hi: 2 * i,
                code: vec![ret(RET_ALLOW)],
            })
            .collect();
        let mut p = vec![insn(LD_ABS, 0, 0, NR)];
        p.extend(search(&ranges));
        assert!(p.iter().any(|i| i.code == JA));
        assert_jumps_in_bounds(&p);
        for nr in 0..700 {
            let expected = if nr % 2 == 0 && nr < 600 {
                RET_ALLOW
            } else {
                RET_EPERM
            };
            assert_eq!(run(&p, 0, nr, [0; 6]).0, expected, "number {nr}");
        }
    }

    /// Installs `filter` on the calling thread, as the sandbox entry does.
    /// Async-signal-safe: no allocation, no locks.
    fn apply(filter: &Filter) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: filter.program.len() as u16,
            // The kernel only reads through this pointer.
            filter: filter.program.as_ptr().cast_mut(),
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

    /// Forks a child that, under `filter` if given, exits with `body`'s result; returns
    /// its wait status. The test harness is multithreaded, so the child makes plain
    /// syscalls only: no allocation, no locks.
    fn in_child(filter: Option<&Filter>, body: impl Fn() -> i32) -> libc::c_int {
        // SAFETY: the child only makes syscalls and exits.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
            if pid == 0 {
                // A KILL_PROCESS verdict must not leave a core file behind.
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
                if let Some(filter) = filter {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                        || apply(filter).is_err()
                    {
                        libc::_exit(100);
                    }
                }
                libc::_exit(body());
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            status
        }
    }

    type Check = (&'static str, fn() -> bool);

    /// Runs `checks` in one child under the filter; panics naming the first that fails.
    fn hold_under_filter(checks: &[Check]) {
        let filter = Filter::docker_default();
        let status = in_child(Some(&filter), || {
            (1..)
                .zip(checks)
                .find(|(_, (_, check))| !check())
                .map_or(0, |(i, _)| i)
        });
        assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
        match libc::WEXITSTATUS(status) {
            0 => {}
            100 => panic!("installing the filter failed"),
            n => panic!(
                "under the filter: {} did not hold",
                checks[n as usize - 1].0
            ),
        }
    }

    fn errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// The call returned -1 with `expected` in errno.
    fn fails_with(r: impl Into<i64>, expected: i32) -> bool {
        r.into() == -1 && errno() == expected
    }

    /// `r` is a fork-like return: the new child exits 0 at once, the parent reaps it.
    fn forked_and_reaped(r: libc::c_long) -> bool {
        // SAFETY: in the new child only _exit runs.
        unsafe {
            if r == 0 {
                libc::_exit(0);
            }
            let mut status = 0;
            r > 0
                && libc::waitpid(r as libc::pid_t, &mut status, 0) == r as libc::pid_t
                && libc::WIFEXITED(status)
                && libc::WEXITSTATUS(status) == 0
        }
    }

    // The kernel checks below use arguments that fail harmlessly should the filter let
    // the call through (a missing path, a bad fd or pid), so a broken filter shows up as
    // the wrong errno, never as a mount, a ptrace attach or typed terminal input.

    #[test]
    fn kernel_runs_ordinary_calls() {
        hold_under_filter(&[
            ("getpid", || unsafe { libc::getpid() > 0 }),
            ("fork", || unsafe {
                forked_and_reaped(libc::syscall(libc::SYS_fork))
            }),
            ("clone without namespace flags", || unsafe {
                forked_and_reaped(libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0))
            }),
            ("personality(0xffffffff)", || unsafe {
                libc::personality(0xffff_ffff) >= 0
            }),
            ("ioctl(FIONREAD) on a pipe", || unsafe {
                let mut fds = [0; 2];
                let mut n: libc::c_int = -1;
                libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) == 0
                    && libc::ioctl(fds[0], libc::FIONREAD, &mut n) == 0
                    && n == 0
            }),
            ("socket(AF_NETLINK)", || unsafe {
                let fd = libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                );
                fd >= 0 && libc::close(fd) == 0
            }),
            ("socket(AF_INET)", || unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                fd >= 0 && libc::close(fd) == 0
            }),
            ("execve reaches the kernel", || unsafe {
                let argv = [c"x".as_ptr(), std::ptr::null()];
                let r = libc::execve(
                    c"/nonexistent-skiff".as_ptr(),
                    argv.as_ptr(),
                    argv[1..].as_ptr(),
                );
                fails_with(r, libc::ENOENT)
            }),
        ]);
    }

    #[test]
    fn kernel_refuses_privileged_calls() {
        hold_under_filter(&[
            ("mount", || unsafe {
                let r = libc::mount(
                    c"none".as_ptr(),
                    c"/nonexistent-skiff".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                );
                fails_with(r, libc::EPERM)
            }),
            ("umount2", || unsafe {
                fails_with(
                    libc::umount2(c"/nonexistent-skiff".as_ptr(), 0),
                    libc::EPERM,
                )
            }),
            ("unshare(CLONE_NEWNS)", || unsafe {
                fails_with(libc::unshare(libc::CLONE_NEWNS), libc::EPERM)
            }),
            ("setns", || unsafe {
                fails_with(libc::setns(-1, 0), libc::EPERM)
            }),
            ("ptrace", || unsafe {
                let r = libc::syscall(libc::SYS_ptrace, libc::PTRACE_ATTACH, 0, 0, 0);
                fails_with(r, libc::EPERM)
            }),
            ("init_module", || unsafe {
                let r = libc::syscall(libc::SYS_init_module, 0, 0, c"".as_ptr());
                fails_with(r, libc::EPERM)
            }),
            ("keyctl", || unsafe {
                let r = libc::syscall(libc::SYS_keyctl, 0, -3, 0);
                fails_with(r, libc::EPERM)
            }),
            ("bpf", || unsafe {
                fails_with(libc::syscall(libc::SYS_bpf, -1, 0, 0), libc::EPERM)
            }),
            ("io_uring_setup", || unsafe {
                fails_with(libc::syscall(libc::SYS_io_uring_setup, 1, 0), libc::EPERM)
            }),
            ("clone(CLONE_NEWUSER)", || unsafe {
                let flags = libc::CLONE_NEWUSER | libc::SIGCHLD;
                let r = libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0);
                if r == 0 {
                    libc::_exit(0);
                }
                fails_with(r, libc::EPERM)
            }),
            ("ioctl(TIOCSTI)", || unsafe {
                fails_with(libc::ioctl(-1, libc::TIOCSTI, c"x".as_ptr()), libc::EPERM)
            }),
            ("ioctl(TIOCSTI) with high bits set", || unsafe {
                let request = 1u64 << 32 | libc::TIOCSTI as u64;
                let r = libc::syscall(libc::SYS_ioctl, -1, request, c"x".as_ptr());
                fails_with(r, libc::EPERM)
            }),
            ("ioctl(TIOCLINUX)", || unsafe {
                fails_with(libc::ioctl(-1, libc::TIOCLINUX, c"x".as_ptr()), libc::EPERM)
            }),
            ("personality(ADDR_NO_RANDOMIZE)", || unsafe {
                fails_with(libc::personality(0x40_0000), libc::EPERM)
            }),
            ("socket(AF_VSOCK)", || unsafe {
                fails_with(libc::socket(40, libc::SOCK_STREAM, 0), libc::EPERM)
            }),
            ("socket(AF_ALG)", || unsafe {
                fails_with(libc::socket(38, libc::SOCK_SEQPACKET, 0), libc::EPERM)
            }),
            ("x32 getpid", || unsafe {
                let nr = X32_SYSCALL_BIT as libc::c_long | libc::SYS_getpid;
                fails_with(libc::syscall(nr), libc::EPERM)
            }),
            ("clone3 answers ENOSYS", || unsafe {
                fails_with(libc::syscall(libc::SYS_clone3, 0, 0), libc::ENOSYS)
            }),
            ("an unknown number answers ENOSYS", || unsafe {
                fails_with(libc::syscall(1000), libc::ENOSYS)
            }),
        ]);
    }

    /// getpid through the i386 entry point: `seccomp_data.arch` is AUDIT_ARCH_I386.
    fn i386_getpid() -> i64 {
        let r: i64;
        // SAFETY: i386 getpid (20) takes no arguments and touches no memory; the
        // registers the compat entry may clobber are declared.
        unsafe {
            std::arch::asm!(
                "int 0x80",
                inlateout("rax") 20i64 => r,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack),
            );
        }
        r
    }

    #[test]
    fn kernel_kills_i386_calls() {
        // Without IA32 emulation `int 0x80` faults before seccomp sees it.
        let plain = in_child(None, || {
            i32::from(i386_getpid() != i64::from(unsafe { libc::getpid() }))
        });
        if !(libc::WIFEXITED(plain) && libc::WEXITSTATUS(plain) == 0) {
            eprintln!("no IA32 emulation in this kernel: nothing to check");
            return;
        }
        let filter = Filter::docker_default();
        let status = in_child(Some(&filter), || {
            i386_getpid();
            0
        });
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "status {status:#x}"
        );
    }
}

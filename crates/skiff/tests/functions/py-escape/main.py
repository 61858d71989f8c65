"""Escape attempts from inside an instance; each entry says what happened. The test
expects every one to fail (and the identity checks to show an unprivileged sandbox)."""
import ctypes
import errno
import os

libc = ctypes.CDLL(None, use_errno=True)


def attempt(result):
    """'refused: ERRNO' for a failed call, 'ESCAPED' when it succeeded."""
    if result < 0:
        return "refused: " + errno.errorcode.get(ctypes.get_errno(), "?")
    return "ESCAPED"


def try_os(fn):
    try:
        fn()
        return "ESCAPED"
    except OSError as e:
        return "refused: " + errno.errorcode.get(e.errno, "?")


def status_field(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return line.split()[1]


def kcore_bytes():
    """What /proc/kcore gives: nothing where it is masked (or the kernel has none)."""
    try:
        return len(open("/proc/kcore", "rb").read(16))
    except FileNotFoundError:
        return 0


def handle(event, context):
    target = int(context.query.split("=")[1]) if context.query.startswith("pid=") else 1
    return {
        "uid": os.getuid(),
        "pid": os.getpid(),
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "cap_eff": status_field("CapEff"),
        "cap_bnd": status_field("CapBnd"),
        "no_new_privs": status_field("NoNewPrivs"),
        "seccomp": status_field("Seccomp"),
        "mount": attempt(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None)),
        "unshare_mnt": attempt(libc.unshare(0x00020000)),
        "unshare_user": attempt(libc.unshare(0x10000000)),
        "setuid_root": try_os(lambda: os.setuid(0)),
        "chroot": try_os(lambda: os.chroot("/tmp")),
        "write_root": try_os(lambda: open("/escape", "w")),
        "write_code": try_os(lambda: open("/code/escape", "w")),
        "mknod": try_os(lambda: os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0))),
        "kcore_bytes": kcore_bytes(),
        "sysrq": try_os(lambda: open("/proc/sysrq-trigger", "w").write("h")),
        "ptrace_target": attempt(libc.ptrace(16, target, None, None)),  # PTRACE_ATTACH
        "kill_target": try_os(lambda: os.kill(target, 0)),
        "host_data_dir": os.path.exists(context.headers.get("x-data-dir", "/nonexistent")),
    }

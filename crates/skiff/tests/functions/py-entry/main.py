"""The sandbox as an instance sees it, in the same words as node-entry's: the test
expects the same answer from every cold path and both runtimes."""
import errno
import os

STATUS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
          "NoNewPrivs", "Seccomp")
LIMITS = ("Max open files", "Max core file size")


def handle(event, context):
    status = dict(line.rstrip("\n").split(":", 1) for line in open("/proc/self/status"))
    limits = [" ".join(line.split()) for line in open("/proc/self/limits") if line.startswith(LIMITS)]
    mounts = []
    for line in open("/proc/self/mountinfo"):
        fields, _, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        # Mount point, its options, file system type, super block options.
        mounts.append(" ".join([fields[4], fields[5], tail[0], tail[2]]))
    try:
        open("/root-is-writable", "w")
        root = "writable"
    except OSError as e:
        root = errno.errorcode[e.errno]
    return {
        "status": {k: " ".join(status[k].split()) for k in STATUS},
        "limits": limits,
        "mounts": sorted(mounts),
        "root": root,
        "cwd": os.getcwd(),
    }

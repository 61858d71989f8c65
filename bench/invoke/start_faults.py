"""Page faults of template starts: for each of N cold starts of FUNCTION, the minor faults
of the spare that becomes the instance, counted in /proc/PID/stat while it waits (since its
fork) and from its plan to its first reply (the start's own). The spare is the daemon's
child running COMM that is not yet in a pool cgroup and is not the template (the oldest).
Prints one JSON line. Usage: start_faults.py PORT DAEMON_PID FUNCTION COMM LABEL N"""
import http.client
import json
import os
import sys
import time

port, daemon, function, comm, label, n = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                          sys.argv[4], sys.argv[5], int(sys.argv[6]))


def call(method, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=b"{}" if method == "POST" else None)
    r = c.getresponse()
    r.read()
    c.close()
    return r


def stat(pid):
    """(start time, minor faults) of pid, from /proc/PID/stat."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[19]), int(fields[7])


def spare():
    """The waiting spare of FUNCTION's runtime, or None."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = open(f"/proc/{entry}/status").read()
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            if fields["Name"].strip() != comm or int(fields["PPid"]) != daemon:
                continue
            kids.append((stat(entry)[0], int(entry), "skiff-" in open(f"/proc/{entry}/cgroup").read()))
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile
    kids.sort()
    waiting = [pid for _, pid, in_pool in kids[1:] if not in_pool]
    return waiting[0] if waiting else None


waiting, starting = [], []
call("POST", f"/fn/{function}")
# Two starts first: the template learns from its first instance, after that one's first
# reply, so the spare forked during that start has no lesson yet.
for i in range(n + 2):
    call("DELETE", f"/v1/functions/{function}/instances")
    time.sleep(0.3)  # the next spare has been forked and has populated its pages
    pid = spare()
    if pid is None:
        sys.exit(f"{label}: no waiting spare of {comm} under pid {daemon}")
    before = stat(pid)[1]
    r = call("POST", f"/fn/{function}")
    if r.status != 200 or r.getheader("x-skiff-cold-start") != "true":
        sys.exit(f"{label}: the start answered {r.status}, cold={r.getheader('x-skiff-cold-start')}")
    time.sleep(0.1)  # time to teach the template, when this instance is its first to answer
    if i >= 2:
        waiting.append(before)
        starting.append(stat(pid)[1] - before)
print(json.dumps({"label": label, "function": function, "waiting": waiting, "start": starting}))

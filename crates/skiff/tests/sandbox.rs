//! Behaviour of `skiff run` and friends against the real kernel (docs/cli.md): namespaces,
//! the filesystem, limits, escape attempts, stdio, exit codes and signals, zombies,
//! detached sandboxes, bad input, and cleaning up after a crash.
//!
//! Every test has its own data directory and so its own cgroup pool; `common::Data`
//! removes the pool at the end (`gc --pools`) and checks nothing is left.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{host_ns, pid_alive, processes, stderr, stdout, wait_gone, Data, ZOMBIE_MAKER};

fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
}

/// Asserts a run succeeded and returns its stdout.
fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

// ---------------------------------------------------------------------------------------
// Namespaces

#[test]
fn namespaces_are_new_and_network_follows_the_flag() {
    let data = Data::new("ns", 4);
    let script =
        "for n in pid mnt ipc uts cgroup net user; do echo $n $(readlink /proc/self/ns/$n); done";
    for (flags, net_shared) in [
        (&[][..], true),
        (&["--network", "host"][..], true),
        (&["--network", "none"][..], false),
    ] {
        let text = ok(&data.run(flags, &sh(script)), "namespaces");
        let seen: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
        for name in ["pid", "mnt", "ipc", "uts", "cgroup", "net", "user"] {
            let inside = seen.get(name).copied().unwrap_or_default();
            assert!(inside.starts_with(&format!("{name}:[")), "{name}: {text}");
            let shared = inside == host_ns(name);
            let expected = match name {
                "net" => net_shared,
                // Without --user-ns there is no user namespace.
                "user" => true,
                _ => false,
            };
            assert_eq!(
                shared,
                expected,
                "{name} namespace with {flags:?}: inside {inside}, host {}",
                host_ns(name)
            );
        }
    }
    // --network none: loopback only.
    let text = ok(
        &data.run(&["--network", "none"], &["/bin/ip", "-o", "link"]),
        "ip link",
    );
    let links: Vec<&str> = text
        .lines()
        .map(|l| l.split(':').nth(1).unwrap_or("").trim())
        .collect();
    assert_eq!(links, ["lo"], "{text}");
}

#[test]
fn user_namespace_maps_root_to_an_unprivileged_host_uid() {
    let data = Data::new("userns", 4);
    let text = ok(
        &data.run(
            &["--user-ns"],
            &sh("id -u; id -g; readlink /proc/self/ns/user"),
        ),
        "--user-ns",
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(&lines[..2], ["0", "0"], "root inside by default: {text}");
    assert_ne!(lines[2], host_ns("user"), "no new user namespace");

    // From the host, the same process is not root.
    let id = data.run_detached(&["--user-ns"], &["/bin/sleep", "30"]);
    let pid = data.pid_of(&id);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for key in ["Uid:", "Gid:"] {
        let ids: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(ids.len(), 4);
        assert!(
            ids.iter().all(|&i| i != 0),
            "root in the sandbox is host {key} {ids:?}"
        );
    }
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap(),
        std::fs::read_link("/proc/self/ns/user").unwrap()
    );
    let out = data.skiff(&["kill", &id]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
}

// ---------------------------------------------------------------------------------------
// PID 1, user, capabilities

/// The `Cap*`, `NoNewPrivs` and `Seccomp` lines `probe status` prints.
fn confinement(data: &Data, flags: &[&str]) -> BTreeMap<String, String> {
    let text = ok(&data.run(flags, &["/bin/probe", "status"]), "probe status");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_function_is_pid_1_and_unprivileged() {
    let data = Data::new("pid1", 4);
    let text = ok(&data.run(&[], &sh("echo $$; id -u; id -g")), "pid 1");
    assert_eq!(text, "1\n65534\n65534\n");
    let text = ok(
        &data.run(&["--user", "1234:4321"], &sh("id -u; id -g")),
        "--user",
    );
    assert_eq!(text, "1234\n4321\n");

    // No capability, not even for root inside; no way to gain one; a seccomp filter.
    for flags in [&[][..], &["--user", "0"][..]] {
        let status = confinement(&data, flags);
        for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status.get(key).map(String::as_str),
                Some("0000000000000000"),
                "{key} with {flags:?}: {status:?}"
            );
        }
        assert_eq!(status.get("NoNewPrivs").map(String::as_str), Some("1"));
        assert_eq!(
            status.get("Seccomp").map(String::as_str),
            Some("2"),
            "{flags:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Filesystem

#[test]
fn root_is_read_only_and_tmp_dev_are_usable() {
    let data = Data::new("fs", 4);
    let script = "touch /x 2>/dev/null && echo root-writable; \
                  echo hi > /tmp/f && cat /tmp/f; \
                  for d in null zero full random urandom tty; do \
                    test -c /dev/$d && echo $d; done; \
                  echo shm > /dev/shm/s && cat /dev/shm/s; \
                  dd if=/dev/zero bs=4 count=1 2>/dev/null | wc -c; \
                  dd if=/dev/urandom bs=4 count=1 2>/dev/null | wc -c; \
                  echo x 2>/dev/null > /dev/full || echo full-refuses; \
                  touch /dev/new 2>/dev/null && echo dev-writable; true";
    let expected = "hi\nnull\nzero\nfull\nrandom\nurandom\ntty\nshm\n4\n4\nfull-refuses\n";
    for flags in [&[][..], &["--user", "0"][..]] {
        let text = ok(&data.run(flags, &sh(script)), "fs");
        assert_eq!(text, expected, "{flags:?}");
    }
    // As root inside, / and /proc/sys stay read-only and /proc/kcore masked.
    let root = ["--user", "0"];
    assert_denied(&data, &root, &["write-root"], &["EROFS"]);
    assert_denied(&data, &root, &["proc-sys"], &["EROFS"]);
    assert_denied(
        &data,
        &root,
        &["kcore"],
        &["empty", "ENOENT", "EACCES", "EPERM"],
    );

    // Extra writable paths: --tmpfs and /work.
    let work = data.dir.join("work-a");
    std::fs::create_dir_all(&work).unwrap();
    let text = ok(
        &data.run(
            &[
                "--tmpfs",
                "/data",
                "--work",
                work.to_str().unwrap(),
                "--user",
                "0",
            ],
            &sh("echo a > /data/a && echo b > /work/b && cat /data/a /work/b"),
        ),
        "--tmpfs and --work",
    );
    assert_eq!(text, "a\nb\n");
    assert_eq!(std::fs::read_to_string(work.join("b")).unwrap(), "b\n");
    assert!(
        !common::rootfs().join("data/a").exists(),
        "--tmpfs wrote to the rootfs"
    );
}

// ---------------------------------------------------------------------------------------
// Limits

#[test]
fn a_memory_hog_is_oom_killed_in_its_own_cgroup() {
    let data = Data::new("oom", 4);
    let mut bystander = std::process::Command::new("/bin/busybox")
        .args(["sleep", "20"])
        .spawn()
        .unwrap();
    let out = data.run(&["--memory", "32M"], &["/bin/probe", "alloc", "200"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(137), "{err}{}", stdout(&out));
    assert!(
        !stdout(&out).contains("allocated"),
        "200 MB fit in 32M: {}",
        stdout(&out)
    );
    // docs/cli.md: `skiff: sandbox <id> killed: out of memory` (details may follow).
    assert!(
        err.lines().any(|l| l.starts_with("skiff: sandbox ")
            && l.split_once(" killed: out of memory")
                .is_some_and(|(head, _)| !head[15..].contains(' '))),
        "no `skiff: sandbox <id> killed: out of memory` line: {err}"
    );
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "a host process was harmed"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    // The host can still allocate what the sandbox could not.
    let host = std::process::Command::new(common::rootfs().join("bin/probe"))
        .args(["alloc", "200"])
        .output()
        .unwrap();
    assert_eq!(stdout(&host), "allocated 200 MB\n");
    // The same in a shell, the way a function would hit it.
    let out = data.run(
        &["--memory", "32M"],
        &sh("dd if=/dev/zero of=/dev/null bs=100M count=1"),
    );
    assert_eq!(out.status.code(), Some(137), "dd: {}", stderr(&out));
    assert!(stderr(&out).contains("out of memory"), "{}", stderr(&out));
    assert_eq!(data.slots_in_use(), 0);
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit() {
    let data = Data::new("pids", 4);
    // PID 1 starts a fork bomb whose processes keep trying, watches it for a second, tries
    // a fork of its own, and exits: that ends the whole namespace.
    let started = Instant::now();
    let out = data.run(&["--pids", "16"], &["/bin/probe", "forkbomb", "1000"]);
    let text = ok(&out, "fork bomb");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    let mut lines = text.lines();
    let max: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("max "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(max <= 16, "{max} processes with --pids 16");
    assert!(
        max >= 12,
        "the bomb never got near the limit: {max} processes"
    );
    assert_eq!(lines.next(), Some("fork: denied EAGAIN"), "{text}");
    assert_eq!(data.slots_in_use(), 0);
    assert_eq!(data.pool_processes(), Vec::<i32>::new(), "bomb survivors");
}

#[test]
fn a_cpu_hog_gets_only_its_quota() {
    let data = Data::new("cpu", 4);
    let text = ok(
        &data.run(&["--cpu", "0.2"], &["/bin/probe", "spin", "1000"]),
        "spin",
    );
    let cpu: f64 = text
        .trim()
        .strip_prefix("cpu ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(cpu <= 0.35, "used {cpu} CPU-seconds in 1 s with --cpu 0.2");
    assert!(cpu > 0.02, "barely ran: {cpu}");
}

// ---------------------------------------------------------------------------------------
// Escape attempts

/// Runs `probe ARGS` in a sandbox and asserts the attempt was denied, with one of
/// `errnos` (the errno names `probe` prints, or `empty` for a masked file).
fn assert_denied(data: &Data, flags: &[&str], args: &[&str], errnos: &[&str]) {
    let mut argv = vec!["/bin/probe"];
    argv.extend_from_slice(args);
    let out = data.run(flags, &argv);
    let text = stdout(&out);
    assert!(
        out.status.code() == Some(0) && !text.is_empty(),
        "{args:?} with {flags:?} escaped ({:?}): {text}{}",
        out.status,
        stderr(&out)
    );
    for line in text.lines() {
        let errno = line
            .rsplit_once(": denied ")
            .map(|(_, e)| e)
            .unwrap_or_else(|| panic!("{args:?} with {flags:?}: {line}"));
        assert!(
            errnos.contains(&errno),
            "{args:?} with {flags:?}: {line} (expected one of {errnos:?})"
        );
    }
}

#[test]
fn escape_attempts_fail() {
    let data = Data::new("escape", 4);
    // A second sandbox to attack, and the test process itself on the host.
    let other = data.run_detached(&[], &["/bin/sleep", "30"]);
    let other_pid = data.pid_of(&other).to_string();
    let me = std::process::id().to_string();
    let attempts: &[(&[&str], &[&str])] = &[
        (&["mount"], &["EPERM"]),
        (&["unshare-mnt"], &["EPERM"]),
        (&["unshare-user"], &["EPERM", "ENOSPC"]),
        (&["setns"], &["EPERM"]),
        (&["ptrace", &other_pid], &["ESRCH", "EPERM"]),
        (&["kill", &other_pid], &["ESRCH", "EPERM"]),
        (&["kill", &me], &["ESRCH", "EPERM"]),
        (&["kill", "-1"], &["ESRCH", "EPERM"]),
        (&["mknod"], &["EPERM"]),
        (&["module"], &["EPERM", "ENOSYS"]),
        (&["kcore"], &["empty", "ENOENT", "EACCES", "EPERM"]),
        (&["proc-sys"], &["EROFS", "EACCES"]),
        (&["write-root"], &["EROFS", "EACCES"]),
        (&["capset"], &["EPERM"]),
        (&["chroot"], &["EPERM"]),
    ];
    let users: [&[&str]; 3] = [&[], &["--user", "0"], &["--user-ns"]];
    for flags in users {
        for (args, errnos) in attempts {
            assert_denied(&data, flags, args, errnos);
        }
    }
    let listed = data.ps();
    assert!(
        listed.iter().any(|(i, _, s)| *i == other && s == "running"),
        "the other sandbox was harmed: {listed:?}"
    );
    let out = data.skiff(&["kill", &other]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
}

#[test]
fn tenants_cannot_reach_each_others_work() {
    let data = Data::new("tenants", 4);
    let (a, b) = (data.dir.join("tenant-a"), data.dir.join("tenant-b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // Tenant A writes its secret in its own /work.
    ok(
        &data.run(
            &["--user", "0", "--work", a.to_str().unwrap()],
            &sh("echo 'the secret of a' > /work/secret-of-a"),
        ),
        "tenant a",
    );
    assert_eq!(
        std::fs::read_to_string(a.join("secret-of-a")).unwrap(),
        "the secret of a\n"
    );
    // By name, and by content in every regular file outside /proc, /sys and /dev.
    let search = "find / -name 'secret-of-a' 2>/dev/null; \
                  find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f \
                    -exec grep -l 'the secret of a' {} + 2>/dev/null; \
                  true";
    // The search works: tenant A finds it in its own /work ...
    let text = ok(
        &data.run(&["--user", "0", "--work", a.to_str().unwrap()], &sh(search)),
        "search in a",
    );
    assert_eq!(text, "/work/secret-of-a\n/work/secret-of-a\n");
    // ... tenant B, root inside, with another /work, does not.
    let text = ok(
        &data.run(&["--user", "0", "--work", b.to_str().unwrap()], &sh(search)),
        "search in b",
    );
    assert_eq!(text, "", "tenant b found tenant a's secret");
}

// ---------------------------------------------------------------------------------------
// stdio, exit status, signals

#[test]
fn output_and_exit_codes_pass_through() {
    let data = Data::new("exit", 4);
    let out = data.run(&[], &sh("echo out; echo err >&2; exit 7"));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stdout(&out), "out\n");
    assert_eq!(stderr(&out), "err\n");
    // stdin too.
    let mut child = data
        .cmd()
        .args(["run", "--rootfs"])
        .arg(common::rootfs())
        .args(["--", "/bin/cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"through stdin\n").unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "through stdin\n");
    assert!(out.status.success());
    // Killed by a signal from outside: 128 + the signal, as shells report it.
    let mut child = data.start_until_ready("echo ready; exec sleep 30");
    let pid = data.wait_for_one_sandbox();
    // SAFETY: signalling the sandbox this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(child.wait().unwrap().code(), Some(137));
}

#[test]
fn signals_are_forwarded() {
    let data = Data::new("signals", 4);
    let mut child =
        data.start_until_ready("trap 'exit 42' TERM; echo ready; while true; do sleep 0.1; done");
    // SAFETY: signalling our own child, the skiff CLI.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(42), "{status:?}");
    assert_eq!(data.slots_in_use(), 0);
}

// ---------------------------------------------------------------------------------------
// Zombies

/// (pid, ppid, comm) of the host's zombies.
fn zombies() -> BTreeSet<(i32, i32, String)> {
    processes()
        .into_iter()
        .filter(|p| p.state == 'Z')
        .map(|p| (p.pid, p.ppid, p.comm))
        .collect()
}

#[test]
fn zombies_and_orphans_do_not_outlive_the_sandbox() {
    let data = Data::new("zombies", 4);
    let before = zombies();
    // Five children exit unwaited (zombies), a grandchild outlives its parent (an orphan
    // sleeping 60 s), and PID 1 exits without waiting for any of them.
    let maker = format!("/bin/{ZOMBIE_MAKER}");
    let text = ok(&data.run(&[], &[&maker, "zombies", "5"]), "zombies");
    assert_eq!(text, "zombies 5\n");
    let left: Vec<_> = processes()
        .into_iter()
        .filter(|p| p.comm == ZOMBIE_MAKER)
        .collect();
    assert!(left.is_empty(), "left on the host: {left:?}");
    // Nor a zombie of the sandbox's or skiff's left to the host's init. (Other names are
    // not checked: the init of a detached sandbox another test killed is, as it should
    // be, a zombie of the host's init until that reaps it.)
    let pids: BTreeSet<i32> = processes().iter().map(|p| p.pid).collect();
    let orphaned: Vec<_> = zombies()
        .difference(&before)
        .filter(|(_, ppid, comm)| {
            (*ppid <= 1 || !pids.contains(ppid)) && [ZOMBIE_MAKER, "skiff"].contains(&comm.as_str())
        })
        .cloned()
        .collect();
    assert!(
        orphaned.is_empty(),
        "new zombies nobody reaps: {orphaned:?}"
    );
    assert_eq!(data.pool_processes(), Vec::<i32>::new());
    assert_eq!(data.skiff_processes(), Vec::new());
    assert_eq!(data.slots_in_use(), 0);
}

// ---------------------------------------------------------------------------------------
// Detached sandboxes

#[test]
fn detached_sandboxes_are_listed_and_killed() {
    let data = Data::new("detach", 4);
    let out = data.run(&["-d"], &sh("echo started; exec sleep 30"));
    let text = ok(&out, "run -d");
    let id = text.trim().to_owned();
    assert_eq!(text, format!("{id}\n"), "run -d prints just the id");
    assert!(
        !id.is_empty() && !id.contains(char::is_whitespace),
        "{text:?}"
    );
    let pid = data.pid_of(&id);
    assert!(pid_alive(pid));
    let listed = data.ps();
    assert_eq!(listed, [(id.clone(), pid, "running".to_owned())]);
    // The table lists it too, with its pid and status.
    let table = stdout(&data.skiff(&["ps"]));
    assert!(
        table.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&id.as_str())
                && cols.get(1) == Some(&pid.to_string().as_str())
                && cols.get(2) == Some(&"running")
        }),
        "{table}"
    );
    assert_eq!(data.slots_in_use(), 1);
    // Its output goes to DATA/logs/<id>.log.
    let log = data.dir.join("logs").join(format!("{id}.log"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&log).unwrap_or_default() != "started\n" {
        assert!(
            Instant::now() < deadline,
            "{} never said started",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let out = data.skiff(&["kill", &id]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    assert!(!pid_alive(pid), "kill returned before the sandbox ended");
    assert!(
        data.ps().iter().all(|(i, _, s)| *i != id || s != "running"),
        "{:?}",
        data.ps()
    );
    assert_eq!(data.slots_in_use(), 0);
    assert_eq!(data.pool_processes(), Vec::<i32>::new());
    // The slot is free again: a pool of one can run once more.
    let out = data.skiff(&["pool", "--size", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    ok(&data.run(&[], &["/bin/true"]), "run after kill");

    // An unknown id is an error.
    let out = data.skiff(&["kill", &id]);
    assert_one_line_error(&out, 125, &id);
}

// ---------------------------------------------------------------------------------------
// Bad input

fn assert_one_line_error(out: &Output, code: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("skiff: error: "), "{err}");
    assert!(err.contains(needle), "{err} does not mention {needle:?}");
    assert_eq!(stdout(out), "", "stdout: {}", stdout(out));
}

/// After a failed run: no slot claimed, no record, no process in the pool, no skiff
/// process left, no new mount of the data directory and none of the rootfs.
fn assert_nothing_left(data: &Data, mounts_before: &[String], case: &str) {
    assert_eq!(data.slots_in_use(), 0, "{case}: slot claimed");
    assert_eq!(data.ps(), Vec::new(), "{case}: record left");
    assert_eq!(
        data.pool_processes(),
        Vec::<i32>::new(),
        "{case}: process in the pool"
    );
    assert_eq!(
        data.skiff_processes(),
        Vec::new(),
        "{case}: skiff process left"
    );
    assert_eq!(data.mounts(), mounts_before, "{case}: mounts changed");
    let rootfs_mounts = common::mountinfo_lines_naming(common::rootfs());
    assert_eq!(
        rootfs_mounts,
        Vec::<String>::new(),
        "{case}: rootfs mounted"
    );
}

#[test]
fn bad_input_gets_one_clear_line_and_leaves_nothing() {
    let data = Data::new("badinput", 1);
    // Whatever skiff keeps mounted between runs (its run directory) is there from now on.
    ok(&data.run(&[], &["/bin/true"]), "a good run");
    let mounts = data.mounts();

    let empty = data.dir.join("empty-rootfs");
    std::fs::create_dir_all(&empty).unwrap();
    let rootfs_cases = [
        ("/nonexistent-rootfs", "/nonexistent-rootfs"),
        (empty.to_str().unwrap(), empty.to_str().unwrap()),
    ];
    for (rootfs, needle) in rootfs_cases {
        let out = data
            .cmd()
            .args(["run", "--rootfs", rootfs, "--", "/bin/true"])
            .output()
            .unwrap();
        assert_one_line_error(&out, 125, needle);
        assert_nothing_left(&data, &mounts, rootfs);
    }
    let cases: &[(&[&str], &[&str], i32, &str)] = &[
        (&[], &["/bin/nope"], 127, "/bin/nope"),
        (&[], &["nope"], 127, "nope"),
        (&[], &["/bin/not-executable"], 126, "/bin/not-executable"),
        (&["--memory", "0"], &["/bin/true"], 125, "--memory"),
        (&["--memory", "lots"], &["/bin/true"], 125, "--memory"),
        (&["--cpu", "1000"], &["/bin/true"], 125, "--cpu"),
        (&["--cpu", "0"], &["/bin/true"], 125, "--cpu"),
        (&["--pids", "0"], &["/bin/true"], 125, "--pids"),
        (&["--pids", "65537"], &["/bin/true"], 125, "--pids"),
    ];
    for (flags, argv, code, needle) in cases {
        let out = data.run(flags, argv);
        assert_one_line_error(&out, *code, needle);
        assert_nothing_left(&data, &mounts, &format!("{flags:?} {argv:?}"));
    }

    // The pool (of one) is exhausted while a detached sandbox holds its slot.
    let holder = data.run_detached(&[], &["/bin/sleep", "30"]);
    let out = data.run(&[], &["/bin/true"]);
    assert_one_line_error(&out, 125, "pool");
    assert_eq!(
        data.slots_in_use(),
        1,
        "the failed run touched the holder's slot"
    );
    assert_eq!(data.ps().len(), 1);
    let out = data.skiff(&["kill", &holder]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    assert_nothing_left(&data, &mounts, "exhausted pool");
    ok(&data.run(&[], &["/bin/true"]), "run after the holder ended");
    assert_nothing_left(&data, &mounts, "after the pool was free again");
}

#[test]
fn usage_errors_get_one_line_too() {
    // docs/cli.md: skiff's own errors are one line `skiff: error: ...` and exit 125
    // (as docker run's); a flag value skiff cannot parse, or an unknown flag, is one.
    let data = Data::new("usage", 1);
    let mounts = data.mounts();
    let cases: &[&[&str]] = &[
        &["--network", "bridge"],
        &["--pids", "abc"],
        &["--cpu", "half"],
        &["--no-such-flag"],
    ];
    let mut wrong = Vec::new();
    for flags in cases {
        let out = data.run(flags, &["/bin/true"]);
        let err = stderr(&out);
        if out.status.code() != Some(125)
            || err.lines().count() != 1
            || !err.starts_with("skiff: error: ")
        {
            wrong.push(format!("{flags:?}: {:?}, stderr {err:?}", out.status));
        }
        assert_nothing_left(&data, &mounts, &format!("{flags:?}"));
    }
    assert!(
        wrong.is_empty(),
        "not one `skiff: error:` line and exit 125:\n{}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// A crashed skiff, and gc

#[test]
fn gc_cleans_up_after_a_crashed_skiff() {
    let data = Data::new("gc", 4);
    let pool_name = data.pool_name();
    let mut cli = data.start_until_ready("echo ready; exec sleep 30");
    let pid = data.wait_for_one_sandbox();
    let (id, _, _) = data.ps().remove(0);
    // SIGKILL the skiff CLI, not the sandbox.
    cli.kill().unwrap();
    assert_eq!(cli.wait().unwrap().signal(), Some(libc::SIGKILL));
    // The sandbox dies with its skiff (parent-death signal).
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "sandbox {pid} outlived skiff"
    );
    assert_eq!(
        data.slots_in_use(),
        1,
        "the crashed skiff's claim should still be there for gc to find"
    );
    assert_eq!(data.ps(), [(id.clone(), pid, "exited".to_owned())]);

    let out = data.skiff(&["gc"]);
    let text = ok(&out, "gc");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() >= 2,
        "one line per removed item and a summary: {text}"
    );
    assert!(
        lines[..lines.len() - 1].iter().any(|l| l.contains(&id)),
        "gc does not report sandbox {id}: {text}"
    );
    assert_eq!(data.slots_in_use(), 0);
    assert_eq!(data.ps(), Vec::new());
    assert_eq!(data.pool_processes(), Vec::<i32>::new());
    // Nothing more to do.
    let again = ok(&data.skiff(&["gc"]), "gc again");
    assert_eq!(again.lines().count(), 1, "{again}");

    // gc --pools leaves nothing of this data directory's pool in any hierarchy, and none
    // of its mounts.
    let out = data.skiff(&["gc", "--pools"]);
    ok(&out, "gc --pools");
    assert_eq!(
        common::cgroup_dirs_named(&pool_name),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(data.mounts(), Vec::<String>::new());
}

//! Behaviour of `skiff run` and friends against the real kernel: namespaces, the
//! filesystem, limits, escape attempts, exit codes and signals, and cleaning up.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{host_ns, stderr, stdout, Data};

fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
}

#[test]
fn namespaces_are_new_and_network_follows_the_flag() {
    let data = Data::new("ns", 4);
    let script =
        "for n in pid mnt ipc uts cgroup net user; do echo $n $(readlink /proc/self/ns/$n); done";
    for (flags, net_shared) in [(&[][..], true), (&["--network", "none"][..], false)] {
        let out = data.run(flags, &sh(script));
        assert!(out.status.success(), "{}", stderr(&out));
        for line in stdout(&out).lines() {
            let (name, inside) = line.split_once(' ').unwrap();
            let shared = inside == host_ns(name);
            let expected = match name {
                "net" => net_shared,
                "user" => true,
                _ => false,
            };
            assert_eq!(
                shared, expected,
                "{name} namespace with {flags:?}: {inside}"
            );
        }
    }
    let out = data.run(&["--network", "none"], &["/bin/ip", "-o", "link"]);
    let links: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(links.len(), 1, "{links:?}");
    assert!(links[0].contains(": lo:"), "{links:?}");
}

#[test]
fn user_namespace_maps_root_to_an_unprivileged_host_uid() {
    let data = Data::new("userns", 4);
    let out = data.run(&["--user-ns"], &sh("id -u; readlink /proc/self/ns/user"));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"), "{}", stderr(&out));
    assert_ne!(lines.next().unwrap(), host_ns("user"));

    let id = data.run_detached(&["--user-ns"], &["/bin/sleep", "30"]);
    let (_, pid, _) = data.ps().into_iter().find(|(i, _, _)| *i == id).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let host_uid: u32 = uid_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(host_uid >= 100_000, "root inside is host uid {host_uid}");
    assert!(data.skiff(&["kill", &id]).status.success());
}

#[test]
fn the_function_is_pid_1_unprivileged_and_confined() {
    let data = Data::new("pid1", 4);
    let out = data.run(
        &[],
        &sh("echo $$; id -u; id -g; grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status"),
    );
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(&lines[..3], ["1", "65534", "65534"], "{text}");
    for line in &lines[3..] {
        let (key, value) = line.split_once(':').unwrap();
        let value = value.trim();
        match key {
            "NoNewPrivs" => assert_eq!(value, "1"),
            "Seccomp" => assert_eq!(value, "2"),
            _ => assert_eq!(value, "0000000000000000", "{key}"),
        }
    }
}

#[test]
fn root_is_read_only_and_tmp_dev_are_usable() {
    let data = Data::new("fs", 4);
    let script = "touch /x 2>/dev/null && echo root-writable; \
                  echo hi > /tmp/f && cat /tmp/f; \
                  ls /dev | grep -c -E '^(null|zero|full|random|urandom|tty)$'; \
                  echo s > /dev/shm/s && echo shm-ok; \
                  dd if=/dev/zero bs=4 count=1 2>/dev/null | wc -c; \
                  touch /dev/new 2>/dev/null && echo dev-writable; true";
    let out = data.run(&[], &sh(script));
    assert_eq!(stdout(&out), "hi\n6\nshm-ok\n4\n", "{}", stderr(&out));
    // As root inside, /proc/sys stays read-only and /proc/kcore masked.
    for probe in ["proc-sys", "kcore", "write-root"] {
        let out = data.run(&["--user", "0"], &["/bin/probe", probe]);
        assert!(out.status.success(), "{probe}: {}", stdout(&out));
    }
    // Writable extra paths and /work.
    let work = data.dir.join("work-a");
    std::fs::create_dir_all(&work).unwrap();
    let out = data.run(
        &[
            "--user",
            "0",
            "--tmpfs",
            "/data",
            "--work",
            work.to_str().unwrap(),
        ],
        &sh("echo a > /data/a && echo b > /work/b && cat /data/a /work/b"),
    );
    assert_eq!(stdout(&out), "a\nb\n", "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(work.join("b")).unwrap(), "b\n");
}

#[test]
fn a_memory_hog_is_oom_killed_in_its_own_cgroup() {
    let data = Data::new("oom", 4);
    let bystander = std::process::Command::new("sleep")
        .arg("20")
        .spawn()
        .unwrap();
    let out = data.run(&["--memory", "32M"], &["/bin/probe", "alloc", "200"]);
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(stderr(&out).contains("out of memory"), "{}", stderr(&out));
    let mut bystander = bystander;
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "a host process was harmed"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    assert_eq!(data.slots_in_use(), 0);
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit() {
    let data = Data::new("pids", 4);
    let started = Instant::now();
    let out = data.run(
        &["--pids", "16"],
        &sh("n=0; for i in $(seq 40); do sleep 2 & n=$((n+1)); done; echo spawned $n; wait"),
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        stderr(&out).contains("can't fork")
            || stderr(&out).contains("Resource temporarily unavailable"),
        "no fork failure: {}",
        stderr(&out)
    );
    assert_eq!(data.slots_in_use(), 0);
}

#[test]
fn a_cpu_hog_gets_only_its_quota() {
    let data = Data::new("cpu", 4);
    let out = data.run(&["--cpu", "0.2"], &["/bin/probe", "spin", "1000"]);
    let text = stdout(&out);
    let cpu: f64 = text.trim().strip_prefix("cpu ").unwrap().parse().unwrap();
    assert!(cpu <= 0.35, "used {cpu} CPU-seconds in 1 s with --cpu 0.2");
    assert!(cpu > 0.05, "barely ran: {cpu}");
}

#[test]
fn escape_attempts_fail() {
    let data = Data::new("escape", 4);
    // A second sandbox to attack, and a host process.
    let other = data.run_detached(&[], &["/bin/sleep", "30"]);
    let (_, other_pid, _) = data.ps().into_iter().find(|(i, _, _)| *i == other).unwrap();
    let me = std::process::id().to_string();
    let other_pid = other_pid.to_string();
    let attempts: Vec<Vec<&str>> = vec![
        vec!["mount"],
        vec!["unshare-mnt"],
        vec!["unshare-user"],
        vec!["setns"],
        vec!["ptrace", &other_pid],
        vec!["kill", &other_pid],
        vec!["kill", &me],
        vec!["mknod"],
        vec!["module"],
        vec!["kcore"],
        vec!["proc-sys"],
        vec!["write-root"],
        vec!["capset"],
        vec!["chroot"],
    ];
    for user in ["65534", "0"] {
        for attempt in &attempts {
            let mut argv = vec!["/bin/probe"];
            argv.extend(attempt);
            let out = data.run(&["--user", user], &argv);
            assert!(
                out.status.success(),
                "as uid {user}, {attempt:?} escaped: {}{}",
                stdout(&out),
                stderr(&out)
            );
        }
    }
    assert!(data
        .ps()
        .iter()
        .any(|(i, _, s)| *i == other && s == "running"));
    assert!(data.skiff(&["kill", &other]).status.success());
}

#[test]
fn tenants_cannot_reach_each_others_work() {
    let data = Data::new("tenants", 4);
    let (a, b) = (data.dir.join("tenant-a"), data.dir.join("tenant-b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("secret-of-a"), "the secret\n").unwrap();
    let out = data.run(
        &["--user", "0", "--work", b.to_str().unwrap()],
        &sh("find / -name 'secret-of-a' 2>/dev/null; grep -r 'the secret' /work /tmp /data 2>/dev/null; ls /work"),
    );
    assert_eq!(stdout(&out), "", "tenant b saw: {}", stdout(&out));
}

#[test]
fn output_and_exit_codes_pass_through() {
    let data = Data::new("exit", 4);
    let out = data.run(&[], &sh("echo out; echo err >&2; exit 7"));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stdout(&out), "out\n");
    assert_eq!(stderr(&out), "err\n");
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
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(42), "{status:?}");
}

#[test]
fn zombies_and_orphans_do_not_outlive_the_sandbox() {
    let data = Data::new("zombies", 4);
    // Children that exit unwaited (zombies), and one that outlives its parent (orphan).
    let out = data.run(
        &[],
        &sh("for i in 1 2 3; do (exit 0) & done; (sleep 61 &); echo $!; exit 0"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(data.slots_in_use(), 0);
    let sleepers = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path().join("cmdline")).ok())
        .filter(|c| c == "sleep\x0061\x00")
        .count();
    assert_eq!(sleepers, 0, "an orphan outlived its sandbox");
}

#[test]
fn detached_sandboxes_are_listed_and_killed() {
    let data = Data::new("detach", 4);
    let id = data.run_detached(&[], &sh("echo started; exec sleep 30"));
    assert_eq!(id.len(), 12, "{id}");
    let listed = data.ps();
    assert!(
        listed.iter().any(|(i, _, s)| *i == id && s == "running"),
        "{listed:?}"
    );
    assert_eq!(data.slots_in_use(), 1);
    let out = data.skiff(&["kill", &id[..6]]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(data.ps().is_empty());
    assert_eq!(data.slots_in_use(), 0);
    let out = data.skiff(&["kill", &id]);
    assert!(!out.status.success());
    assert!(stderr(&out).starts_with("skiff: error: no such sandbox"));
}

fn assert_one_line_error(out: &std::process::Output, code: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("skiff: error: "), "{err}");
    assert!(err.contains(needle), "{err} lacks {needle:?}");
}

#[test]
fn bad_input_gets_one_clear_line_and_leaves_nothing() {
    let data = Data::new("badinput", 1);
    let mut cmd = data.cmd();
    let out = cmd
        .args(["run", "--rootfs", "/nonexistent", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_one_line_error(&out, 125, "/nonexistent does not exist");
    assert_one_line_error(&data.run(&[], &["/bin/nope"]), 127, "command not found");
    assert_one_line_error(
        &data.run(&[], &["/bin/not-executable"]),
        126,
        "cannot execute",
    );
    assert_one_line_error(
        &data.run(&["--memory", "0"], &["/bin/true"]),
        125,
        "--memory 0 is out of range",
    );
    assert_one_line_error(
        &data.run(&["--cpu", "1000"], &["/bin/true"]),
        125,
        "--cpu 1000 is out of range",
    );
    assert_one_line_error(
        &data.run(&["--pids", "0"], &["/bin/true"]),
        125,
        "--pids 0 is out of range",
    );
    assert_eq!(data.slots_in_use(), 0);

    let holder = data.run_detached(&[], &["/bin/sleep", "30"]);
    assert_one_line_error(&data.run(&[], &["/bin/true"]), 125, "exhausted");
    assert!(data.skiff(&["kill", &holder]).status.success());
    assert!(data.run(&[], &["/bin/true"]).status.success());
    assert_eq!(data.slots_in_use(), 0);
}

#[test]
fn gc_cleans_up_after_a_crashed_skiff() {
    let data = Data::new("gc", 4);
    let mut cli = data.start_until_ready("echo ready; exec sleep 60");
    let pid = data.wait_for_one_sandbox();
    cli.kill().unwrap();
    assert_eq!(cli.wait().unwrap().signal(), Some(libc::SIGKILL));
    // The sandbox dies with its skiff (parent-death signal).
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "sandbox outlived skiff"
    );
    assert_eq!(
        data.slots_in_use(),
        1,
        "the crashed skiff's claim is still there"
    );
    let out = data.skiff(&["gc"]);
    assert!(
        stdout(&out).contains("released cgroup slot"),
        "{}",
        stdout(&out)
    );
    assert_eq!(data.slots_in_use(), 0);
    assert!(data.ps().is_empty());
}

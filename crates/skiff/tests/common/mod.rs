//! Shared set-up for the sandbox tests: a busybox rootfs with the `probe` helper, and a
//! data directory per test with its own small cgroup pool, checked for leftovers at the
//! end. Tests run as root: they create namespaces and cgroups for real.
//!
//! Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const SKIFF: &str = env!("CARGO_BIN_EXE_skiff");

const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "id", "readlink", "ls", "touch", "ip", "dd", "sleep", "grep", "find",
    "mkdir", "true", "seq", "hostname", "wc", "test",
];

/// The test rootfs (built once per test binary): busybox, its applets, `probe`, and the
/// directories skiff mounts on.
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let root =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rootfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["bin", "proc", "dev", "tmp", "work", "data"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        let busybox = Path::new("/bin/busybox");
        assert!(
            busybox.exists(),
            "/bin/busybox is missing: install Debian's busybox-static (scripts/deps.sh does)"
        );
        std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let probe_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/probe/probe.c");
        let status = Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(root.join("bin/probe"))
            .arg(&probe_src)
            .status()
            .expect("gcc is needed to build tests/probe/probe.c");
        assert!(status.success(), "cannot compile probe.c");
        std::fs::write(root.join("bin/not-executable"), "data\n").unwrap();
        root
    })
}

/// A data directory with its own cgroup pool; dropping it removes the pools and checks
/// that nothing of skiff is left in the mount table or the cgroup hierarchies.
pub struct Data {
    pub dir: PathBuf,
}

impl Data {
    pub fn new(name: &str, pool_size: usize) -> Data {
        let dir = std::env::temp_dir().join(format!("skiff-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data = Data { dir };
        let out = data.skiff(&["pool", "--size", &pool_size.to_string()]);
        assert!(out.status.success(), "pool: {}", stderr(&out));
        data
    }

    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(SKIFF);
        cmd.arg("--data").arg(&self.dir);
        cmd
    }

    pub fn skiff(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// `skiff run --rootfs ROOTFS FLAGS -- ARGV`.
    pub fn run(&self, flags: &[&str], argv: &[&str]) -> Output {
        let mut cmd = self.cmd();
        cmd.arg("run")
            .arg("--rootfs")
            .arg(rootfs())
            .args(flags)
            .arg("--")
            .args(argv);
        cmd.output().unwrap()
    }

    /// Starts `skiff run` in the foreground on a shell script that prints `ready` once
    /// it is set up, and returns when it has.
    pub fn start_until_ready(&self, script: &str) -> std::process::Child {
        let mut child = self
            .cmd()
            .arg("run")
            .arg("--rootfs")
            .arg(rootfs())
            .args(["--", "/bin/sh", "-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = [0u8; 6];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut line).unwrap();
        assert_eq!(&line, b"ready\n");
        child
    }

    /// A detached sandbox's id.
    pub fn run_detached(&self, flags: &[&str], argv: &[&str]) -> String {
        let mut all = vec!["-d"];
        all.extend_from_slice(flags);
        let out = self.run(&all, argv);
        assert!(out.status.success(), "run -d: {}", stderr(&out));
        stdout(&out).trim().to_owned()
    }

    /// (id, host pid) of every sandbox `skiff ps --json` lists.
    pub fn ps(&self) -> Vec<(String, i32, String)> {
        let out = self.skiff(&["ps", "--json"]);
        assert!(out.status.success(), "ps: {}", stderr(&out));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["id"].as_str().unwrap().to_owned(),
                    r["pid"].as_i64().unwrap() as i32,
                    r["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// The host pid of the only sandbox, once its record is written (just after the
    /// command started, so a test that saw its output may have to wait a moment).
    pub fn wait_for_one_sandbox(&self) -> i32 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let [(_, pid, _)] = self.ps()[..] {
                return pid;
            }
            assert!(std::time::Instant::now() < deadline, "no sandbox record");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    pub fn slots_in_use(&self) -> usize {
        let out = self.skiff(&["pool"]);
        stdout(&out)
            .lines()
            .find_map(|l| l.strip_prefix("in use: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("`skiff pool` prints `in use: N`")
    }

    /// The pool's cgroup directories, one per hierarchy.
    pub fn pool_paths(&self) -> Vec<PathBuf> {
        let out = self.skiff(&["pool"]);
        stdout(&out)
            .lines()
            .filter_map(|l| l.strip_prefix("path: "))
            .map(PathBuf::from)
            .collect()
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        // A failed test may leave sandboxes running: end them first.
        for (id, _, _) in self.ps() {
            let _ = self.skiff(&["kill", &id]);
        }
        let paths = self.pool_paths();
        let out = self.skiff(&["gc", "--pools"]);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let leaked_mounts: Vec<&str> = mounts
            .lines()
            .filter(|l| l.contains(self.dir.to_str().unwrap()))
            .collect();
        let leaked_cgroups: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            assert!(out.status.success(), "gc --pools: {}", stderr(&out));
            assert!(leaked_mounts.is_empty(), "mounts left: {leaked_mounts:?}");
            assert!(
                leaked_cgroups.is_empty(),
                "cgroups left: {leaked_cgroups:?}"
            );
        }
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The link target of /proc/self/ns/NAME in the test process.
pub fn host_ns(name: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{name}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

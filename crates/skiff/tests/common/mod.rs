//! Shared set-up for the sandbox tests: a busybox rootfs with the `probe` helper, and a
//! data directory per test with its own small cgroup pool, checked for leftovers at the
//! end. Tests run as root: they create namespaces and cgroups for real.
//!
//! Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod daemon;

pub const SKIFF: &str = env!("CARGO_BIN_EXE_skiff");

const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "id", "readlink", "ls", "touch", "ip", "dd", "sleep", "grep", "find",
    "mkdir", "true", "seq", "hostname", "wc", "test", "[",
];

/// The name the probe is also installed under in the rootfs, so that the processes it
/// leaves behind (`probe zombies`) can be told apart on the host by their `comm`.
pub const ZOMBIE_MAKER: &str = "zmaker";

static ROOTFS: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_rootfs() {
    if let Some(root) = ROOTFS.get() {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// The test rootfs (built once per test binary, removed when it exits): busybox and its
/// applets, `probe` (from tests/probe/probe.c, also as `zmaker`), a non-executable file,
/// and the directories skiff mounts on.
pub fn rootfs() -> &'static Path {
    ROOTFS.get_or_init(|| {
        let parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_stale_rootfs(parent);
        let root = parent.join(format!("rootfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["bin", "proc", "dev", "tmp", "work", "etc", "data"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        // SAFETY: registers a plain extern "C" function, run when the test binary exits.
        unsafe { libc::atexit(remove_rootfs) };
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
        let out = Command::new("gcc")
            .args(["-static", "-O2", "-Wall", "-o"])
            .arg(root.join("bin/probe"))
            .arg(&probe_src)
            .output()
            .expect("gcc is needed to build tests/probe/probe.c (install gcc and libc6-dev)");
        assert!(
            out.status.success(),
            "cannot compile {}: {}",
            probe_src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(root.join("bin/probe"), root.join("bin").join(ZOMBIE_MAKER)).unwrap();
        std::fs::write(root.join("bin/not-executable"), "data\n").unwrap();
        std::fs::write(root.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        root
    })
}

/// Removes the rootfs of test binaries that died without running their exit handlers.
fn remove_stale_rootfs(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("rootfs-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
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
        cmd.arg("--data-dir").arg(&self.dir);
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

    /// (id, host pid, status) of every sandbox `skiff ps --json` lists.
    pub fn ps(&self) -> Vec<(String, i32, String)> {
        let out = self.skiff(&["ps", "--json"]);
        assert!(out.status.success(), "ps: {}", stderr(&out));
        parse_ps(&out).unwrap_or_else(|| panic!("ps --json: {}", stdout(&out)))
    }

    /// The host pid of the sandbox `id` as `skiff ps --json` gives it.
    pub fn pid_of(&self, id: &str) -> i32 {
        let rows = self.ps();
        rows.iter()
            .find(|(i, _, _)| i == id)
            .unwrap_or_else(|| panic!("sandbox {id} is not in `skiff ps`: {rows:?}"))
            .1
    }

    /// The host pid of the only sandbox, once its record is written (just after the
    /// command started, so a test that saw its output may have to wait a moment).
    pub fn wait_for_one_sandbox(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let [(_, pid, _)] = self.ps()[..] {
                return pid;
            }
            assert!(Instant::now() < deadline, "no sandbox record");
            std::thread::sleep(Duration::from_millis(5));
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

    /// The pool's directory name, `skiff-<8 hex digits>`.
    pub fn pool_name(&self) -> String {
        let name = self
            .pool_name_unchecked()
            .expect("`skiff pool` prints `path: ...`");
        assert!(
            name.len() == 14
                && name.starts_with("skiff-")
                && name[6..].bytes().all(|b| b.is_ascii_hexdigit()),
            "pool directory {name:?} is not named skiff-<8 hex digits>"
        );
        name
    }

    fn pool_name_unchecked(&self) -> Option<String> {
        let paths = self.pool_paths();
        let name = paths.first()?.file_name()?;
        Some(name.to_string_lossy().into_owned())
    }

    /// Every process in any cgroup of the pool (in any hierarchy, at any depth).
    pub fn pool_processes(&self) -> Vec<i32> {
        let mut pids = BTreeSet::new();
        for path in self.pool_paths() {
            collect_procs(&path, &mut pids);
        }
        pids.into_iter().collect()
    }

    /// mountinfo lines that name a path in the data directory.
    pub fn mounts(&self) -> Vec<String> {
        mountinfo_lines_naming(&self.dir)
    }

    /// Host processes whose command line names the data directory: skiff processes
    /// (or helpers they started) working on it.
    pub fn skiff_processes(&self) -> Vec<(i32, String)> {
        let dir = self.dir.to_string_lossy().into_owned();
        processes()
            .into_iter()
            .filter(|p| {
                // Templates run chrooted in a runtime layer below the data directory.
                let root = std::fs::read_link(format!("/proc/{}/root", p.pid))
                    .is_ok_and(|root| root.starts_with(&self.dir));
                root || p
                    .cmdline
                    .split('\0')
                    .any(|arg| arg == dir || arg.starts_with(&format!("{dir}/")))
            })
            .map(|p| (p.pid, p.cmdline.replace('\0', " ")))
            .collect()
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        // A failed test may leave sandboxes running: end them first.
        let listed = parse_ps(&self.skiff(&["ps", "--json"])).unwrap_or_default();
        for (id, _, _) in listed {
            let _ = self.skiff(&["kill", &id]);
        }
        let name = self.pool_name_unchecked();
        let paths = self.pool_paths();
        let out = self.skiff(&["gc", "--pools"]);
        let leaked_mounts = self.mounts();
        let mut leaked_cgroups: Vec<PathBuf> = paths.into_iter().filter(|p| p.exists()).collect();
        if let Some(name) = name {
            leaked_cgroups.extend(cgroup_dirs_named(&name));
        }
        leaked_cgroups.sort();
        leaked_cgroups.dedup();
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

fn parse_ps(out: &Output) -> Option<Vec<(String, i32, String)>> {
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    rows.as_array()?
        .iter()
        .map(|r| {
            Some((
                r["id"].as_str()?.to_owned(),
                i32::try_from(r["pid"].as_i64()?).ok()?,
                r["status"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn collect_procs(dir: &Path, pids: &mut BTreeSet<i32>) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&entry.path(), pids);
            }
        }
    }
}

/// Directories called `name` where skiff puts pools: under this process's own cgroup in
/// every hierarchy mounted below /sys/fs/cgroup (and its root, for a pure cgroup2 host).
pub fn cgroup_dirs_named(name: &str) -> Vec<PathBuf> {
    let own: BTreeSet<String> = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .map(|p| p.trim_start_matches('/').to_owned())
        .collect();
    let root = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(root) {
        hierarchies.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    let mut found = Vec::new();
    for hierarchy in &hierarchies {
        for path in &own {
            let dir = hierarchy.join(path).join(name);
            if dir.exists() {
                found.push(dir);
            }
        }
    }
    found
}

/// mountinfo lines (of this process's mount namespace) that name `path` or a path in it.
pub fn mountinfo_lines_naming(path: &Path) -> Vec<String> {
    let path = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|field| field == path || field.starts_with(&format!("{path}/")))
        })
        .map(str::to_owned)
        .collect()
}

/// One host process as /proc shows it.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: i32,
    pub ppid: i32,
    pub state: char,
    pub comm: String,
    /// Arguments separated by NUL.
    pub cmdline: String,
}

/// Every process on the host (that did not exit while being read).
pub fn processes() -> Vec<Process> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        all.push(Process {
            pid,
            ppid: field("PPid:").parse().unwrap_or(0),
            state: field("State:").chars().next().unwrap_or('?'),
            comm: field("Name:"),
            cmdline: String::from_utf8_lossy(&cmdline)
                .trim_end_matches('\0')
                .to_owned(),
        });
    }
    all
}

pub fn pid_alive(pid: i32) -> bool {
    // A zombie has exited: it only waits for its parent.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Waits up to `timeout` for `pid` to be gone (or a zombie); true when it is.
pub fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
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

/// A function that `skiff validate`, `build` and deploy must refuse, and the message
/// they must refuse it with.
pub struct Broken {
    pub dir: PathBuf,
    pub message: &'static str,
}

/// Broken functions under `parent`, one directory each: a missing handler file for
/// every runtime, a binary without its executable bit, a `#!/bin/sh` script, a file that
/// is neither ELF nor wasm, a link out of the function's code. Each has a manifest that
/// parses: only its files are wrong.
pub fn broken_functions(parent: &Path) -> Vec<Broken> {
    let function = |name: &str, manifest_rest: &str, files: &[(&str, &[u8], u32)]| {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("skiff.yaml"),
            format!("name: {name}\n{manifest_rest}"),
        )
        .unwrap();
        for (file, bytes, mode) in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(*mode))
                .unwrap();
        }
        dir
    };
    let elf = std::fs::read("/bin/busybox").expect("busybox-static is installed");
    let elf = elf.as_slice();
    let outside = function("bin-outside", "runtime: binary\nhandler: ./run\n", &[]);
    std::os::unix::fs::symlink("/bin/busybox", outside.join("run")).unwrap();
    let code_outside = function(
        "code-outside",
        "runtime: python3\nhandler: main.handle\ncode: lib\n",
        &[],
    );
    std::os::unix::fs::symlink("/etc", code_outside.join("lib")).unwrap();
    vec![
        Broken {
            dir: function(
                "py-missing",
                "runtime: python3\nhandler: main.handle\n",
                &[("other.py", b"", 0o644)],
            ),
            message: "handler main.handle: the function has no main.py (nor a package main/)",
        },
        Broken {
            dir: function(
                "py-src-missing",
                "runtime: python3\nhandler: app.handle\ncode: ./src\n",
                &[
                    ("app.py", b"def handle(e, c): pass\n", 0o644),
                    ("src/util.py", b"", 0o644),
                ],
            ),
            message: "handler app.handle: the function has no src/app.py (nor a package src/app/)",
        },
        Broken {
            dir: code_outside,
            message: "code: lib points outside the function's directory",
        },
        Broken {
            dir: function(
                "code-missing",
                "runtime: python3\nhandler: app.handle\ncode: ./src\n",
                &[("app.py", b"def handle(e, c): pass\n", 0o644)],
            ),
            message: "code: the function has no directory ./src",
        },
        Broken {
            dir: function(
                "node-missing",
                "runtime: node\nhandler: index.handler\n",
                &[],
            ),
            message: "handler index.handler: the function has no index.js (nor a directory index/)",
        },
        Broken {
            dir: function(
                "node-mjs",
                "runtime: node\nhandler: index.handler\n",
                &[(
                    "index.mjs",
                    b"export const handler = async () => 1;\n",
                    0o644,
                )],
            ),
            message: "handler index.handler: the function has no index.js (nor a directory \
                      index/); to load index.mjs, name it: handler: index.mjs.handler",
        },
        Broken {
            dir: function("bin-missing", "runtime: binary\nhandler: ./bin/echo\n", &[]),
            message: "handler ./bin/echo: the function has no file bin/echo",
        },
        Broken {
            dir: function(
                "bin-noexec",
                "runtime: binary\nhandler: ./echo\n",
                &[("echo", elf, 0o644)],
            ),
            message: "handler echo is not executable: chmod +x echo",
        },
        Broken {
            dir: function(
                "bin-script",
                "runtime: binary\nhandler: run.sh\n",
                &[("run.sh", b"#!/bin/sh -e\ncat\n", 0o755)],
            ),
            message: "handler run.sh starts with #!/bin/sh, which its environment does not \
                      have: use a compiled binary or runtime python3/node",
        },
        Broken {
            dir: function(
                "bin-text",
                "runtime: binary\nhandler: ./run\n",
                &[("run", b"cat\n", 0o755)],
            ),
            message: "handler run is not an executable: it is not an ELF binary",
        },
        Broken {
            dir: outside,
            message: "handler ./run: run points outside the function's code",
        },
        Broken {
            dir: function(
                "bin-dotdot",
                "runtime: binary\nhandler: ../bin-noexec/echo\n",
                &[],
            ),
            message: "handler ../bin-noexec/echo: ../bin-noexec/echo points outside the \
                      function's code",
        },
        Broken {
            dir: function("wasm-missing", "runtime: wasm\nhandler: f.wasm\n", &[]),
            message: "handler f.wasm: the function has no file f.wasm",
        },
        Broken {
            dir: function(
                "wasm-not-wasm",
                "runtime: wasm\nhandler: f.wasm\n",
                &[("f.wasm", elf, 0o644)],
            ),
            message: "handler f.wasm is not a WebAssembly module: it does not start with \\0asm",
        },
    ]
}

/// Compiles `source` (C) into the executable `out` with the host's cc.
pub fn cc(source: &Path, out: &Path) {
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(out)
        .arg(source)
        .status()
        .unwrap();
    assert!(status.success(), "cc {}", source.display());
}

use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

/// How root inside a user namespace maps to the host: inside ids `0..count` are host
/// ids `host..host + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub host: u32,
    pub count: u32,
}

/// Everything a sandbox is started from.
#[derive(Debug)]
pub struct Spec {
    /// Becomes the hostname.
    pub id: String,
    /// Bind-mounted read-only as `/`; must hold `/proc`, `/dev` and `/tmp` directories.
    pub rootfs: PathBuf,
    pub argv: Vec<String>,
    /// `KEY=VALUE` pairs; `PATH` also guides the search for `argv[0]`.
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub user_ns: Option<IdMap>,
    /// The shared /dev template ([`crate::devices::ensure`]), bound as `/dev`.
    pub dev_template: PathBuf,
    /// Bind-mounted read-write at `/work`.
    pub work: Option<PathBuf>,
    /// Extra volatile writable paths inside the rootfs.
    pub tmpfs: Vec<String>,
    /// A network namespace to join (`network: none`); `None` keeps the host's.
    pub netns: Option<OwnedFd>,
    /// Descriptors that become the command's stdin, stdout and stderr.
    pub stdio: [RawFd; 3],
    /// SIGKILL the sandbox when the spawning process dies.
    pub die_with_parent: bool,
    /// `RLIMIT_NOFILE` (soft and hard).
    pub max_open_files: u64,
}

/// The search path used when the environment sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Spec {
    pub fn new(
        id: &str,
        rootfs: impl Into<PathBuf>,
        dev_template: PathBuf,
        argv: Vec<String>,
    ) -> Spec {
        Spec {
            id: id.to_owned(),
            rootfs: rootfs.into(),
            argv,
            env: vec![format!("PATH={DEFAULT_PATH}"), format!("HOSTNAME={id}")],
            cwd: "/".to_owned(),
            uid: 65534,
            gid: 65534,
            user_ns: None,
            dev_template,
            work: None,
            tmpfs: Vec::new(),
            netns: None,
            stdio: [0, 1, 2],
            die_with_parent: true,
            max_open_files: 1024,
        }
    }

    /// Candidate paths for `argv[0]`, resolved inside the sandbox as execvp would.
    pub(crate) fn exec_candidates(&self) -> Vec<String> {
        let cmd = &self.argv[0];
        if cmd.contains('/') {
            return vec![cmd.clone()];
        }
        let path = self
            .env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or(DEFAULT_PATH);
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{}/{cmd}", d.trim_end_matches('/')))
            .collect()
    }
}

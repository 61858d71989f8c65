//! `skiff run`: one command in one sandbox, in the foreground or detached.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use skiff_cgroups::{CgroupPool, Limits, Slot};
use skiff_sandbox::netns::NetnsPool;
use skiff_sandbox::{Child, IdMap, SpawnErrorKind, Spawner, Spec};

use crate::log::debug;
use crate::records::{self, Record};
use crate::units;

#[derive(Args)]
pub struct RunArgs {
    /// Memory limit (bytes, or with a K, M or G suffix).
    #[arg(long, default_value = "256M")]
    memory: String,
    /// CPU limit in CPUs (0.5 = half of one CPU).
    #[arg(long, default_value_t = 1.0)]
    cpu: f64,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = 64)]
    pids: u64,
    /// `host` shares the host's network (no namespace); `none` has only loopback.
    #[arg(long, value_enum, default_value_t = Network::Host)]
    network: Network,
    /// Run in a user namespace: root inside is an unprivileged uid on the host.
    #[arg(long)]
    user_ns: bool,
    /// UID[:GID] inside the sandbox (default 65534, or 0 with --user-ns).
    #[arg(long)]
    user: Option<String>,
    /// A host directory mounted read-write at /work (persistent).
    #[arg(long)]
    work: Option<PathBuf>,
    /// An extra writable, volatile path inside the rootfs (repeatable).
    #[arg(long = "tmpfs", value_name = "PATH")]
    tmpfs: Vec<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(short = 'e', long = "var", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, default_value = "/")]
    cwd: String,
    /// Start in the background, print the sandbox id, and return.
    #[arg(short, long)]
    detach: bool,
    /// The root filesystem (mounted read-only); needs /proc, /dev and /tmp directories.
    #[arg(
        long,
        required_unless_present = "env_name",
        conflicts_with = "env_name"
    )]
    rootfs: Option<PathBuf>,
    /// Run in a built environment (see `skiff build`, `skiff envs`) instead of --rootfs.
    #[arg(long = "env", value_name = "NAME")]
    env_name: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Network {
    Host,
    None,
}

/// An error with the exit code `skiff run` must end with (126 and 127 as shells).
#[derive(Debug)]
pub struct Failure {
    pub exit_code: u8,
    message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// First host uid of the user-namespace ranges; slot `i` maps to its own 65536 ids.
const USERNS_BASE: u32 = 100_000;
const USERNS_RANGE: u32 = 65_536;

/// Signals `skiff run` passes on to the sandbox.
const FORWARDED: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn limits(args: &RunArgs) -> Result<Limits> {
    let memory_bytes = units::parse_size(&args.memory).context("--memory")?;
    let total = host_memory();
    if !(1 << 20..=total).contains(&memory_bytes) {
        bail!(
            "--memory {} is out of range: it must be between 1M and the host's {}M",
            args.memory,
            total >> 20
        );
    }
    // Not available_parallelism(): it reads cgroup files, which costs on the hot path.
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
    if !(0.01..=cpus).contains(&args.cpu) {
        bail!(
            "--cpu {} is out of range: it must be between 0.01 and {cpus}",
            args.cpu
        );
    }
    if !(1..=65536).contains(&args.pids) {
        bail!(
            "--pids {} is out of range: it must be between 1 and 65536",
            args.pids
        );
    }
    Ok(Limits {
        memory_bytes,
        cpus: args.cpu,
        pids: args.pids,
    })
}

fn host_memory() -> u64 {
    // SAFETY: sysinfo fills a zeroed local struct.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    unsafe { libc::sysinfo(&mut info) };
    info.totalram as u64 * info.mem_unit as u64
}

fn parse_user(args: &RunArgs) -> Result<(u32, u32)> {
    let Some(user) = &args.user else {
        return Ok(if args.user_ns { (0, 0) } else { (65534, 65534) });
    };
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let parse = |s: &str| {
        s.parse::<u32>()
            .with_context(|| format!("--user {user:?}: expected numeric UID[:GID]"))
    };
    Ok((parse(uid)?, parse(gid)?))
}

/// Resources claimed for one sandbox, released on every path out.
struct Claimed<'a> {
    cgroups: &'a CgroupPool,
    slot: Slot,
    netns: Option<(&'a NetnsPool, usize)>,
}

impl Claimed<'_> {
    fn release(&self) -> Result<()> {
        if let Some((pool, slot)) = self.netns {
            pool.release(slot)?;
        }
        self.cgroups.release(self.slot.index)
    }
}

pub fn run(data: &Path, args: RunArgs) -> Result<i32> {
    let started = std::time::Instant::now();
    let limits = limits(&args)?;
    let (uid, gid) = parse_user(&args)?;
    for var in &args.env {
        if !var.contains('=') || var.starts_with('=') {
            bail!("--var {var:?}: expected KEY=VALUE");
        }
    }
    skiff_pool::run_dir(data)
        .and_then(|_| std::fs::create_dir_all(records::dir(data)))
        .with_context(|| format!("cannot set up the data directory {}", data.display()))?;
    let spawner = Spawner::new()?;
    let id = units::new_id();

    let cgroups = CgroupPool::open(data)?;
    debug!("{:?}: pool opened", started.elapsed());
    let (slot, entry) = match cgroups.acquire(&id, &limits) {
        Ok(claimed) => claimed,
        // A full pool may only hold claims of sandboxes that died unnoticed.
        Err(_) if crate::admin::reclaim_dead(data)? > 0 => cgroups.acquire(&id, &limits)?,
        Err(e) => return Err(e),
    };
    let netns_pool;
    let mut claimed = Claimed {
        cgroups: &cgroups,
        slot,
        netns: None,
    };
    let dev_template = match skiff_sandbox::devices::ensure(data) {
        Ok(dir) => dir,
        Err(e) => {
            claimed.release()?;
            return Err(e);
        }
    };
    let rootfs = match (&args.rootfs, &args.env_name) {
        (Some(dir), _) => dir.clone(),
        (None, Some(name)) => {
            let store = skiff_store::Store::open(data)?;
            match store.resolve(name) {
                Ok(record) => store.env_root(&record.id),
                Err(e) => {
                    claimed.release()?;
                    return Err(e);
                }
            }
        }
        (None, None) => unreachable!("clap requires --rootfs or --env"),
    };
    let mut spec = Spec::new(&id, &rootfs, dev_template, args.command.clone());
    if args.network == Network::None {
        netns_pool = NetnsPool::open(data)?;
        match netns_pool.acquire(&id) {
            Ok((slot, fd)) => {
                claimed.netns = Some((&netns_pool, slot));
                spec.netns = Some(fd);
            }
            Err(e) => {
                claimed.release()?;
                return Err(e);
            }
        }
    }
    spec.env.extend(args.env.iter().cloned());
    spec.cwd = args.cwd.clone();
    (spec.uid, spec.gid) = (uid, gid);
    spec.work = args.work.clone();
    spec.tmpfs = args.tmpfs.clone();
    if args.user_ns {
        spec.user_ns = Some(IdMap {
            host: USERNS_BASE + claimed.slot.index as u32 * USERNS_RANGE,
            count: USERNS_RANGE,
        });
    }
    // Detached: no terminal to write to; output goes to the sandbox's log.
    let detached_stdio = if args.detach {
        let null = File::open("/dev/null")?;
        let log_path = records::log_path(data, &id);
        std::fs::create_dir_all(log_path.parent().expect("logs have a directory"))?;
        let log = File::create(log_path)?;
        spec.stdio = [null.as_raw_fd(), log.as_raw_fd(), log.as_raw_fd()];
        spec.die_with_parent = false;
        Some((null, log))
    } else {
        None
    };
    if entry.clone_into.is_some() {
        debug!(
            "spawning {id} with clone3 CLONE_INTO_CGROUP into {:?}",
            cgroups.dirs(claimed.slot.index)
        );
    }

    debug!(
        "{:?}: cgroup slot {} acquired",
        started.elapsed(),
        claimed.slot.index
    );
    let signals = (!args.detach).then(block_forwarded_signals).transpose()?;
    let child = match spawner.spawn(&spec, &entry) {
        Ok(child) => child,
        Err(e) => {
            claimed.release()?;
            let exit_code = match e.kind {
                SpawnErrorKind::NotFound => 127,
                SpawnErrorKind::NotExecutable => 126,
                SpawnErrorKind::Setup => 125,
            };
            return Err(Failure {
                exit_code,
                message: e.message,
            }
            .into());
        }
    };
    drop((entry, detached_stdio));
    let record = Record {
        id: id.clone(),
        pid: child.pid,
        start_time: records::start_time(child.pid).map_or(0, |(t, _)| t),
        cgroup_slot: claimed.slot.index,
        netns_slot: claimed.netns.map(|(_, s)| s),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        detached: args.detach,
        command: args.command.clone(),
    };
    record.save(data)?;
    debug!("{:?}: started {id} as pid {}", started.elapsed(), child.pid);
    if args.detach {
        println!("{id}");
        return Ok(0);
    }

    let status = supervise(&child, signals.as_ref().expect("foreground blocks signals"))?;
    debug!("{:?}: sandbox exited: {status:?}", started.elapsed());
    let oom = cgroups.oom_killed(&claimed.slot);
    claimed.release()?;
    record.remove(data);
    debug!("{:?}: resources released", started.elapsed());
    if oom {
        eprintln!(
            "skiff: sandbox {id} killed: out of memory (limit {})",
            args.memory
        );
        return Ok(137);
    }
    Ok(status.code())
}

/// Blocks the forwarded signals and returns a signalfd that receives them.
fn block_forwarded_signals() -> Result<OwnedFd> {
    // SAFETY: sigset operations on a local set; signalfd returns a new descriptor.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("signalfd");
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Waits for the sandbox to end, forwarding signals. PID 1 of a namespace ignores
/// signals it has no handler for, so a second SIGINT or SIGTERM kills it.
fn supervise(child: &Child, signals: &OwnedFd) -> Result<skiff_sandbox::ExitStatus> {
    let mut interrupts = 0;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: child.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: signals.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            return Ok(child.wait()?);
        }
        if fds[1].revents != 0 {
            // SAFETY: reading one signalfd_siginfo into a zeroed local.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let n = unsafe {
                libc::read(
                    signals.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    std::mem::size_of::<libc::signalfd_siginfo>(),
                )
            };
            if n <= 0 {
                continue;
            }
            let sig = info.ssi_signo as i32;
            if sig == libc::SIGINT || sig == libc::SIGTERM {
                interrupts += 1;
            }
            let _ = child.kill(if interrupts >= 2 { libc::SIGKILL } else { sig });
        }
    }
}

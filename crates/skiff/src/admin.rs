//! `skiff ps`, `kill`, `gc` and `pool`: looking after sandboxes from any process.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skiff_cgroups::CgroupPool;
use skiff_sandbox::netns::NetnsPool;

use crate::records::{self, Record};
use crate::units;

/// A claim younger than this may belong to a sandbox still starting (its record is
/// written right after the spawn), so gc leaves it alone.
const CLAIM_GRACE: Duration = Duration::from_secs(10);

/// `skiff ps`: sandboxes started by `skiff run`, and `instances` of the daemon serving
/// this data directory (from `GET /v1/instances`).
pub fn ps(data: &Path, json: bool, instances: Vec<serde_json::Value>) -> Result<()> {
    let records = records::load_all(data)?;
    let cgroups = CgroupPool::open(data)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut rows: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.id,
                "pid": r.pid,
                "status": if r.is_alive() { "running" } else { "exited" },
                "slot": r.cgroup_slot,
                "memory_bytes": cgroups.memory_usage(r.cgroup_slot).unwrap_or(0),
                "created_unix": r.created_unix,
                "command": r.command.join(" "),
            })
        })
        .collect();
    rows.extend(instances.iter().map(|i| {
        let busy = i["inflight"].as_u64().unwrap_or(0) > 0;
        let started = humantime::parse_rfc3339(i["started"].as_str().unwrap_or(""))
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(now, |d| d.as_secs());
        let function = i["function"].as_str().unwrap_or("?");
        let template = i["role"] == "template";
        serde_json::json!({
            "id": i["id"],
            "pid": i["pid"],
            "status": if template { "template" } else if busy { "serving" } else { "idle" },
            "slot": i["cgroup_slot"],
            "memory_bytes": i["memory_bytes"],
            "created_unix": started,
            "command": if template {
                format!("template of function {function}")
            } else {
                format!("function {function}")
            },
            "function": i["function"],
        })
    }));
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<22}  {:>8}  {:<8}  {:>4}  {:>9}  {:>6}  COMMAND",
        "ID", "PID", "STATUS", "SLOT", "MEMORY", "AGE"
    );
    for row in rows {
        println!(
            "{:<22}  {:>8}  {:<8}  {:>4}  {:>8}K  {:>6}  {}",
            row["id"].as_str().unwrap_or(""),
            row["pid"],
            row["status"].as_str().unwrap_or(""),
            row["slot"],
            row["memory_bytes"].as_u64().unwrap_or(0) >> 10,
            age(now.saturating_sub(row["created_unix"].as_u64().unwrap_or(now))),
            row["command"].as_str().unwrap_or(""),
        );
    }
    Ok(())
}

/// `42s`, `7m`, `3h`, `2d`.
fn age(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86400),
    }
}

pub fn kill(data: &Path, id: &str, signal: &str) -> Result<()> {
    let sig = units::signal_number(signal)?;
    let record = records::find(data, id)?;
    if record.is_alive() {
        let pidfd = pidfd_open(record.pid)?;
        // The pid may have been reused between the check and the open: check again.
        if !record.is_alive() {
            bail!("sandbox {} has already exited", record.id);
        }
        // SAFETY: pidfd_send_signal on a pidfd we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error()).context("cannot signal the sandbox");
        }
        if sig != libc::SIGKILL {
            return Ok(());
        }
        wait_exit(&pidfd, Duration::from_secs(10))?;
    }
    cleanup(data, &record)
}

/// Frees everything a sandbox held once its process is gone.
fn cleanup(data: &Path, record: &Record) -> Result<()> {
    if let Some(slot) = record.netns_slot {
        NetnsPool::open(data)?.release(slot)?;
    }
    CgroupPool::open(data)?.release(record.cgroup_slot)?;
    record.remove(data);
    Ok(())
}

/// Releases the claims of recorded sandboxes whose process is gone. Returns how many.
pub fn reclaim_dead(data: &Path) -> Result<usize> {
    let mut reclaimed = 0;
    for record in records::load_all(data)? {
        if !record.is_alive() {
            cleanup(data, &record)?;
            reclaimed += 1;
        }
    }
    Ok(reclaimed)
}

pub fn gc(data: &Path, pools: bool) -> Result<()> {
    let mut removed = Vec::new();
    let records = records::load_all(data)?;
    for record in &records {
        if !record.is_alive() {
            cleanup(data, record)?;
            removed.push(format!(
                "sandbox {} (pid {} gone): released cgroup slot {}{}",
                record.id,
                record.pid,
                record.cgroup_slot,
                record
                    .netns_slot
                    .map_or(String::new(), |s| format!(" and network namespace {s}"))
            ));
        }
    }
    let live: Vec<&Record> = records.iter().filter(|r| r.is_alive()).collect();
    // A running `skiff serve` holds this lock and owns the `serve-` claims; holding it
    // here keeps one from starting while gc decides which claims are leftovers.
    let serve_lock = skiff_pool::try_lock_file(&data.join(skiff_pool::SERVE_LOCK))?;
    let daemon_running = serve_lock.is_none();
    let owned = |owner: &str| {
        live.iter().any(|r| r.id == owner)
            || (daemon_running && owner.starts_with(skiff_pool::SERVE_OWNER_PREFIX))
    };

    let cgroups = CgroupPool::open(data)?;
    let mut claimed = Vec::new();
    for claim in cgroups.claims()? {
        if owned(&claim.owner) || claim.age < CLAIM_GRACE {
            claimed.push(claim.slot);
            continue;
        }
        let killed = cgroups.empty(claim.slot)?;
        cgroups.unclaim(claim.slot)?;
        removed.push(format!(
            "cgroup slot {} claimed by vanished sandbox {} (killed {killed} processes)",
            claim.slot, claim.owner
        ));
    }
    for slot in (0..cgroups.size()?).filter(|s| !claimed.contains(s)) {
        let stray = cgroups.empty(slot).unwrap_or(0);
        if stray > 0 {
            removed.push(format!(
                "{stray} stray processes in free cgroup slot {slot}"
            ));
        }
    }
    let netns = NetnsPool::open(data)?;
    for claim in netns.claims()? {
        if !owned(&claim.owner) && claim.age >= CLAIM_GRACE {
            netns.release(claim.slot)?;
            removed.push(format!(
                "network namespace {} claimed by vanished sandbox {}",
                claim.slot, claim.owner
            ));
        }
    }
    for path in skiff_daemon::remove_scratch(data, daemon_running)? {
        removed.push(format!(
            "scratch of an unfinished deploy {}",
            path.display()
        ));
    }
    for line in skiff_store::Store::open(data)?.gc()? {
        removed.push(line);
    }
    if pools {
        if daemon_running {
            bail!("cannot remove the pools: a skiff serve is using this data directory");
        }
        if let Some(r) = live.first() {
            bail!(
                "cannot remove the pools: sandbox {} is running (skiff kill it first)",
                r.id
            );
        }
        for dir in cgroups.destroy()? {
            removed.push(format!("cgroup {}", dir.display()));
        }
        for ns in netns.destroy()? {
            removed.push(format!("network namespace {}", ns.display()));
        }
        if skiff_sandbox::devices::remove(data)? {
            removed.push(format!("/dev template {}", data.join("pool/dev").display()));
        }
        if skiff_pool::remove_run_dir(data)? {
            removed.push(format!("run directory {}", data.join("run").display()));
        }
    }
    for line in &removed {
        println!("removed {line}");
    }
    println!("gc: removed {} item(s)", removed.len());
    Ok(())
}

pub fn pool(data: &Path, size: Option<usize>) -> Result<()> {
    let cgroups = CgroupPool::open(data)?;
    if let Some(size) = size {
        if !(1..=65536).contains(&size) {
            bail!("--size {size} is out of range: it must be between 1 and 65536");
        }
        cgroups.resize(size)?;
    }
    let claims = cgroups.claims()?;
    println!("cgroup: {}", cgroups.layout());
    println!("pool: {}", cgroups.name());
    println!("size: {}", cgroups.size()?);
    println!("in use: {}", claims.len());
    for dir in cgroups.dirs(0) {
        if let Some(root) = dir.parent() {
            println!("path: {}", root.display());
        }
    }
    Ok(())
}

fn pidfd_open(pid: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot open the sandbox's process");
    }
    // SAFETY: a fresh descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until the process behind `pidfd` has exited (it need not be our child).
fn wait_exit(pidfd: &OwnedFd, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while Instant::now() < deadline {
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } > 0 {
            return Ok(());
        }
    }
    bail!("the sandbox did not exit within {timeout:?}")
}

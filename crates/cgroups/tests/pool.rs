//! The cgroup pool against the host's real cgroup hierarchies (run as root).

use std::path::PathBuf;

use skiff_cgroups::{CgroupPool, Limits};

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-cgroups-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn slots_are_created_claimed_released_and_destroyed() {
    let data = data_dir("lifecycle");
    let pool = CgroupPool::open(&data).unwrap();
    pool.resize(3).unwrap();
    let dirs: Vec<PathBuf> = (0..3).flat_map(|s| pool.dirs(s)).collect();
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");

    let limits = Limits {
        memory_bytes: 64 << 20,
        cpus: 0.25,
        pids: 10,
    };
    let (a, _) = pool.acquire("a", &limits).unwrap();
    let (b, _) = pool.acquire("b", &limits).unwrap();
    let (c, _) = pool.acquire("c", &limits).unwrap();
    assert_ne!(a.index, b.index);
    assert_ne!(b.index, c.index);
    let err = pool.acquire("d", &limits).unwrap_err().to_string();
    assert!(err.contains("exhausted"), "{err}");
    assert_eq!(pool.claims().unwrap().len(), 3);

    // The limits reached the kernel's files, whatever the layout.
    let files: Vec<String> = pool
        .dirs(a.index)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            [
                "memory.limit_in_bytes",
                "memory.max",
                "pids.max",
                "cpu.cfs_quota_us",
                "cpu.max",
            ]
            .contains(&n)
        })
        .map(|p| std::fs::read_to_string(p).unwrap().trim().to_owned())
        .collect();
    assert!(files.contains(&(64u64 << 20).to_string()), "{files:?}");
    assert!(files.contains(&"10".to_owned()), "{files:?}");
    assert!(
        files.contains(&"25000".to_owned()) || files.contains(&"25000 100000".to_owned()),
        "{files:?}"
    );

    // Shrinking below a claimed slot is refused; destroying with claims too.
    assert!(pool.resize(1).is_err());
    assert!(pool.destroy().is_err());

    for slot in [a.index, b.index, c.index] {
        pool.release(slot).unwrap();
    }
    assert!(pool.claims().unwrap().is_empty());
    pool.destroy().unwrap();
    assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    for dir in pool.dirs(0) {
        assert!(
            !dir.parent().unwrap().exists(),
            "pool root {dir:?} left behind"
        );
    }
    skiff_pool::remove_run_dir(&data).unwrap();
    std::fs::remove_dir_all(&data).unwrap();
}

#[test]
fn release_kills_what_is_left() {
    let data = data_dir("release");
    let pool = CgroupPool::open(&data).unwrap();
    pool.resize(1).unwrap();
    let (slot, _) = pool.acquire("x", &Limits::default()).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // Put the sleeper into every hierarchy of the slot, as a leftover would be.
    for dir in pool.dirs(slot.index) {
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    }
    assert_eq!(pool.procs(slot.index).unwrap(), vec![child.id() as i32]);
    pool.release(slot.index).unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the leftover was killed");
    assert!(pool.procs(slot.index).unwrap().is_empty());
    pool.destroy().unwrap();
    skiff_pool::remove_run_dir(&data).unwrap();
    std::fs::remove_dir_all(&data).unwrap();
}

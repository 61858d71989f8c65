//! The spawner process for multi-threaded callers: sandboxes it starts are the caller's
//! children (exit status through the pidfd), errors come back as from a local spawner,
//! and many threads can spawn at once. Runs as root.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use skiff_cgroups::Entry;
use skiff_sandbox::{ExitStatus, RemoteSpawner, SpawnErrorKind, Spec};

type Check = fn(&RemoteSpawner, &Path, &Path);

fn main() {
    // First, while this process has one thread.
    let remote = RemoteSpawner::start().expect("start the spawner");
    let dir = std::env::temp_dir().join(format!("skiff-remote-{}", std::process::id()));
    let rootfs = dir.join("rootfs");
    for d in ["bin", "proc", "dev", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("busybox-static is needed");
    let dev = skiff_sandbox::devices::ensure(&dir).unwrap();

    let checks: [(&str, Check); 4] = [
        (
            "output and exit status reach the caller",
            output_and_exit_status,
        ),
        (
            "a missing command is NotFound and leaves no zombie",
            missing_command,
        ),
        ("threads spawn concurrently", concurrent_spawns),
        ("sandboxes die with the caller's kill", kill_through_pidfd),
    ];
    for (name, check) in checks {
        check(&remote, &rootfs, &dev);
        println!("test {name} ... ok");
    }
    drop(remote);
    skiff_sandbox::devices::remove(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        checks.len()
    );
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two new descriptors we own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn spec(rootfs: &Path, dev: &Path, script: &str, stdout: &OwnedFd) -> Spec {
    let argv = vec![
        "/bin/busybox".into(),
        "sh".into(),
        "-c".into(),
        script.into(),
    ];
    let mut spec = Spec::new(
        "remote-test",
        PathBuf::from(rootfs),
        dev.to_path_buf(),
        argv,
    );
    spec.stdio = [0, stdout.as_raw_fd(), 2];
    spec
}

fn output_and_exit_status(remote: &RemoteSpawner, rootfs: &Path, dev: &Path) {
    let (read, write) = pipe();
    let child = remote
        .spawn(
            &spec(rootfs, dev, "echo hello from $$; exit 3", &write),
            &Entry::default(),
        )
        .unwrap();
    drop(write);
    let mut out = String::new();
    std::fs::File::from(read).read_to_string(&mut out).unwrap();
    assert_eq!(out, "hello from 1\n");
    assert_eq!(child.wait().unwrap(), ExitStatus::Exited(3));
}

fn missing_command(remote: &RemoteSpawner, rootfs: &Path, dev: &Path) {
    let (_read, write) = pipe();
    let mut s = spec(rootfs, dev, "", &write);
    s.argv = vec!["/bin/nope".into()];
    let err = remote.spawn(&s, &Entry::default()).unwrap_err();
    assert_eq!(err.kind, SpawnErrorKind::NotFound, "{}", err.message);
    // SAFETY: a non-blocking wait for any child: there must be none left.
    let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
    assert!(r <= 0, "a zombie child {r} was left");
}

fn concurrent_spawns(remote: &RemoteSpawner, rootfs: &Path, dev: &Path) {
    std::thread::scope(|scope| {
        for t in 0..4 {
            scope.spawn(move || {
                for i in 0..10 {
                    let (read, write) = pipe();
                    let child = remote
                        .spawn(
                            &spec(rootfs, dev, &format!("echo {t}-{i}; exit {i}"), &write),
                            &Entry::default(),
                        )
                        .unwrap();
                    drop(write);
                    let mut out = String::new();
                    std::fs::File::from(read).read_to_string(&mut out).unwrap();
                    assert_eq!(out, format!("{t}-{i}\n"));
                    assert_eq!(child.wait().unwrap(), ExitStatus::Exited(i));
                }
            });
        }
    });
}

fn kill_through_pidfd(remote: &RemoteSpawner, rootfs: &Path, dev: &Path) {
    let (_read, write) = pipe();
    let child = remote
        .spawn(
            &spec(rootfs, dev, "exec sleep 60", &write),
            &Entry::default(),
        )
        .unwrap();
    child.kill(libc::SIGKILL).unwrap();
    assert_eq!(child.wait().unwrap(), ExitStatus::Signaled(libc::SIGKILL));
}

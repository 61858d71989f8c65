//! skiff on a pure cgroup v2 kernel. This host's v2 hierarchy has no controllers, so
//! `tests/vm/run.sh` boots Debian's cloud kernel in QEMU (software emulation) with skiff
//! in the initramfs and checks limits, OOM, the pids limit, CPU quota, CLONE_INTO_CGROUP
//! and clean-up there. Needs qemu-system-x86 (scripts/deps.sh installs it); set
//! SKIFF_SKIP_VM=1 to skip on a machine without it.

use std::path::Path;
use std::process::Command;

#[test]
fn cgroup_v2_in_a_vm() {
    if std::env::var("SKIFF_SKIP_VM").is_ok_and(|v| v == "1") {
        eprintln!("skipped: SKIFF_SKIP_VM=1");
        return;
    }
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    assert!(
        qemu.is_ok_and(|o| o.status.success()),
        "qemu-system-x86_64 is missing: install qemu-system-x86 (scripts/deps.sh does), or set SKIFF_SKIP_VM=1"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let probe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vm-probe");
    let built = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&probe)
        .arg(repo.join("tests/probe/probe.c"))
        .status()
        .expect("gcc is needed to build tests/probe/probe.c");
    assert!(built.success());
    let out = Command::new("bash")
        .arg(repo.join("tests/vm/run.sh"))
        .arg(env!("CARGO_BIN_EXE_skiff"))
        .arg(&probe)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    println!("{log}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the VM test failed:\n{log}");
    assert!(log.contains("SKIFF-VM-RESULT: PASS"));
    assert!(!log.contains("FAIL -"));
}

//! skiff on a pure cgroup v2 kernel. This host's v2 hierarchy has no controllers, so
//! `tests/vm/run.sh` boots Debian's cloud kernel in QEMU (software emulation) with this
//! skiff binary in the initramfs and checks, there: the cgroup layout, the cgroup namespace,
//! memory.max/pids.max/cpu.max, OOM kills, the pids limit, the CPU quota,
//! clone3(CLONE_INTO_CGROUP), kill and `gc --pools`. Needs qemu-system-x86, busybox-static,
//! cpio and gcc (CI and scripts/deps.sh install them); set SKIFF_SKIP_VM=1 to skip.

use std::path::Path;
use std::process::Command;

#[test]
fn cgroup_v2_in_a_vm() {
    if std::env::var("SKIFF_SKIP_VM").is_ok_and(|v| v == "1") {
        eprintln!("cgroup_v2_in_a_vm: skipped (SKIFF_SKIP_VM=1)");
        return;
    }
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    assert!(
        qemu.is_ok_and(|o| o.status.success()),
        "qemu-system-x86_64 is not installed: install qemu-system-x86 (CI installs it; \
         so does scripts/deps.sh), or set SKIFF_SKIP_VM=1 to skip this test"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // A static CPU-time probe for the cpu.max check.
    let probe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vm-probe");
    let built = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&probe)
        .arg(repo.join("tests/probe/probe.c"))
        .status()
        .expect("gcc (and libc6-dev) is needed to build tests/probe/probe.c");
    assert!(built.success(), "cannot build tests/probe/probe.c");
    let out = Command::new("bash")
        .arg(repo.join("tests/vm/run.sh"))
        .arg(env!("CARGO_BIN_EXE_skiff"))
        .arg(&probe)
        .output()
        .expect("cannot run tests/vm/run.sh");
    let log = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    // The whole console log (libtest shows it when the test fails, or with --nocapture).
    println!("{log}{err}");
    let failures: Vec<&str> = log.lines().filter(|l| l.starts_with("FAIL - ")).collect();
    assert!(
        out.status.success() && log.contains("SKIFF-VM-RESULT: PASS") && failures.is_empty(),
        "the VM test failed (run.sh: {}; console log above):\n{}\n{}",
        out.status,
        failures.join("\n"),
        err.trim_end()
    );
}

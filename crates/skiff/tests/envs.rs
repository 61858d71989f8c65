//! Function environments: manifests, the hard-linked store, runtimes, and running
//! functions on their environments inside sandboxes.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{stderr, stdout, Data};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// A copy of an example under the data directory, renamed, so tests can change it.
fn function(data: &Data, example_name: &str, name: &str) -> PathBuf {
    let dir = data.dir.join("fn").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(example(example_name)).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let manifest = std::fs::read_to_string(dir.join("skiff.yaml")).unwrap();
    let renamed = manifest.replacen(
        &format!("name: {example_name}"),
        &format!("name: {name}"),
        1,
    );
    std::fs::write(dir.join("skiff.yaml"), renamed).unwrap();
    dir
}

fn build(data: &Data, dir: &Path) -> Output {
    let out = data.cmd().arg("build").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "build {}: {}",
        dir.display(),
        stderr(&out)
    );
    out
}

fn run_hello_python(data: &Data) -> Output {
    data.cmd()
        .args([
            "run",
            "--env",
            "hello-python",
            "--",
            "/usr/bin/python3",
            "/code/main.py",
        ])
        .output()
        .unwrap()
}

fn assert_hello_python_runs(data: &Data) {
    let out = run_hello_python(data);
    assert!(stdout(&out).contains("hello, skiff"), "{}", stderr(&out));
}

fn env_root(data: &Data, id: &str) -> PathBuf {
    data.dir.join("envs").join(id).join("root")
}

/// name -> (id, unique bytes as printed) from `skiff envs`.
fn envs(data: &Data) -> Vec<(String, String, String)> {
    let out = data.skiff(&["envs"]);
    stdout(&out)
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("store on disk"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_owned(),
                f[1].to_owned(),
                format!("{} {}", f[5], f[6]),
            )
        })
        .collect()
}

fn id_of(data: &Data, name: &str) -> String {
    envs(data)
        .into_iter()
        .find(|(n, _, _)| n == name)
        .unwrap()
        .1
}

#[test]
fn hello_functions_run_on_their_environments() {
    let data = Data::new("envs-hello", 4);
    let py = function(&data, "hello-python", "hello-python");
    let node = function(&data, "hello-node", "hello-node");
    let bin = function(&data, "echo-binary", "echo-binary");
    common::cc(&bin.join("echo.c"), &bin.join("echo"));
    for dir in [&py, &node, &bin] {
        build(&data, dir);
    }
    let out = run_hello_python(&data);
    assert_eq!(
        stdout(&out),
        "{\"greeting\": \"hello, skiff\", \"runtime\": \"python3\"}\n",
        "{}",
        stderr(&out)
    );
    let out = data
        .cmd()
        .args([
            "run",
            "--env",
            "hello-node",
            "--memory",
            "256M",
            "--",
            "/usr/bin/node",
            "/code/index.js",
        ])
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "{\"greeting\":\"hello, skiff\",\"runtime\":\"node\"}\n",
        "{}",
        stderr(&out)
    );
    let mut child = data
        .cmd()
        .args(["run", "--env", "echo-binary", "--", "/code/echo"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"ping\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "ping\n");
    // The environment holds no shell and no package manager.
    let root = env_root(&data, &id_of(&data, "hello-python"));
    for absent in ["bin/sh", "usr/bin/pip3", "usr/bin/apt", "usr/share/doc"] {
        assert!(
            !root.join(absent).exists(),
            "{absent} in the python environment"
        );
    }
}

#[test]
fn identical_files_are_one_inode_across_environments() {
    let data = Data::new("envs-dedup", 4);
    let a = function(&data, "hello-python", "fn-a");
    let b = function(&data, "hello-python", "fn-b");
    std::fs::write(
        b.join("main.py"),
        "def handle(event, context):\n    return 'b'\n",
    )
    .unwrap();
    std::fs::write(b.join("extra.py"), "X = 1\n").unwrap();
    build(&data, &a);
    let out = build(&data, &b);
    assert!(
        !stdout(&out).contains("runtime layer built"),
        "{}",
        stdout(&out)
    );
    let (ra, rb) = (
        env_root(&data, &id_of(&data, "fn-a")),
        env_root(&data, &id_of(&data, "fn-b")),
    );
    for shared in [
        "usr/bin/python3.11",
        "usr/lib/python3.11/os.py",
        "lib/x86_64-linux-gnu/libc.so.6",
    ] {
        let (ma, mb) = (
            std::fs::metadata(ra.join(shared)).unwrap(),
            std::fs::metadata(rb.join(shared)).unwrap(),
        );
        assert_eq!(
            (ma.dev(), ma.ino()),
            (mb.dev(), mb.ino()),
            "{shared} is not shared"
        );
        assert!(ma.nlink() >= 4, "{shared}: {} links", ma.nlink());
    }
    assert_ne!(
        std::fs::metadata(ra.join("code/main.py")).unwrap().ino(),
        std::fs::metadata(rb.join("code/main.py")).unwrap().ino()
    );
    // The second function adds only its own code.
    let unique = envs(&data)
        .into_iter()
        .find(|(n, _, _)| n == "fn-b")
        .unwrap()
        .2;
    assert!(unique.ends_with(" B"), "fn-b adds {unique}");
    // Environment files are read-only objects.
    assert!(
        std::fs::write(rb.join("usr/lib/python3.11/os.py"), "x").is_err() || nix_root_can_write()
    );
}

/// Root bypasses file modes; the sandbox's read-only mount is what protects the tree.
fn nix_root_can_write() -> bool {
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_corrupted_store_file_is_detected() {
    let data = Data::new("envs-fsck", 4);
    let f = function(&data, "hello-python", "hello-python");
    build(&data, &f);
    let out = data.skiff(&["fsck"]);
    assert!(out.status.success(), "{}", stdout(&out));
    let root = env_root(&data, &id_of(&data, "hello-python"));
    let victim = root.join("usr/lib/python3.11/json/__init__.py");
    let mut text = std::fs::read(&victim).unwrap();
    text[0] ^= 0x20;
    std::fs::write(&victim, text).unwrap();
    let out = data.skiff(&["fsck"]);
    assert_eq!(out.status.code(), Some(1));
    let report = stdout(&out);
    assert!(
        report.contains("corrupt: ") && report.contains("1 corrupt"),
        "{report}"
    );
}

#[test]
fn an_interrupted_build_leaves_nothing_visible_and_can_be_retried() {
    let data = Data::new("envs-interrupt", 4);
    let f = function(&data, "hello-python", "hello-python");
    let mut build_cmd = data.cmd().arg("build").arg(&f).spawn().unwrap();
    // The cold runtime layer takes most of a second: kill the build in its middle.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !data.dir.join("store").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(150));
    build_cmd.kill().unwrap();
    build_cmd.wait().unwrap();
    assert!(
        envs(&data).iter().all(|(n, _, _)| n != "hello-python"),
        "a half-built environment is visible"
    );
    let out = data
        .cmd()
        .args([
            "run",
            "--env",
            "hello-python",
            "--",
            "/usr/bin/python3",
            "-c",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no environment named"),
        "{}",
        stderr(&out)
    );
    let out = data.skiff(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    build(&data, &f);
    assert_hello_python_runs(&data);
    assert!(data.skiff(&["fsck"]).status.success());
}

#[test]
fn gc_frees_files_no_environment_uses() {
    let data = Data::new("envs-gc", 4);
    let a = function(&data, "echo-binary", "echo-a");
    std::fs::copy("/bin/busybox", a.join("echo")).unwrap();
    std::fs::write(a.join("only-here.txt"), "unique bytes of echo-a\n").unwrap();
    build(&data, &a);
    let out = data.skiff(&["envs", "--rm", "echo-a"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = data.skiff(&["gc"]);
    assert!(stdout(&out).contains("store object"), "{}", stdout(&out));
    let store_files = walk(&data.dir.join("store"));
    assert!(store_files.is_empty(), "left in the store: {store_files:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn bad_manifests_name_the_key_line_and_column() {
    let data = Data::new("envs-manifest", 1);
    let cases = [
        (
            "name: a\nruntime: python3\nhandler: main.handle\nlimts: {}\n",
            "skiff.yaml:4:1: unknown field `limts`",
        ),
        (
            "name: a\nruntime: python3\nhandler: main.handle\nlimits:\n  memory: lots\n",
            "skiff.yaml:5:11: limits.memory: invalid size \"lots\"",
        ),
        (
            "name: a\nruntime: cobol\nhandler: main.handle\n",
            "skiff.yaml:2:10: runtime: unknown variant `cobol`",
        ),
        (
            "name: a\nruntime: python3\nhandler: main.handle\nscale:\n  max_instances: 0\n",
            "skiff.yaml:5:18: scale.max_instances: must be at least 1",
        ),
        ("name: a\nruntime: python3\n", "missing field `handler`"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let dir = data.dir.join(format!("bad{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("skiff.yaml"), text).unwrap();
        for verb in ["validate", "build"] {
            let out = data.cmd().arg(verb).arg(&dir).output().unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(125), "{verb} {text:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(expected), "{verb}: {err} lacks {expected:?}");
        }
    }
    let out = data
        .cmd()
        .arg("validate")
        .arg(example("hello-python"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn broken_functions_are_refused_at_validate_and_build_naming_the_file() {
    let data = Data::new("envs-broken", 1);
    for broken in common::broken_functions(&data.dir.join("fn")) {
        for verb in ["validate", "build"] {
            let out = data.cmd().arg(verb).arg(&broken.dir).output().unwrap();
            let err = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(125),
                "{verb} {:?}: {err}",
                broken.dir
            );
            assert_eq!(err, format!("skiff: error: {}\n", broken.message), "{verb}");
        }
    }
    // Nothing was built: the checks come first.
    assert!(envs(&data).is_empty(), "{:?}", envs(&data));

    // What the checks accept: a package, an ES module named in full, a code directory,
    // a link inside the code, an executable ELF file.
    let fine = data.dir.join("fine");
    // (name, manifest, a file of its code and the file's text)
    let cases = [
        (
            "py-package",
            "runtime: python3\nhandler: app.main.handle\ncode: src\n",
            "src/app/main/__init__.py",
            "def handle(e, c): pass\n",
        ),
        (
            "node-mjs",
            "runtime: node\nhandler: index.mjs.handler\n",
            "index.mjs",
            "export const handler = async () => 1;\n",
        ),
        (
            "node-dir",
            "runtime: node\nhandler: lib.handler\n",
            "lib/index.js",
            "exports.handler = async () => 1;\n",
        ),
        (
            "bin-link",
            "runtime: binary\nhandler: ./run\n",
            "README",
            "run links to target/busybox\n",
        ),
    ];
    for (name, manifest, file, text) in cases {
        let dir = fine.join(name);
        std::fs::create_dir_all(dir.join(file).parent().unwrap()).unwrap();
        std::fs::write(dir.join("skiff.yaml"), format!("name: {name}\n{manifest}")).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }
    std::fs::create_dir_all(fine.join("bin-link/target")).unwrap();
    std::fs::copy("/bin/busybox", fine.join("bin-link/target/busybox")).unwrap();
    std::os::unix::fs::symlink("target/busybox", fine.join("bin-link/run")).unwrap();
    for (name, ..) in cases {
        let out = data
            .cmd()
            .arg("validate")
            .arg(fine.join(name))
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert!(stdout(&out).contains(": ok ("), "{name}: {}", stdout(&out));
    }
}

#[test]
fn packages_from_pypi_and_npm_are_one_shared_layer() {
    let data = Data::new("envs-packages", 4);
    let mut roots = Vec::new();
    for name in ["six-a", "six-b"] {
        let dir = data.dir.join("fn").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = format!(
            "name: {name}\nruntime: python3\nhandler: main.handle\npackages: [six==1.16.0]\n"
        );
        std::fs::write(dir.join("skiff.yaml"), manifest).unwrap();
        std::fs::write(
            dir.join("main.py"),
            format!("import six\nprint('{name}', six.__version__)\n"),
        )
        .unwrap();
        build(&data, &dir);
        let out = data
            .cmd()
            .args([
                "run",
                "--env",
                name,
                "--",
                "/usr/bin/python3",
                "/code/main.py",
            ])
            .output()
            .unwrap();
        assert_eq!(stdout(&out), format!("{name} 1.16.0\n"), "{}", stderr(&out));
        roots.push(env_root(&data, &id_of(&data, name)));
    }
    let six = "usr/lib/python3/dist-packages/six.py";
    assert_eq!(
        std::fs::metadata(roots[0].join(six)).unwrap().ino(),
        std::fs::metadata(roots[1].join(six)).unwrap().ino()
    );

    let dir = data.dir.join("fn").join("isnum");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("skiff.yaml"),
        "name: isnum\nruntime: node\nhandler: index.handler\npackages: [is-number@7.0.0]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("index.js"),
        "console.log(require('is-number')(5));\n",
    )
    .unwrap();
    build(&data, &dir);
    let out = data
        .cmd()
        .args([
            "run",
            "--env",
            "isnum",
            "--memory",
            "256M",
            "--",
            "/usr/bin/node",
            "/code/index.js",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "true\n", "{}", stderr(&out));
}

fn sh(script: &str) {
    let status = Command::new("sh").arg("-ec").arg(script).status().unwrap();
    assert!(status.success(), "{script}");
}

#[test]
fn oci_images_import_with_their_whiteouts() {
    let data = Data::new("envs-oci", 4);
    let dir = data.dir.join("images");
    std::fs::create_dir_all(&dir).unwrap();
    // Two layers made by umoci: the second deletes a file and a directory.
    sh(&format!(
        "cd {d}; umoci init --layout img; umoci new --image img:t
         umoci unpack --image img:t b >/dev/null; mkdir -p b/rootfs/bin b/rootfs/sub
         cp /bin/busybox b/rootfs/bin/; ln -s busybox b/rootfs/bin/sh
         echo a > b/rootfs/a; echo gone > b/rootfs/gone; echo x > b/rootfs/sub/x
         umoci repack --image img:t b; rm -rf b; umoci unpack --image img:t b >/dev/null
         rm b/rootfs/gone; rm -r b/rootfs/sub; echo c > b/rootfs/c
         umoci repack --image img:t b; rm -rf b
         tar -C img -cf oci-archive.tar .",
        d = dir.display()
    ));
    // A docker save tarball, written by hand in that format.
    sh(&format!(
        "cd {d}; mkdir -p ds/l1/bin ds/l2 && cp /bin/busybox ds/l1/bin/ && echo one > ds/l1/one && echo two > ds/l1/two
         touch ds/l2/.wh.two && echo three > ds/l2/three
         tar -C ds/l1 -cf ds/layer1.tar . && tar -C ds/l2 -cf ds/layer2.tar .
         echo '[{{\"Config\":\"config.json\",\"RepoTags\":[\"t:1\"],\"Layers\":[\"layer1.tar\",\"layer2.tar\"]}}]' > ds/manifest.json
         echo '{{}}' > ds/config.json && tar -C ds -cf docker-save.tar manifest.json config.json layer1.tar layer2.tar",
        d = dir.display()
    ));
    let cases = [
        (
            "oci-layout",
            dir.join("img"),
            "a\nc\n",
            "/a /c /gone /sub/x",
        ),
        (
            "oci-archive",
            dir.join("oci-archive.tar"),
            "a\nc\n",
            "/a /c /gone /sub/x",
        ),
        (
            "docker-save",
            dir.join("docker-save.tar"),
            "one\nthree\n",
            "/one /three /two",
        ),
    ];
    for (name, image, expected, files) in cases {
        let out = data
            .cmd()
            .arg("import")
            .arg(&image)
            .args(["--name", name])
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let script = format!("for f in {files}; do cat $f 2>/dev/null || true; done");
        let out = data
            .cmd()
            .args([
                "run",
                "--env",
                name,
                "--",
                "/bin/busybox",
                "sh",
                "-c",
                &script,
            ])
            .output()
            .unwrap();
        assert_eq!(stdout(&out), expected, "{name}: {}", stderr(&out));
    }
    // busybox from three images is one store object.
    let inode = |name: &str| {
        std::fs::metadata(env_root(&data, &id_of(&data, name)).join("bin/busybox"))
            .unwrap()
            .ino()
    };
    assert_eq!(inode("oci-layout"), inode("docker-save"));
    let out = data
        .cmd()
        .arg("import")
        .arg(&dir)
        .args(["--name", "nothing"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("neither an OCI layout"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn concurrent_builds_of_one_function_agree() {
    let data = Data::new("envs-concurrent", 4);
    let f = function(&data, "hello-python", "hello-python");
    let builds: Vec<_> = (0..4)
        .map(|_| {
            data.cmd()
                .arg("build")
                .arg(&f)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for b in builds {
        let out = b.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let listed: Vec<_> = envs(&data)
        .into_iter()
        .filter(|(n, _, _)| n == "hello-python")
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let leftovers: Vec<_> = std::fs::read_dir(data.dir.join("envs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(data.skiff(&["fsck"]).status.success());
    assert_hello_python_runs(&data);
}

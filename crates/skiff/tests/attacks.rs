//! Attacks on `skiff serve` and `skiff import` that must fail. Each case asserts the
//! refusal and that nothing outside was touched: path traversal through every route
//! that takes a name or an id, hostile deploy tarballs and images, 50 concurrent deploys
//! of one name, async calls past a full queue, slowloris and partial bodies. Victims
//! live in a directory of their own beside the data directory, never in system paths.
//! Real daemon, real HTTP over TCP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::daemon::{assert_nothing_left, deploy, http, wait_for, Daemon};
use common::{stderr, stdout, Data};

/// What the daemon allows a request's head, and a body between two bytes.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_IDLE: Duration = Duration::from_secs(10);
/// Slack on top of a timeout for the daemon to notice and close.
const SLACK: Duration = Duration::from_secs(5);
/// Written in the victims' secret files: it must never show in an answer or the store.
const SECRET: &str = "TOPSECRET-victim-bytes";

/// A directory beside the data directory (both in the temp dir, so `../../NAME` from
/// any of the daemon's own directories reaches it) holding what an attacker would
/// delete, read or overwrite.
struct Victims {
    dir: PathBuf,
}

impl Victims {
    fn new(test: &str) -> Victims {
        let dir = std::env::temp_dir().join(format!("skiff-victims-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |rel: &str, text: &str, mode: u32| {
            let path = dir.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("victim.json", "{\"name\": \"victim\"}", 0o644);
        write("victim.log", "{}\n", 0o644);
        write("victim.request", "{}", 0o644);
        // A directory that looks like a function's source and a session's state.
        write("victim/function", "victim", 0o644);
        write("victim/keep", "keep", 0o644);
        write("secret", SECRET, 0o600);
        write("secret.yaml", &format!("name: {SECRET}\n"), 0o600);
        write("hostdir/secret.txt", SECRET, 0o600);
        write("hostdir/main", SECRET, 0o755);
        std::fs::create_dir_all(dir.join("empty")).unwrap();
        Victims { dir }
    }

    /// `../../` then this directory's name, then `rest`: from `DATA/<dir>/`, the victims.
    fn traversal(&self, rest: &str) -> String {
        format!(
            "../../{}/{rest}",
            self.dir.file_name().unwrap().to_str().unwrap()
        )
    }

    /// Every entry below the directory: path, kind, bytes, links, mode.
    fn snapshot(&self) -> Vec<(PathBuf, String, Vec<u8>, u64, u32)> {
        let mut all = Vec::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = path.symlink_metadata().unwrap();
                let bytes = if meta.is_file() {
                    std::fs::read(&path).unwrap()
                } else {
                    Vec::new()
                };
                if meta.is_dir() {
                    stack.push(path.clone());
                }
                let kind = format!("{:?}", meta.file_type());
                all.push((path, kind, bytes, meta.nlink(), meta.mode()));
            }
        }
        all.sort();
        all
    }
}

impl Drop for Victims {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `.incoming-*` scratch of deploys in the data directory.
fn scratch(data: &Data) -> Vec<String> {
    std::fs::read_dir(data.dir.join("functions"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".incoming-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Files below `dir` whose bytes hold `needle` (the store, environments, records...).
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() && meta.len() < (16 << 20) {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path);
                }
            }
        }
    }
    found
}

#[test]
fn names_and_ids_that_climb_out_are_refused_on_every_route() {
    let data = Data::new("attack-names", 4);
    let victims = Victims::new("names");
    let before = victims.snapshot();
    let daemon = Daemon::start(&data);
    // A function of the daemon's own, which a name climbing to it must not reach either.
    let r = daemon.request("POST", "/v1/functions", &[], &sleeper());
    assert_eq!(r.status, 201, "{}", r.text());
    let raw = victims.traversal("victim");
    let encodings = [
        "..%2ffunctions%2fsleeper".into(),
        "..%2flogs%2fsleeper".into(),
        "..%2f..%2ffunctions%2fsleeper".into(),
        "%2e%2e%2ffunctions%2fsleeper".into(),
        raw.replace('/', "%2f"),
        raw.replace('/', "%2F"),
        raw.replace('/', "%2f").replace('.', "%2e"),
        raw.replace('/', "%252f"),
        raw.replace('/', "%252f").replace('.', "%252e"),
        raw.replace('/', "%5c"),
        format!("..%2f{}", raw.replace('/', "%2f")),
        "..".into(),
        "%2e%2e".into(),
        ".".into(),
        ".victim".into(),
        "Victim".into(),
        "victim%00".into(),
        "a".repeat(64),
    ];
    let routes = [
        ("GET", "/v1/functions/{}"),
        ("DELETE", "/v1/functions/{}"),
        ("GET", "/v1/functions/{}/logs"),
        ("GET", "/v1/functions/{}/logs?follow=true"),
        ("DELETE", "/v1/functions/{}/instances"),
        ("GET", "/v1/invocations/{}"),
        ("DELETE", "/v1/sessions/{}"),
        ("GET", "/v1/sessions/{}/state"),
        ("POST", "/v1/sessions/{}/checkpoint"),
        ("POST", "/v1/sessions/{}/close"),
        ("POST", "/fn/{}"),
        ("GET", "/fn/{}/deeper"),
        ("PUT", "/function/{}"),
        ("POST", "/function/{}/deeper"),
        ("POST", "/async/{}"),
        ("POST", "/async/{}/deeper"),
        ("POST", "/async-function/{}"),
        ("POST", "/async-function/{}/deeper"),
    ];
    let mut tried = 0;
    for (method, route) in routes {
        for name in &encodings {
            let path = route.replace("{}", name);
            let r = daemon.request(method, &path, &[], b"{}");
            assert_eq!(r.status, 400, "{method} {path}: {}", r.text());
            assert!(
                r.error().starts_with("invalid "),
                "{method} {path}: {}",
                r.text()
            );
            tried += 1;
        }
        // Not encoded: no route takes a name made of several segments.
        let path = route.replace("{}", &raw);
        let r = daemon.request(method, &path, &[], b"{}");
        assert!(
            r.status == 400 || r.status == 404,
            "{method} {path}: {}",
            r.text()
        );
        r.error();
    }
    assert!(tried > 200);
    assert_eq!(victims.snapshot(), before, "a victim was touched");
    assert_eq!(
        daemon.get("/v1/functions/sleeper").status,
        200,
        "the function is gone"
    );
    let r = daemon.request("POST", "/fn/sleeper", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (200, "done"));
    assert_eq!(daemon.get("/healthz").status, 200);
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// One tar entry as an attacker writes it: any path (written into the header as it
/// is, `..` and `/` included), any type, mode and link target.
struct Item {
    path: String,
    kind: tar::EntryType,
    mode: u32,
    link: Option<String>,
    data: Vec<u8>,
}

fn file(path: &str, data: &[u8], mode: u32) -> Item {
    Item {
        path: path.into(),
        kind: tar::EntryType::Regular,
        mode,
        link: None,
        data: data.to_vec(),
    }
}

fn link(path: &str, kind: tar::EntryType, target: &str) -> Item {
    Item {
        path: path.into(),
        kind,
        mode: 0o777,
        link: Some(target.into()),
        data: Vec::new(),
    }
}

fn special(path: &str, kind: tar::EntryType) -> Item {
    Item {
        path: path.into(),
        kind,
        mode: 0o666,
        link: None,
        data: Vec::new(),
    }
}

fn tarball(items: &[Item]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for item in items {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(item.kind);
        header.set_mode(item.mode);
        header.set_size(item.data.len() as u64);
        header.set_mtime(0);
        if let Some(target) = &item.link {
            header.set_link_name_literal(target).unwrap();
        }
        if matches!(item.kind, tar::EntryType::Char | tar::EntryType::Block) {
            header.set_device_major(1).unwrap();
            header.set_device_minor(3).unwrap();
        }
        if item.path.len() <= 100 {
            let name = &mut header.as_old_mut().name;
            name.fill(0);
            name[..item.path.len()].copy_from_slice(item.path.as_bytes());
            header.set_cksum();
            tar.append(&header, &item.data[..]).unwrap();
        } else {
            // Long names go in a GNU extension entry, as tar writes them.
            tar.append_data(&mut header, &item.path, &item.data[..])
                .unwrap();
        }
    }
    tar.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A valid binary function named `evil`, to which each case adds its attack.
fn evil(manifest_rest: &str) -> Vec<Item> {
    vec![
        file(
            "skiff.yaml",
            format!("name: evil\nruntime: binary\nhandler: ./main\n{manifest_rest}").as_bytes(),
            0o644,
        ),
        file("main", &std::fs::read("/bin/true").unwrap(), 0o755),
    ]
}

/// A gzip bomb: a tar whose one file is 2 GiB of zeros, in 2 MiB of gzip (members of
/// 1 MiB of zeros, concatenated as gzip allows).
fn gzip_bomb() -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_path("main").unwrap();
    header.set_size(2 << 30);
    header.set_mode(0o755);
    header.set_cksum();
    let mut bomb = gzip(&tarball(&evil(""))[..1024]);
    bomb.extend(gzip(header.as_bytes()));
    let zeros = gzip(&vec![0u8; 1 << 20]);
    for _ in 0..2048 {
        bomb.extend_from_slice(&zeros);
    }
    bomb
}

#[test]
fn hostile_deploy_tarballs_are_refused_and_touch_nothing_outside() {
    let data = Data::new("attack-tars", 4);
    let victims = Victims::new("tars");
    let before = victims.snapshot();
    let daemon = Daemon::start(&data);
    let v = victims.dir.to_str().unwrap();
    let up = |rest: &str| format!("../../../{}", victims.traversal(rest));
    let with = |mut items: Vec<Item>, more: Vec<Item>| {
        items.extend(more);
        tarball(&items)
    };
    let many: Vec<Item> = (0..50_001)
        .map(|i| file(&format!("f{i}"), b"", 0o644))
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a .. entry",
            with(evil(""), vec![file(&up("pwned"), b"x", 0o644)]),
            "climbs out",
        ),
        (
            "a .. inside a path",
            with(evil(""), vec![file("a/../../pwned", b"x", 0o644)]),
            "climbs out",
        ),
        (
            "an absolute path",
            with(evil(""), vec![file(&format!("{v}/pwned"), b"x", 0o644)]),
            "absolute path",
        ),
        (
            "a symlink out, then a file through it",
            with(
                evil(""),
                vec![
                    link("out", tar::EntryType::Symlink, v),
                    file("out/pwned", b"x", 0o644),
                ],
            ),
            "symlink out points outside",
        ),
        (
            "a relative symlink out",
            with(
                evil(""),
                vec![link("up", tar::EntryType::Symlink, "../../../..")],
            ),
            "symlink up points outside",
        ),
        (
            "a symlink out through another symlink",
            with(
                evil(""),
                vec![
                    link("b", tar::EntryType::Symlink, "."),
                    link("a", tar::EntryType::Symlink, "b/.."),
                ],
            ),
            "symlink a points outside",
        ),
        (
            "a file written through a symlink",
            with(
                evil(""),
                vec![
                    file("sub/keep", b"", 0o644),
                    link("in", tar::EntryType::Symlink, "sub"),
                    file("in/x", b"x", 0o644),
                ],
            ),
            "below a symlink",
        ),
        (
            "a hard link to an absolute path on the host",
            with(
                evil(""),
                vec![link("hl", tar::EntryType::Link, &format!("{v}/secret"))],
            ),
            "hard link hl points outside",
        ),
        (
            "a hard link out with ..",
            with(
                evil(""),
                vec![link("hl", tar::EntryType::Link, &up("secret"))],
            ),
            "hard link hl points outside",
        ),
        (
            "a hard link through a symlink out",
            with(
                evil(""),
                vec![
                    link("d", tar::EntryType::Symlink, "."),
                    link("hl", tar::EntryType::Link, "d/main"),
                ],
            ),
            "hard link hl points outside",
        ),
        (
            "a character device",
            with(evil(""), vec![special("mem", tar::EntryType::Char)]),
            "device node",
        ),
        (
            "a block device",
            with(evil(""), vec![special("sda", tar::EntryType::Block)]),
            "device node",
        ),
        (
            "a fifo",
            with(evil(""), vec![special("pipe", tar::EntryType::Fifo)]),
            "fifo",
        ),
        (
            "a setuid file",
            with(evil(""), vec![file("suid", b"x", 0o4755)]),
            "setuid",
        ),
        (
            "a setgid file",
            with(evil(""), vec![file("sgid", b"x", 0o2755)]),
            "setgid",
        ),
        ("a gzip bomb", gzip_bomb(), "more than 1024 MiB"),
        (
            "too many files",
            with(evil(""), many),
            "more than 50000 entries",
        ),
        (
            "a very long path",
            with(evil(""), vec![file(&"d/".repeat(1000), b"", 0o644)]),
            "longer than 1024 bytes",
        ),
        (
            "a very long name",
            with(evil(""), vec![file(&"n".repeat(300), b"", 0o644)]),
            "longer than 255 bytes",
        ),
        (
            "skiff.yaml a symlink to a host file",
            tarball(&[
                link(
                    "skiff.yaml",
                    tar::EntryType::Symlink,
                    &format!("{v}/secret.yaml"),
                ),
                file("main", b"", 0o755),
            ]),
            "symlink skiff.yaml points outside",
        ),
        (
            "skiff.yaml a symlink to a file beside it",
            tarball(&[
                link("skiff.yaml", tar::EntryType::Symlink, "real.yaml"),
                file(
                    "real.yaml",
                    b"name: evil\nruntime: binary\nhandler: ./main\n",
                    0o644,
                ),
                file("main", &std::fs::read("/bin/true").unwrap(), 0o755),
            ]),
            "skiff.yaml is a symlink",
        ),
        (
            "the code: directory a symlink to a host directory",
            with(
                evil("code: src\n"),
                vec![link(
                    "src",
                    tar::EntryType::Symlink,
                    &format!("{v}/hostdir"),
                )],
            ),
            "symlink src points outside",
        ),
        (
            "the code: directory a host path",
            with(evil(&format!("code: {v}/hostdir\n")), vec![]),
            "must be a path inside the function's directory",
        ),
        (
            "not a tar at all",
            b"\x1f\x8bnot really gzip".repeat(100),
            "cannot be read",
        ),
    ];
    assert!(cases.len() >= 15);
    let hidden = [SECRET, data.dir.to_str().unwrap(), ".incoming"];
    for (what, body, expected) in &cases {
        let r = daemon.request("POST", "/v1/functions", &[], body);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let message = r.error();
        assert!(message.contains(expected), "{what}: {message}");
        for h in hidden {
            assert!(
                !message.contains(h),
                "{what}: the error shows {h:?}: {message}"
            );
        }
        assert_eq!(victims.snapshot(), before, "{what}: a victim was touched");
        assert_eq!(scratch(&data), Vec::<String>::new(), "{what}: scratch left");
        assert_eq!(
            daemon.get("/v1/functions/evil").status,
            404,
            "{what}: deployed"
        );
    }
    // A host directory by path is for the Unix socket only.
    let r = daemon.request("POST", &format!("/v1/functions?path={v}/hostdir"), &[], b"");
    assert_eq!(r.status, 403, "{}", r.text());
    // Nothing of the victims' was read into the store, an environment or a record.
    assert_eq!(
        files_holding(&data.dir, SECRET.as_bytes()),
        Vec::<PathBuf>::new()
    );
    // The same function without its attack deploys: the refusals were the attacks'.
    let r = daemon.request("POST", "/v1/functions", &[], &tarball(&evil("")));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(scratch(&data), Vec::<String>::new());
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// A `docker save` archive of `layers` (name, tar bytes), `manifest.json` listing
/// `listed` as its layers.
fn docker_archive(layers: &[(&str, Vec<u8>)], listed: &[&str]) -> Vec<u8> {
    let manifest =
        serde_json::json!([{ "Config": "config.json", "RepoTags": [], "Layers": listed }]);
    let mut items = vec![
        file("manifest.json", manifest.to_string().as_bytes(), 0o644),
        file("config.json", b"{}", 0o644),
    ];
    for (name, bytes) in layers {
        items.push(file(name, bytes, 0o644));
    }
    tarball(&items)
}

#[test]
fn hostile_images_are_refused_and_touch_nothing_outside() {
    let data = Data::new("attack-images", 1);
    let victims = Victims::new("images");
    let v = victims.dir.to_str().unwrap().to_owned();
    let layer = tarball(&[file("bin/x", SECRET.as_bytes(), 0o755)]);
    std::fs::write(victims.dir.join("layer.tar"), &layer).unwrap();
    let before = victims.snapshot();
    let images = data.dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    // An OCI layout directory whose layer blob is a symlink to a host file.
    let layout = images.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{}", "a".repeat(64)), "size": layer.len()}],
    });
    std::fs::write(blobs.join("b".repeat(64)), manifest.to_string()).unwrap();
    std::fs::write(blobs.join("c".repeat(64)), "{}").unwrap();
    std::os::unix::fs::symlink(victims.dir.join("layer.tar"), blobs.join("a".repeat(64))).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "b".repeat(64)), "size": 10}],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();

    let archive = |name: &str, bytes: Vec<u8>| {
        let path = images.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "a layer blob that is a symlink out",
            layout.clone(),
            "leads out of the image",
        ),
        (
            "a layer path that climbs out",
            archive(
                "climb.tar",
                docker_archive(&[], &[&format!("../../../../../..{v}/layer.tar")]),
            ),
            "leads out of the image",
        ),
        (
            "a layer path that is absolute",
            archive(
                "absolute.tar",
                docker_archive(&[], &[&format!("{v}/layer.tar")]),
            ),
            "leads out of the image",
        ),
        (
            "an archive entry that climbs out",
            archive(
                "entry.tar",
                tarball(&[file(&format!("../../../../..{v}/pwned"), b"x", 0o644)]),
            ),
            "climbs out",
        ),
        (
            "a layer entry below a symlink out",
            archive(
                "below.tar",
                docker_archive(
                    &[(
                        "layer.tar",
                        tarball(&[
                            link("etc", tar::EntryType::Symlink, &format!("{v}/empty")),
                            file("etc/pwned", b"x", 0o644),
                        ]),
                    )],
                    &["layer.tar"],
                ),
            ),
            "below the symlink etc",
        ),
        (
            "a layer entry that climbs out",
            archive(
                "layer-climb.tar",
                docker_archive(
                    &[(
                        "layer.tar",
                        tarball(&[file("a/../../../pwned", b"x", 0o644)]),
                    )],
                    &["layer.tar"],
                ),
            ),
            "climbs out of the image's root",
        ),
        (
            "a whiteout of ..",
            archive(
                "whiteout.tar",
                docker_archive(
                    &[("layer.tar", tarball(&[file("bin/.wh...", b"", 0o644)]))],
                    &["layer.tar"],
                ),
            ),
            "whiteout",
        ),
    ];
    for (what, image, expected) in &cases {
        let out = data.skiff(&["import", image.to_str().unwrap(), "--name", "evil"]);
        assert!(!out.status.success(), "{what}: imported: {}", stdout(&out));
        assert!(stderr(&out).contains(expected), "{what}: {}", stderr(&out));
        assert_eq!(victims.snapshot(), before, "{what}: a victim was touched");
    }
    assert_eq!(
        files_holding(&data.dir.join("store"), SECRET.as_bytes()),
        Vec::<PathBuf>::new()
    );
}

/// A binary function: sleeps 300 ms and answers `done`; exits 3 when the body is
/// `crash`. One sandbox at a time, one request may wait.
fn sleeper() -> Vec<u8> {
    static TAR: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TAR.get_or_init(compile_sleeper).clone()
}

fn compile_sleeper() -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("skiff-attack-sleeper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n\
         int main(void) { char b[16] = {0}; fread(b, 1, 15, stdin);\n\
         if (!strcmp(b, \"crash\")) return 3; usleep(300000); fputs(\"done\", stdout); return 0; }\n",
    )
    .unwrap();
    common::cc(&dir.join("main.c"), &dir.join("main"));
    let main = std::fs::read(dir.join("main")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    tarball(&[
        file(
            "skiff.yaml",
            b"name: sleeper\nruntime: binary\nhandler: ./main\nlimits:\n  timeout: 10s\nscale:\n  max_instances: 1\n  queue: 1\n",
            0o644,
        ),
        file("main", &main, 0o755),
    ])
}

#[test]
fn fifty_concurrent_deploys_of_one_name_all_succeed_and_leave_no_scratch() {
    let data = Data::new("attack-deploys", 4);
    // Scratch of deploys a crash interrupted: the next daemon removes it.
    let functions = data.dir.join("functions");
    std::fs::create_dir_all(functions.join(".incoming-999999-0/src")).unwrap();
    std::fs::write(functions.join(".incoming-999999-1.tar"), b"x").unwrap();
    let daemon = Daemon::start(&data);
    assert_eq!(
        scratch(&data),
        Vec::<String>::new(),
        "a new daemon kept the scratch"
    );
    let body = sleeper();
    let statuses: Vec<(u16, String)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..50)
            .map(|_| {
                s.spawn(|| {
                    let r = http(daemon.port, "POST", "/v1/functions", &[], &body).unwrap();
                    (r.status, r.text())
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    for (status, text) in &statuses {
        assert_eq!(*status, 201, "{text}");
    }
    assert_eq!(scratch(&data), Vec::<String>::new());
    let r = daemon.request("POST", "/fn/sleeper", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (200, "done"));
    daemon.stop_within(Duration::from_secs(15));

    // `skiff gc` removes the scratch of deploys that died with their daemon.
    std::fs::create_dir_all(functions.join(".incoming-999999-2/x")).unwrap();
    std::fs::write(functions.join(".incoming-999999-3.tar"), b"x").unwrap();
    let out = data.skiff(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("scratch of an unfinished deploy"),
        "{}",
        stdout(&out)
    );
    assert_eq!(scratch(&data), Vec::<String>::new());
    assert_nothing_left(&data);
}

#[test]
fn async_calls_past_a_full_queue_all_run_and_their_records_tell_the_truth() {
    let data = Data::new("attack-async", 4);
    let daemon = Daemon::start(&data);
    let r = daemon.request("POST", "/v1/functions", &[], &sleeper());
    assert_eq!(r.status, 201, "{}", r.text());
    // max_instances 1 and queue 1: a synchronous burst this size gets 429s.
    let ids: Vec<String> = (0..10)
        .map(|i| {
            let body: &[u8] = if i == 9 { b"crash" } else { b"" };
            let r = daemon.request("POST", "/async/sleeper", &[], body);
            assert_eq!(r.status, 202, "{}", r.text());
            r.json()["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let mut saw_queued = 0;
    let records: Vec<Value> = wait_for(
        "every async call to finish",
        Duration::from_secs(60),
        || {
            let records: Vec<Value> = ids
                .iter()
                .map(|id| daemon.get(&format!("/v1/invocations/{id}")).json())
                .collect();
            let count = |status: &str| records.iter().filter(|r| r["status"] == status).count();
            // Waiting calls say so, and have no answer yet.
            for r in records.iter().filter(|r| r["status"] == "queued") {
                assert!(
                    r.get("http_status").is_none() && r.get("end").is_none(),
                    "{r}"
                );
            }
            saw_queued = saw_queued.max(count("queued"));
            (count("queued") + count("running") == 0).then_some(records)
        },
    );
    assert!(
        saw_queued >= 5,
        "the waiting calls did not show queued: {saw_queued}"
    );
    // One sandbox: as the records tell it, no two calls ran at once.
    let time = |r: &Value, key: &str| humantime::parse_rfc3339(r[key].as_str().unwrap()).unwrap();
    let mut runs: Vec<_> = records
        .iter()
        .map(|r| {
            let began =
                time(r, "start") + Duration::from_secs_f64(r["queue_ms"].as_f64().unwrap() / 1e3);
            (began, time(r, "end"))
        })
        .collect();
    runs.sort();
    for pair in runs.windows(2) {
        // A call's end is stamped once its sandbox is released and the next has begun:
        // a few ms of overlap; two calls at once would overlap by the 300 ms they sleep.
        let overlap = pair[0].1.duration_since(pair[1].0).unwrap_or_default();
        assert!(
            overlap < Duration::from_millis(100),
            "two calls ran at once: {runs:?}"
        );
    }
    for record in &records[..9] {
        assert_eq!(record["status"], "succeeded", "{record}");
        assert_eq!(record["http_status"], 200, "{record}");
        assert_eq!(record["result"], "done", "{record}");
    }
    assert_eq!(records[9]["status"], "failed", "{}", records[9]);
    assert_eq!(records[9]["http_status"], 502, "{}", records[9]);

    // Calls waiting when their function is redeployed run on the new version.
    deploy(&daemon, &data, "py-queue");
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let r = daemon.request("POST", "/async/py-queue", &[], b"");
            assert_eq!(r.status, 202, "{}", r.text());
            r.json()["id"].as_str().unwrap().to_owned()
        })
        .collect();
    deploy(&daemon, &data, "py-queue");
    let mut instances = std::collections::BTreeSet::new();
    for id in &ids {
        let record = wait_for(
            "a redeployed function's async call",
            Duration::from_secs(60),
            || {
                let record = daemon.get(&format!("/v1/invocations/{id}")).json();
                (record["status"] != "queued" && record["status"] != "running").then_some(record)
            },
        );
        assert_eq!(record["status"], "succeeded", "{record}");
        assert_eq!(record["result"], "slept", "{record}");
        instances.insert(record["instance"].as_str().unwrap().to_owned());
    }
    assert!(
        instances.len() >= 2,
        "no call ran on the new version: {instances:?}"
    );
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// Reads from `stream` until the daemon closes it; returns what came and when.
fn read_until_closed(mut stream: TcpStream, started: Instant) -> (Vec<u8>, Duration) {
    stream
        .set_read_timeout(Some(HEADER_TIMEOUT + BODY_IDLE + SLACK * 2))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return (got, started.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn slow_partial_and_oversized_requests_are_cut_off() {
    let data = Data::new("attack-slow", 4);
    let daemon = Daemon::start(&data);
    let connect = || TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        // Slowloris: 400 connections that start a request's head and never end it,
        // 20 that send nothing, and one that trickles a header line a second.
        let mut heads = Vec::new();
        for i in 0..420 {
            let mut c = connect();
            if i < 400 {
                c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            heads.push(s.spawn(move || read_until_closed(c, started)));
        }
        let trickle = s.spawn(|| {
            let mut c = connect();
            c.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
            for i in 0..30 {
                std::thread::sleep(Duration::from_secs(1));
                if c.write_all(format!("X-{i}: y\r\n").as_bytes()).is_err() {
                    return started.elapsed();
                }
            }
            panic!("a trickled head was not cut off in 30 s");
        });
        // Partial bodies: an invocation's and a deploy's, a few bytes then nothing.
        let partial = |path: &'static str| {
            let mut c = connect();
            c.write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n0123456789"
                )
                .as_bytes(),
            )
            .unwrap();
            s.spawn(move || read_until_closed(c, Instant::now()))
        };
        let bodies = [partial("/fn/sleeper"), partial("/v1/functions")];
        // Meanwhile the daemon serves others.
        assert_eq!(daemon.get("/healthz").status, 200);
        for head in heads {
            let (got, after) = head.join().unwrap();
            assert!(
                got.is_empty() || got.starts_with(b"HTTP/1.1 408"),
                "{:?}",
                String::from_utf8_lossy(&got)
            );
            assert!(
                after <= HEADER_TIMEOUT + SLACK,
                "a slow head held {after:?}"
            );
        }
        let after = trickle.join().unwrap();
        assert!(
            after <= HEADER_TIMEOUT + SLACK,
            "a trickled head held {after:?}"
        );
        for body in bodies {
            let (got, after) = body.join().unwrap();
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with("HTTP/1.1 408"), "{text}");
            assert!(text.contains("no byte of the body arrived"), "{text}");
            assert!(after <= BODY_IDLE + SLACK, "a partial body held {after:?}");
        }
    });
    assert_eq!(
        scratch(&data),
        Vec::<String>::new(),
        "a stalled deploy left scratch"
    );

    // A declared length past a limit: 413 naming that limit, before any body is sent
    // (no `100 Continue`).
    for (path, length, limit) in [
        ("/fn/sleeper", 100 << 20, "6 MiB limit of an invocation"),
        ("/v1/functions", 300 << 20, "256 MiB limit of a deploy"),
    ] {
        let mut c = connect();
        c.write_all(
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let (got, _) = read_until_closed(c, Instant::now());
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 413"), "{path}: {text}");
        assert!(text.contains(limit), "{path}: {text}");
    }
    // A chunked deploy (no length declared) past 256 MiB: streamed to disk, not held
    // in memory, and refused naming the deploy's limit.
    let hwm_before = vm_hwm_kib(daemon.child.id());
    let c = connect();
    let mut writer = c.try_clone().unwrap();
    // Written on its own thread: the daemon answers (and closes) before reading it all.
    let sending = std::thread::spawn(move || {
        let mut chunk = format!("{:x}\r\n", 1 << 20).into_bytes();
        chunk.extend_from_slice(&vec![0u8; 1 << 20]);
        chunk.extend_from_slice(b"\r\n");
        let head = b"POST /v1/functions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        if writer.write_all(head).is_ok() {
            for _ in 0..300 {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    let (got, _) = read_until_closed(c, Instant::now());
    sending.join().unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("256 MiB limit of a deploy"), "{text}");
    let grown = vm_hwm_kib(daemon.child.id()).saturating_sub(hwm_before);
    assert!(
        grown < 64 << 10,
        "a 300 MiB deploy grew the daemon by {grown} KiB"
    );
    assert_eq!(
        scratch(&data),
        Vec::<String>::new(),
        "a refused deploy left scratch"
    );
    assert_eq!(daemon.get("/healthz").status, 200);
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// A python3 function `evil` with `files` beside its skiff.yaml (whose `packages:` line is
/// `packages`).
fn evil_python(packages: &str, files: Vec<Item>) -> Vec<u8> {
    let mut items = vec![
        file(
            "skiff.yaml",
            format!("name: evil\nruntime: python3\nhandler: main.handle\n{packages}").as_bytes(),
            0o644,
        ),
        file(
            "main.py",
            b"def handle(event, context):\n    return 'ok'\n",
            0o644,
        ),
    ];
    items.extend(files);
    tarball(&items)
}

/// A node function `evil` with this package.json.
fn evil_node(package_json: &str) -> Vec<u8> {
    tarball(&[
        file(
            "skiff.yaml",
            b"name: evil\nruntime: node\nhandler: index.handler\n",
            0o644,
        ),
        file("index.js", b"exports.handler = async () => 'ok';\n", 0o644),
        file("package.json", package_json.as_bytes(), 0o644),
    ])
}

/// Package inputs (`packages:`, requirements.txt and what it includes, package.json) that
/// name host files are refused before pip or npm reads them: the error says why and never
/// echoes the host file.
#[test]
fn package_inputs_that_reach_the_host_are_refused() {
    let data = Data::new("attack-packages", 4);
    let victims = Victims::new("packages");
    let before = victims.snapshot();
    let daemon = Daemon::start(&data);
    let v = victims.dir.to_str().unwrap();
    let requirements = |text: &str| vec![file("requirements.txt", text.as_bytes(), 0o644)];
    let deps = |spec: &str| format!("{{\"dependencies\": {{\"x\": \"{spec}\"}}}}");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "an option in packages:",
            evil_python(&format!("packages: [\"-r{v}/secret\"]\n"), vec![]),
            "is an option",
        ),
        (
            "a host path in packages:",
            evil_python(&format!("packages: [\"{v}/hostdir\"]\n"), vec![]),
            "outside the function's directory",
        ),
        (
            "a file: URL in packages:",
            evil_python(&format!("packages: [\"x @ file://{v}/hostdir\"]\n"), vec![]),
            "outside the function's directory",
        ),
        (
            "requirements.txt including a host file",
            evil_python("", requirements(&format!("six\n-r {v}/secret\n"))),
            "outside the function's directory",
        ),
        (
            "requirements.txt including a file above the function",
            evil_python("", requirements("--constraint=../../../secret\n")),
            "outside the function's directory",
        ),
        (
            "requirements.txt installing a host directory",
            evil_python("", requirements(&format!("-e {v}/hostdir\n"))),
            "outside the function's directory",
        ),
        (
            "requirements.txt a symlink to a host file",
            evil_python(
                "",
                vec![link(
                    "requirements.txt",
                    tar::EntryType::Symlink,
                    &format!("{v}/secret"),
                )],
            ),
            "points outside",
        ),
        (
            "package.json depending on a host directory",
            evil_node(&deps(&format!("file:{v}/hostdir"))),
            "outside the function's directory",
        ),
        (
            "package.json linking a directory above the function",
            evil_node(&deps("link:../../..")),
            "outside the function's directory",
        ),
        (
            "package.json that is not JSON",
            evil_node(&format!("{{\"name\": \"{SECRET}\"")),
            "package.json is not JSON",
        ),
    ];
    for (what, body, expected) in &cases {
        let r = daemon.request("POST", "/v1/functions", &[], body);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let message = r.error();
        assert!(message.contains(expected), "{what}: {message}");
        for hidden in [
            SECRET,
            data.dir.to_str().unwrap(),
            ".incoming",
            "skiff-packages",
        ] {
            assert!(
                !message.contains(hidden),
                "{what}: the error shows {hidden:?}: {message}"
            );
        }
        assert_eq!(victims.snapshot(), before, "{what}: a victim was touched");
        assert_eq!(scratch(&data), Vec::<String>::new(), "{what}: scratch left");
        assert_eq!(
            daemon.get("/v1/functions/evil").status,
            404,
            "{what}: deployed"
        );
    }
    assert_eq!(
        files_holding(&data.dir, SECRET.as_bytes()),
        Vec::<PathBuf>::new()
    );
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

/// `skiff serve --template-memory` takes a size; anything else is a usage error that names
/// the flag, and no daemon starts.
#[test]
fn a_bad_template_memory_is_a_usage_error() {
    let data = Data::new("attack-template-memory", 1);
    for bad in ["lots", "-1", "1Q", ""] {
        let socket = data.dir.join("skiff.sock");
        let out = data.skiff(&[
            "--socket",
            socket.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
            &format!("--template-memory={bad}"),
        ]);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--template-memory"),
            "{bad:?}: {}",
            stderr(&out)
        );
        assert!(!socket.exists(), "{bad:?}: a daemon started");
    }
}

/// A python3 function in `dir` whose requirements.txt installs a wheel of its own, named
/// `evilpkg` 0.1 whatever `module` (its code) does; the handler answers its `MODE`.
fn function_with_wheel(dir: &Path, name: &str, module: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let manifest = format!("name: {name}\nruntime: python3\nhandler: main.handle\n");
    std::fs::write(dir.join("skiff.yaml"), manifest).unwrap();
    std::fs::write(
        dir.join("main.py"),
        "import evilpkg\n\ndef handle(event, context):\n    return evilpkg.MODE\n",
    )
    .unwrap();
    let wheel = "evilpkg-0.1-py3-none-any.whl";
    std::fs::write(dir.join("requirements.txt"), format!("./{wheel}\n")).unwrap();
    std::fs::write(dir.join("evilpkg.py"), module).unwrap();
    let made = std::process::Command::new("/usr/bin/python3.11")
        .current_dir(dir)
        .args(["-c", WHEEL_MAKER, wheel])
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::remove_file(dir.join("evilpkg.py")).unwrap();
}

/// Writes the wheel named argv[1] holding evilpkg/__init__.py (from ./evilpkg.py).
const WHEEL_MAKER: &str = "import sys, zipfile
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    z.write('evilpkg.py', 'evilpkg/__init__.py')
    info = 'evilpkg-0.1.dist-info/'
    z.writestr(info + 'METADATA', 'Metadata-Version: 2.1\\nName: evilpkg\\nVersion: 0.1\\n')
    z.writestr(info + 'WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')
    z.writestr(info + 'RECORD', '')
";

/// What a package does at import when the function's own template imports it ahead
/// (the template's `preload` is on the stack): `how` is python run there.
fn evil_module(mode: &str, how: &str) -> String {
    format!(
        "import inspect, os\nMODE = {mode:?}\n\
         if any(f.function == 'preload' for f in inspect.stack()):\n{how}"
    )
}

/// A function's own template runs the function's packages, so it is hostile too: one
/// that corrupts its channel before it is ready, or answers a fork with a process that is
/// not its fork (itself), is given up and the function starts as functions without a
/// template do. And two functions whose local wheels share a name and version each get
/// their own code, never the other's layer.
#[test]
fn a_hostile_function_template_is_given_up() {
    let data = Data::new("attack-fn-template", 8);
    let daemon = Daemon::start(&data);
    let garbage = evil_module(
        "garbage",
        "    import __main__\n    os.write(__main__.chan, b'\\xff' * 16)\n",
    );
    let impostor = evil_module(
        "impostor",
        "    _open = os.pidfd_open\n    os.pidfd_open = lambda pid, flags=0: _open(os.getpid(), flags)\n",
    );
    for (name, module) in [("evil-garbage", &garbage), ("evil-impostor", &impostor)] {
        let dir = data.dir.join("fn").join(name);
        function_with_wheel(&dir, name, module);
        common::daemon::deploy_dir(&daemon, &data, &dir);
    }
    let templates = || daemon.templates();
    for (name, mode) in [("evil-garbage", "garbage"), ("evil-impostor", "impostor")] {
        // Warm and then cold again: each answers with its own wheel's code.
        for _ in 0..2 {
            let r = daemon.get(&format!("/fn/{name}"));
            assert_eq!((r.status, r.text()), (200, mode.to_owned()), "{name}");
            let stop = daemon.request(
                "DELETE",
                &format!("/v1/functions/{name}/instances"),
                &[],
                b"",
            );
            assert!(stop.status < 300, "{}", stop.text());
        }
    }
    assert_eq!(templates(), Vec::<Value>::new());
    daemon.stop_within(Duration::from_secs(15));
    assert_nothing_left(&data);
}

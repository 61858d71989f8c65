//! Builds the templates' native code, embedded in the daemon, for the host's C library
//! (the one their interpreters use): the sandbox entry (../sandbox/src/entry.c, the same
//! source the native spawner links) as a shared object for python's template, and node's
//! template addon (src/bootstrap/node_template.c, with the entry compiled in). Without a
//! C compiler a file is empty and that runtime's functions start plainly (the build
//! says so); without node's headers, so are node's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let entry = "../sandbox/src/entry.c";
    let addon = "src/bootstrap/node_template.c";
    for source in [entry, "../sandbox/src/entry.h", addon] {
        println!("cargo:rerun-if-changed={source}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let cc = std::env::var("SKIFF_TEMPLATE_CC").unwrap_or_else(|_| "cc".into());
    let build = |out: &Path, args: &[String]| {
        let built = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-I../sandbox/src", "-o"])
            .arg(out)
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        if !built {
            std::fs::write(out, b"").unwrap();
        }
        built
    };
    if !build(&out_dir.join("skiff_entry.so"), &[entry.into()]) {
        println!(
            "cargo:warning=the sandbox entry was not built for the templates (needs cc): \
             python functions will start without a template"
        );
    }
    let headers = ["/usr/include/node", "/usr/local/include/node"]
        .into_iter()
        .find(|d| Path::new(d).join("node_api.h").exists());
    let node = headers.is_some_and(|include| {
        build(
            &out_dir.join("node_template.node"),
            &[format!("-I{include}"), addon.into(), entry.into()],
        )
    });
    if !node {
        println!(
            "cargo:warning=the node template's addon was not built (needs cc and node's headers, \
             e.g. Debian's libnode-dev): node functions will start without a template"
        );
        std::fs::write(out_dir.join("node_template.node"), b"").unwrap();
    }
}

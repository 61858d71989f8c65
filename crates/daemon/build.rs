//! Builds the native half of the node template (src/bootstrap/node_template.c) as a
//! node addon, embedded in the daemon. It is compiled for the host's C library, which
//! node itself uses; without a C compiler or node's headers the file is empty and node
//! functions start plainly (the daemon says so).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "src/bootstrap/node_template.c";
    println!("cargo:rerun-if-changed={source}");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("node_template.node");
    let headers = ["/usr/include/node", "/usr/local/include/node"]
        .into_iter()
        .find(|d| std::path::Path::new(d).join("node_api.h").exists());
    let built = headers.is_some_and(|include| {
        Command::new(std::env::var("SKIFF_NODE_CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(format!("-I{include}"))
            .arg(source)
            .status()
            .is_ok_and(|s| s.success())
    });
    if !built {
        println!(
            "cargo:warning=the node template's addon was not built (needs cc and node's headers, \
             e.g. Debian's libnode-dev): node functions will start without a template"
        );
        std::fs::write(&out, b"").unwrap();
    }
}

//! Compiles the sandbox entry (src/entry.c) into the crate: the native spawner's child
//! calls it. The daemon builds the same source for its templates.

fn main() {
    println!("cargo:rerun-if-changed=src/entry.c");
    println!("cargo:rerun-if-changed=src/entry.h");
    cc::Build::new()
        .file("src/entry.c")
        .opt_level(2)
        .warnings_into_errors(true)
        .compile("skiff_entry");
}

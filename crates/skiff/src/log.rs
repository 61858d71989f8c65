//! Debug logging for the one-shot CLI, enabled by `SKIFF_LOG=debug`.

use std::sync::OnceLock;

pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SKIFF_LOG").is_ok_and(|v| v.contains("debug")))
}

macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::log::enabled() {
            eprintln!("skiff: debug: {}", format_args!($($arg)*));
        }
    };
}
pub(crate) use debug;

//! Parsing of sizes, CPU counts, signals and ids given on the command line.

use anyhow::{bail, Result};

/// `128M`, `1G`, `512k`, `1048576`: bytes (the manifest's syntax).
pub fn parse_size(text: &str) -> Result<u64> {
    match skiff_manifest::parse_size(text) {
        Some(bytes) => Ok(bytes),
        None => bail!("invalid size {text:?} (use bytes or a K, M or G suffix, like 128M)"),
    }
}

pub fn signal_number(name: &str) -> Result<i32> {
    if let Ok(n) = name.parse::<i32>() {
        if (1..=64).contains(&n) {
            return Ok(n);
        }
    }
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Ok(match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        _ => bail!("unknown signal {name:?}"),
    })
}

/// 12 random hex digits.
pub fn new_id() -> String {
    let mut buf = [0u8; 6];
    // SAFETY: buf is valid for 6 bytes.
    unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("0.5G").unwrap(), 512 << 20);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn signals() {
        assert_eq!(signal_number("TERM").unwrap(), libc::SIGTERM);
        assert_eq!(signal_number("sigint").unwrap(), libc::SIGINT);
        assert_eq!(signal_number("9").unwrap(), 9);
        assert!(signal_number("FOO").is_err());
    }
}

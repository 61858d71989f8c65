//! The session benchmark's key-value app. The input is "OP KEY"; every value is 1 KiB:
//! an 8-byte little-endian version, then filler.
//! - `seed`: writes version 0 (weakly), answers "0";
//! - `ro`: a weak read, answers the value's length ("absent" when there is none);
//! - `rmw`: a weak read then a weak write of the next version, answers it (concurrent
//!   ones may lose updates: that is the point of comparing with `linear`);
//! - `linear`: the same as a strong read-modify-write, redone on conflict, answers the
//!   new version (never loses one).
//!
//! A bad input answers "usage: ..."; a failed state call "error: <kind>".

use skiff_guest::{read_state, update, write_state, Error, Mode};

const VALUE_LEN: usize = 1024;

fn value(version: u64) -> Vec<u8> {
    let mut value = vec![b'x'; VALUE_LEN];
    value[..8].copy_from_slice(&version.to_le_bytes());
    value
}

/// The version of a value; an absent or foreign one counts as 0.
fn version(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|v| v.first_chunk::<8>())
        .map_or(0, |v| u64::from_le_bytes(*v))
}

fn seed(key: &str) -> Result<String, Error> {
    write_state(key, value(0), Mode::Weak)?;
    Ok("0".to_owned())
}

fn ro(key: &str) -> Result<String, Error> {
    Ok(match read_state(key, Mode::Weak)? {
        Some(v) => v.len().to_string(),
        None => "absent".to_owned(),
    })
}

fn rmw(key: &str) -> Result<String, Error> {
    let next = version(read_state(key, Mode::Weak)?.as_deref()) + 1;
    write_state(key, value(next), Mode::Weak)?;
    Ok(next.to_string())
}

fn linear(key: &str) -> Result<String, Error> {
    let new = update(key, |old| value(version(old) + 1))?;
    Ok(version(Some(&new)).to_string())
}

fn kvapp(input: Vec<u8>) -> String {
    let input = String::from_utf8_lossy(&input);
    let words: Vec<&str> = input.split_ascii_whitespace().collect();
    let result = match words[..] {
        ["seed", key] => seed(key),
        ["ro", key] => ro(key),
        ["rmw", key] => rmw(key),
        ["linear", key] => linear(key),
        _ => return "usage: seed|ro|rmw|linear KEY".to_owned(),
    };
    result.unwrap_or_else(|err| format!("error: {err}"))
}

skiff_guest::handler!(kvapp);

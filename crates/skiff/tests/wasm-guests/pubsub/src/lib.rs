//! Fixture wasm-pubsub:
//! - "pub NAME VALUE" publishes VALUE (the rest of the input) under NAME, answers "ok";
//! - "get ADDR NAME" answers the value NAME published by the session at ADDR, or
//!   "absent" (NAME is the last word, so ADDR may hold spaces).
//!
//! A bad command answers "usage: ..."; a failed call "error: <kind>".

use skiff_guest::{publish, read_published};

fn pubsub(input: Vec<u8>) -> Vec<u8> {
    let input = String::from_utf8_lossy(&input);
    let input = input.trim_end_matches(['\n', '\r']);
    let result = if let Some((name, value)) =
        input.strip_prefix("pub ").and_then(|r| r.split_once(' '))
    {
        publish(name, value).map(|()| b"ok".to_vec())
    } else if let Some((addr, name)) = input.strip_prefix("get ").and_then(|r| r.rsplit_once(' ')) {
        read_published(addr, name).map(|v| v.unwrap_or_else(|| b"absent".to_vec()))
    } else {
        return b"usage: pub NAME VALUE | get ADDR NAME".to_vec();
    };
    result.unwrap_or_else(|err| format!("error: {err}").into_bytes())
}

skiff_guest::handler!(pubsub);

//! Fixture wasm-hook, whose session key comes from its own export (`key:
//! wasm:session_key`):
//! - `session_key` reads the input, JSON like {"user": "ann"}, and outputs the user
//!   (it traps when there is no string "user");
//! - `handle` appends the input to the session's log and answers the log's length in
//!   entries ("error: <kind>" when a state call fails).

use skiff_guest::update;

fn user(input: Vec<u8>) -> String {
    let request: serde_json::Value =
        serde_json::from_slice(&input).expect("session_key: the input is not JSON");
    match request.get("user") {
        Some(serde_json::Value::String(user)) => user.clone(),
        _ => panic!("session_key: the input has no string \"user\""),
    }
}

/// The log is one value: entries, each a u32 LE length and then the bytes.
fn count(mut log: &[u8]) -> usize {
    let mut n = 0;
    while let Some((len, rest)) = log.split_first_chunk::<4>() {
        log = rest
            .get(u32::from_le_bytes(*len) as usize..)
            .unwrap_or_default();
        n += 1;
    }
    n
}

fn append(input: Vec<u8>) -> String {
    let log = update("log", |old| {
        let mut log = old.unwrap_or_default().to_vec();
        log.extend_from_slice(&(input.len() as u32).to_le_bytes());
        log.extend_from_slice(&input);
        log
    });
    match log {
        Ok(log) => count(&log).to_string(),
        Err(err) => format!("error: {err}"),
    }
}

skiff_guest::handler!(session_key = user);
skiff_guest::handler!(append);

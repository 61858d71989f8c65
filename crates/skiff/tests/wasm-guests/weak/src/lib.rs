//! Fixture wasm-weak, for atomicity tests of weak state access:
//! - "w KEY FILL LEN" writes LEN bytes all equal to FILL (a single character stands
//!   for its own byte, anything longer is a decimal byte value) and answers "ok";
//! - "r KEY" answers the value, or "absent";
//! - "d KEY" deletes it and answers "deleted" or "absent".
//!
//! A bad command answers "usage: ..."; a failed state call "error: <kind>".

use skiff_guest::{delete_state, read_state, write_state, Mode};

fn fill_byte(word: &str) -> Option<u8> {
    match word.as_bytes() {
        [byte] => Some(*byte),
        _ => word.parse().ok(),
    }
}

fn weak(input: Vec<u8>) -> Vec<u8> {
    let input = String::from_utf8_lossy(&input);
    let words: Vec<&str> = input.split_ascii_whitespace().collect();
    let result = match words[..] {
        ["w", key, fill, len] => match (fill_byte(fill), len.parse::<usize>()) {
            (Some(fill), Ok(len)) => {
                write_state(key, vec![fill; len], Mode::Weak).map(|()| b"ok".to_vec())
            }
            _ => return usage(),
        },
        ["r", key] => read_state(key, Mode::Weak).map(|v| v.unwrap_or_else(|| b"absent".to_vec())),
        ["d", key] => {
            delete_state(key).map(|existed| if existed { "deleted" } else { "absent" }.into())
        }
        _ => return usage(),
    };
    result.unwrap_or_else(|err| format!("error: {err}").into_bytes())
}

fn usage() -> Vec<u8> {
    b"usage: w KEY FILL LEN | r KEY | d KEY".to_vec()
}

skiff_guest::handler!(weak);

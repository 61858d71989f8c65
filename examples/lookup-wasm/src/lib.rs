//! A read-only lookup table per session: `get KEY` answers the value with a weak read
//! (no locks, so lookups never wait on each other); `put KEY VALUE` seeds it.

use skiff_guest::{read_state, write_state, Mode};

fn lookup(input: Vec<u8>) -> String {
    let input = String::from_utf8_lossy(&input);
    let mut words = input.trim_end_matches('\n').splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("get"), Some(key), None) => match read_state(key, Mode::Weak) {
            Ok(Some(value)) => String::from_utf8_lossy(&value).into_owned(),
            Ok(None) => format!("{key}: not found"),
            Err(err) => format!("error: {err}"),
        },
        (Some("put"), Some(key), Some(value)) => match write_state(key, value, Mode::Weak) {
            Ok(()) => "ok".to_owned(),
            Err(err) => format!("error: {err}"),
        },
        _ => "usage: get KEY | put KEY VALUE".to_owned(),
    }
}

skiff_guest::handler!(lookup);

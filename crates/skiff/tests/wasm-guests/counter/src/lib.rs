//! Fixture wasm-counter: any input adds one to key "n" with a strong read-modify-write
//! and answers the new value; "get" answers the value with a weak read ("0" when
//! absent). A failed state call answers "error: <kind>", like "error: lock timeout".

use skiff_guest::{read_state, update, Mode};

fn parse(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0)
}

fn counter(input: Vec<u8>) -> String {
    let result = match input.trim_ascii() {
        b"get" => read_state("n", Mode::Weak).map(|v| parse(v.as_deref())),
        _ => update("n", |old| (parse(old) + 1).to_string().into_bytes())
            .map(|new| parse(Some(&new))),
    };
    match result {
        Ok(n) => n.to_string(),
        Err(err) => format!("error: {err}"),
    }
}

skiff_guest::handler!(counter);

//! A per-session counter: every request adds one and answers the new count.

use skiff_guest::update;

fn increment(_input: Vec<u8>) -> String {
    // A strong read-modify-write: concurrent requests of one session never lose a count.
    let new = update("count", |old| {
        let n: u64 = old
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        (n + 1).to_string().into_bytes()
    })
    .expect("counter: update failed");
    String::from_utf8(new).expect("counter: the count is text")
}

skiff_guest::handler!(increment);

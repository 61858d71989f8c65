//! Fixture wasm-hostile: a module that misbehaves on request, to test that the host
//! contains it.
//! - "loop" spins forever (only the timeout stops it);
//! - "alloc" grows memory 1 MiB at a time, touching every new page, until memory.grow
//!   fails (then answers "memory.grow failed after N MiB") or the host traps it;
//! - "trap" executes `unreachable`;
//! - "strongloop" opens a strong read-modify-write on "n" and spins forever: the host
//!   must stop it and release the key;
//! - anything else increments "n" like wasm-counter and answers the new value.

use core::arch::wasm32;
use core::hint::black_box;

use skiff_guest::{read_state, update, Mode};

const PAGE: usize = 64 << 10;

fn spin() -> ! {
    // black_box keeps the loop's body from being reasoned away.
    loop {
        black_box(());
    }
}

fn alloc() -> String {
    let mut mib = 0usize;
    loop {
        let first = wasm32::memory_grow(0, 16);
        if first == usize::MAX {
            return format!("memory.grow failed after {mib} MiB");
        }
        for page in first..first + 16 {
            // SAFETY: the page was just added to memory 0; nothing else uses it.
            unsafe { ((page * PAGE) as *mut u8).write_volatile(1) };
        }
        mib += 1;
    }
}

fn increment() -> String {
    let new = update("n", |old| {
        let n: u64 = old
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        (n + 1).to_string().into_bytes()
    });
    match new {
        Ok(new) => String::from_utf8_lossy(&new).into_owned(),
        Err(err) => format!("error: {err}"),
    }
}

fn hostile(input: Vec<u8>) -> String {
    match input.trim_ascii() {
        b"loop" => spin(),
        b"alloc" => alloc(),
        b"trap" => wasm32::unreachable(),
        b"strongloop" => {
            // Whatever the read returns, the key stays opened until the host steps in.
            let _ = black_box(read_state("n", Mode::Strong));
            spin()
        }
        _ => increment(),
    }
}

skiff_guest::handler!(hostile);

//! A shopping cart per session. The input is one JSON request:
//! `{"op":"add","item":"apple","qty":2}`, `{"op":"remove","item":"apple"}` (all of it,
//! or `"qty"` of it) or `{"op":"list"}`; every answer is the cart as JSON, like
//! `{"items":{"apple":2}}`, or `{"error":"..."}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use skiff_guest::{read_state, update, Mode};

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Add { item: String, qty: Option<u64> },
    Remove { item: String, qty: Option<u64> },
    List,
}

#[derive(Serialize, Deserialize, Default)]
struct Cart {
    items: BTreeMap<String, u64>,
}

const KEY: &str = "cart";

fn parse(value: Option<&[u8]>) -> Cart {
    value
        .and_then(|v| serde_json::from_slice(v).ok())
        .unwrap_or_default()
}

fn error(message: impl std::fmt::Display) -> Vec<u8> {
    serde_json::json!({ "error": message.to_string() })
        .to_string()
        .into_bytes()
}

fn cart(input: Vec<u8>) -> Vec<u8> {
    let request: Request = match serde_json::from_slice(&input) {
        Ok(request) => request,
        Err(err) => return error(format_args!("bad request: {err}")),
    };
    let result = match request {
        // Reading needs no lock: a weak read sees the latest committed cart.
        Request::List => read_state(KEY, Mode::Weak)
            .map(|v| serde_json::to_vec(&parse(v.as_deref())).expect("a cart serializes")),
        // Changes are strong read-modify-writes, so two tabs adding at once both count.
        Request::Add { item, qty } => update(KEY, |old| {
            let mut cart = parse(old);
            let have = cart.items.entry(item.clone()).or_default();
            *have = have.saturating_add(qty.unwrap_or(1));
            serde_json::to_vec(&cart).expect("a cart serializes")
        }),
        Request::Remove { item, qty } => update(KEY, |old| {
            let mut cart = parse(old);
            if let Some(have) = cart.items.get_mut(&item) {
                *have = have.saturating_sub(qty.unwrap_or(u64::MAX));
                if *have == 0 {
                    cart.items.remove(&item);
                }
            }
            serde_json::to_vec(&cart).expect("a cart serializes")
        }),
    };
    result.unwrap_or_else(error)
}

skiff_guest::handler!(cart);

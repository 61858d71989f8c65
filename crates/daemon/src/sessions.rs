//! Session hints (XFaaS §3.3): the platform routes by an opaque hint and never keeps
//! the session key a request carries. A session's id is a keyed MAC of its function and
//! key; the hint a client may send instead of the key is that id plus a second MAC over
//! it, so a forged or altered hint is rejected without any table of valid ones.
//! Session directories (`DATA/sessions/ID/`) hold the checkpoint, the log, the
//! primary's state socket, and the name of the function the session belongs to.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The request header that carries a hint, and the response header that gives it.
pub const SESSION_HEADER: &str = "x-skiff-session";
/// The sandbox's user, which owns what the worker writes in the session's directory.
const SANDBOX_UID: u32 = 65534;

pub struct Sessions {
    secret: [u8; 32],
    dir: PathBuf,
}

fn mac(secret: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    for part in parts {
        m.update(&(part.len() as u64).to_be_bytes());
        m.update(part);
    }
    m.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// Loads the node's secret (`DATA/session.key`), creating it on first use.
    pub fn open(data: &Path) -> Result<Sessions> {
        let path = data.join("session.key");
        let secret = match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == 32 => bytes.try_into().expect("32 bytes"),
            Ok(_) => anyhow::bail!("{} is not a 32-byte key", path.display()),
            Err(_) => {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut secret = [0u8; 32];
                // SAFETY: the buffer is valid for its length.
                if unsafe { libc::getrandom(secret.as_mut_ptr().cast(), 32, 0) } != 32 {
                    anyhow::bail!("getrandom failed");
                }
                let tmp = data.join(".session.key.tmp");
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&secret)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)?;
                secret
            }
        };
        let dir = data.join("sessions");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Sessions { secret, dir })
    }

    /// The session id for `key` of `function`: 32 hex digits that reveal nothing of it.
    pub fn id(&self, function: &str, key: &[u8]) -> String {
        hex(&mac(&self.secret, &[b"id", function.as_bytes(), key])[..16])
    }

    /// The hint (and session address) of session `id`.
    pub fn hint(&self, id: &str) -> String {
        format!(
            "{id}{}",
            hex(&mac(&self.secret, &[b"hint", id.as_bytes()])[..16])
        )
    }

    /// The session a hint names, if the hint is one this node made.
    pub fn verify(&self, hint: &str) -> Option<String> {
        let (id, _) = hint.split_at_checked(32)?;
        let valid = id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        // Compared in constant time: the tag is a secret until it is handed out.
        let expected = self.hint(id);
        let same = expected.len() == hint.len()
            && expected
                .bytes()
                .zip(hint.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        (valid && same).then(|| id.to_owned())
    }

    pub fn dir(&self, id: &str) -> std::io::Result<PathBuf> {
        crate::names::inside(&self.dir, id, "")
    }

    /// The session's directory, made (for the sandbox's user) on first use.
    pub fn prepare(&self, id: &str, function: &str) -> Result<PathBuf> {
        let dir = self.dir(id)?;
        if !dir.join("function").exists() {
            std::fs::create_dir_all(&dir)?;
            std::os::unix::fs::chown(&dir, Some(SANDBOX_UID), Some(SANDBOX_UID))?;
            std::fs::write(dir.join("function"), function)?;
        }
        Ok(dir)
    }

    /// The function session `id` belongs to, if it has ever run.
    pub fn function_of(&self, id: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(id).ok()?.join("function")).ok()
    }

    /// Every session on disk: (id, function).
    pub fn on_disk(&self) -> Vec<(String, String)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut all: Vec<_> = entries
            .filter_map(|e| {
                let id = e.ok()?.file_name().into_string().ok()?;
                Some((self.function_of(&id)?, id))
            })
            .map(|(f, id)| (id, f))
            .collect();
        all.sort();
        all
    }

    /// Bytes of the session's files on disk (checkpoint and log).
    pub fn disk_bytes(&self, id: &str) -> u64 {
        self.dir(id)
            .and_then(std::fs::read_dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_verify_and_forgeries_do_not() {
        let tmp = std::env::temp_dir().join(format!("skiff-hints-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let sessions = Sessions::open(&tmp).unwrap();
        let id = sessions.id("counter", b"alice");
        assert_eq!(id.len(), 32);
        assert_ne!(id, sessions.id("counter", b"bob"));
        assert_ne!(id, sessions.id("cart", b"alice"));
        let hint = sessions.hint(&id);
        assert_eq!(sessions.verify(&hint).as_deref(), Some(id.as_str()));
        // The same secret after a restart: hints stay valid.
        assert_eq!(
            Sessions::open(&tmp).unwrap().verify(&hint).as_deref(),
            Some(id.as_str())
        );
        let mut flipped = hint.clone().into_bytes();
        flipped[40] = if flipped[40] == b'0' { b'1' } else { b'0' };
        for forged in [
            String::from_utf8(flipped).unwrap(),
            format!("{id}{}", "0".repeat(32)),
            id.clone(),
            String::new(),
            "é".repeat(40),
        ] {
            assert_eq!(sessions.verify(&forged), None, "{forged}");
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}

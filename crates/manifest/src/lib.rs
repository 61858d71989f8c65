//! `skiff.yaml`, a function's manifest (see DESIGN.md's public interface).
//!
//! Values are checked while they are parsed (each field's type validates itself), so
//! every error carries the key's path, line and column: `skiff.yaml:5:11: limits.memory:
//! invalid size "lots" ...`. Unknown keys are errors too.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod code;

pub const FILE_NAME: &str = "skiff.yaml";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: Name,
    pub runtime: Runtime,
    pub handler: String,
    /// The function's code, relative to the manifest's directory.
    #[serde(default = "default_code")]
    pub code: String,
    /// PyPI requirements (python3) or npm packages (node), as `pip`/`npm` spell them.
    #[serde(default)]
    pub packages: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub scale: Scale,
    #[serde(default = "default_tenant")]
    pub tenant: Name,
    #[serde(default)]
    pub network: Network,
    pub session: Option<Session>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Binary,
    Python3,
    Node,
    Wasm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    Host,
    None,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "default_memory")]
    pub memory: Bytes,
    #[serde(default = "default_cpu")]
    pub cpu: Cpus,
    #[serde(default = "default_pids")]
    pub pids: Pids,
    #[serde(default = "default_timeout")]
    pub timeout: Interval,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    #[serde(default = "one")]
    pub concurrency: Count,
    #[serde(default)]
    pub min_instances: u32,
    #[serde(default = "default_max_instances")]
    pub max_instances: Count,
    #[serde(default = "default_keep_alive")]
    pub keep_alive: Interval,
    /// Requests that may wait for an instance when all are busy; more get 429.
    #[serde(default = "default_queue")]
    pub queue: Count,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    pub key: SessionKey,
    #[serde(default = "default_session_concurrency")]
    pub max_concurrency: Count,
    #[serde(default = "default_keep_alive")]
    pub keep_alive: Interval,
    #[serde(default)]
    pub durability: Durability,
    #[serde(default)]
    pub locking: Locking,
}

/// How strong read-modify-writes are kept linearizable: a lock held from the strong
/// read to the strong write, or versions checked at the write (the guest retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Locking {
    #[default]
    Pessimistic,
    Optimistic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Checkpoint,
    Wal,
}

/// Where a request's session key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKey {
    Header(String),
    Query(String),
    /// A JSON pointer into the request body.
    Json(String),
    /// An export of the module that reads the input and sets the key as its output.
    Wasm(String),
}

impl TryFrom<String> for SessionKey {
    type Error = String;
    fn try_from(text: String) -> Result<SessionKey, String> {
        let (kind, arg) = text
            .split_once(':')
            .ok_or_else(|| format!("invalid session key {text:?}: expected header:NAME, query:NAME, json:/POINTER or wasm:EXPORT"))?;
        if arg.is_empty() {
            return Err(format!(
                "invalid session key {text:?}: nothing after {kind:?}"
            ));
        }
        match kind {
            "header" => Ok(SessionKey::Header(arg.to_owned())),
            "query" => Ok(SessionKey::Query(arg.to_owned())),
            "json" if arg.starts_with('/') => Ok(SessionKey::Json(arg.to_owned())),
            "json" => Err(format!(
                "invalid session key {text:?}: a JSON pointer starts with '/'"
            )),
            "wasm" => Ok(SessionKey::Wasm(arg.to_owned())),
            _ => Err(format!(
                "invalid session key {text:?}: {kind:?} is not header, query, json or wasm"
            )),
        }
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionKey::Header(name) => write!(f, "header:{name}"),
            SessionKey::Query(name) => write!(f, "query:{name}"),
            SessionKey::Json(pointer) => write!(f, "json:{pointer}"),
            SessionKey::Wasm(export) => write!(f, "wasm:{export}"),
        }
    }
}

impl Serialize for SessionKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A function or tenant name: lowercase letters, digits and dashes, 1 to 63 of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Name(pub String);

/// Whether `text` is a name: the one character set of everything that becomes a file
/// name (functions, tenants, and the daemon's invocation and session ids), so no name
/// can be `..`, hold a `/`, or start with a dot.
pub fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

impl TryFrom<String> for Name {
    type Error = String;
    fn try_from(text: String) -> Result<Name, String> {
        if is_name(&text) {
            Ok(Name(text))
        } else {
            Err(format!("invalid name {text:?}: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit"))
        }
    }
}

/// Bytes, written as `128M`, `1G`, `512K` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl Bytes {
    fn checked(bytes: u64) -> Result<Bytes, String> {
        if bytes < 1 << 20 {
            return Err(format!("{bytes} bytes is too little: at least 1M"));
        }
        Ok(Bytes(bytes))
    }
}

impl TryFrom<String> for Bytes {
    type Error = String;
    fn try_from(text: String) -> Result<Bytes, String> {
        let bytes = parse_size(&text).ok_or_else(|| {
            format!("invalid size {text:?}: use bytes or a K, M or G suffix, like 128M")
        })?;
        Bytes::checked(bytes)
    }
}

/// Deserializes a scalar through `TryFrom<String>`, checking it inside the visitor so
/// the error keeps the value's key path and position (serde's `try_from` attribute
/// reports them at the enclosing mapping instead).
macro_rules! checked_scalar {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a scalar")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        <$ty>::try_from(v.to_owned()).map_err(E::custom)
                    }
                    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<$ty, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<$ty, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<$ty, E> {
                        self.visit_str(&v.to_string())
                    }
                }
                d.deserialize_any(V)
            }
        }
    )*};
}

checked_scalar!(Bytes, Name, Cpus, Pids, Count, Interval, SessionKey);

/// `128M`, `1G`, `512KiB`, `4096`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    let value: f64 = digits.parse().ok()?;
    Some((value * (1u64 << shift) as f64) as u64)
}

/// CPU time per wall second, from 0.01 to 64.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpus(pub f64);

impl TryFrom<String> for Cpus {
    type Error = String;
    fn try_from(text: String) -> Result<Cpus, String> {
        let v: f64 = text
            .parse()
            .map_err(|_| format!("invalid CPU count {text:?}: use a number like 0.5"))?;
        if (0.01..=64.0).contains(&v) {
            Ok(Cpus(v))
        } else {
            Err(format!("{v} CPUs is out of range: use 0.01 to 64"))
        }
    }
}

/// A process limit, 1 to 65536.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pids(pub u64);

impl TryFrom<String> for Pids {
    type Error = String;
    fn try_from(text: String) -> Result<Pids, String> {
        let v: u64 = text
            .parse()
            .map_err(|_| format!("invalid number {text:?}"))?;
        if (1..=65536).contains(&v) {
            Ok(Pids(v))
        } else {
            Err(format!("{v} is out of range: use 1 to 65536"))
        }
    }
}

/// A count of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u32);

impl TryFrom<String> for Count {
    type Error = String;
    fn try_from(text: String) -> Result<Count, String> {
        let v: u32 = text
            .parse()
            .map_err(|_| format!("invalid number {text:?}"))?;
        if v >= 1 {
            Ok(Count(v))
        } else {
            Err("must be at least 1".to_owned())
        }
    }
}

/// A duration written `500ms`, `30s`, `5m`, `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval(pub Duration);

impl TryFrom<String> for Interval {
    type Error = String;
    fn try_from(text: String) -> Result<Interval, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let n: u64 = digits.parse().map_err(|_| {
            format!("invalid duration {text:?}: use a number and ms, s, m or h, like 30s")
        })?;
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => {
                return Err(format!(
                    "invalid duration {text:?}: use a number and ms, s, m or h, like 30s"
                ))
            }
        };
        Ok(Interval(d))
    }
}

fn default_code() -> String {
    ".".to_owned()
}
fn default_tenant() -> Name {
    Name("default".to_owned())
}
fn default_memory() -> Bytes {
    Bytes(128 << 20)
}
fn default_cpu() -> Cpus {
    Cpus(1.0)
}
fn default_pids() -> Pids {
    Pids(64)
}
fn default_timeout() -> Interval {
    Interval(Duration::from_secs(30))
}
fn default_keep_alive() -> Interval {
    Interval(Duration::from_secs(300))
}
fn default_max_instances() -> Count {
    Count(16)
}
fn default_queue() -> Count {
    Count(1024)
}
fn default_session_concurrency() -> Count {
    Count(10)
}
fn one() -> Count {
    Count(1)
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory: default_memory(),
            cpu: default_cpu(),
            pids: default_pids(),
            timeout: default_timeout(),
        }
    }
}

impl Default for Scale {
    fn default() -> Scale {
        Scale {
            concurrency: one(),
            min_instances: 0,
            max_instances: default_max_instances(),
            keep_alive: default_keep_alive(),
            queue: default_queue(),
        }
    }
}

/// A manifest that does not parse or validate: `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ManifestError {}

impl Manifest {
    /// Reads `DIR/skiff.yaml`.
    pub fn load(dir: &Path) -> anyhow::Result<Manifest> {
        let path = dir.join(FILE_NAME);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        Ok(Manifest::parse(&text, &path.display().to_string())?)
    }

    /// Parses and checks a manifest's text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Manifest, ManifestError> {
        let error = |line: usize, column: usize, message: String| ManifestError {
            file: file.to_owned(),
            line,
            column,
            message,
        };
        let manifest: Manifest = serde_norway::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            // serde_norway appends " at line L column C"; we print the place first.
            let message = e.to_string();
            let message = message
                .rsplit_once(" at line ")
                .map_or(message.as_str(), |(m, _)| m)
                .to_owned();
            error(line, column, message)
        })?;
        // Checks across fields point at the key they are about.
        let at = |key: &str| key_position(text, key);
        let handler_ok = match manifest.runtime {
            Runtime::Python3 => split_handler(&manifest.handler, '.').is_some(),
            Runtime::Node => split_handler(&manifest.handler, '.').is_some(),
            Runtime::Binary => !manifest.handler.is_empty() && !manifest.handler.starts_with('/'),
            Runtime::Wasm => manifest.handler.ends_with(".wasm") && !manifest.handler.contains('/'),
        };
        if !handler_ok {
            let (l, c) = at("handler");
            let expected = match manifest.runtime {
                Runtime::Python3 => "MODULE.FUNCTION, like main.handle",
                Runtime::Node => "FILE.EXPORT, like index.handler",
                Runtime::Binary => "a path inside the function's code, like ./echo",
                Runtime::Wasm => "NAME.wasm, a module in the function's directory",
            };
            return Err(error(
                l,
                c,
                format!(
                    "handler: {:?} does not fit runtime {:?}: expected {expected}",
                    manifest.handler, manifest.runtime
                ),
            ));
        }
        if manifest.session.is_some() && manifest.runtime != Runtime::Wasm {
            let (l, c) = at("session");
            return Err(error(
                l,
                c,
                "session: sessions are only for runtime wasm".to_owned(),
            ));
        }
        if !manifest.packages.is_empty()
            && !matches!(manifest.runtime, Runtime::Python3 | Runtime::Node)
        {
            let (l, c) = at("packages");
            return Err(error(
                l,
                c,
                "packages: only python3 (PyPI) and node (npm) functions take packages".to_owned(),
            ));
        }
        if manifest.scale.min_instances > manifest.scale.max_instances.0 {
            let (l, c) = at("scale");
            return Err(error(
                l,
                c,
                "scale: min_instances is above max_instances".to_owned(),
            ));
        }
        if Path::new(&manifest.code).is_absolute() || manifest.code.split('/').any(|p| p == "..") {
            let (l, c) = at("code");
            return Err(error(
                l,
                c,
                format!(
                    "code: {:?} must be a path inside the function's directory",
                    manifest.code
                ),
            ));
        }
        Ok(manifest)
    }
}

/// `main.handle` -> ("main", "handle").
pub fn split_handler(handler: &str, sep: char) -> Option<(&str, &str)> {
    let (module, func) = handler.rsplit_once(sep)?;
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '/' || c == '-' || c == '.')
    };
    (ident(module) && ident(func)).then_some((module, func))
}

/// (line, column) of a top-level `key:` in the text, for errors found after parsing.
fn key_position(text: &str, key: &str) -> (usize, usize) {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map_or((1, 1), |i| (i + 1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Manifest::parse(text, "skiff.yaml").unwrap_err().to_string()
    }

    #[test]
    fn a_full_manifest_parses_with_defaults() {
        let m = Manifest::parse(
            "name: hello\nruntime: python3\nhandler: main.handle\npackages: [requests==2.31.0]\nlimits:\n  memory: 64M\n  timeout: 5s\nenv:\n  GREETING: hi\n",
            "skiff.yaml",
        )
        .unwrap();
        assert_eq!(m.name.0, "hello");
        assert_eq!(m.runtime, Runtime::Python3);
        assert_eq!(m.limits.memory, Bytes(64 << 20));
        assert_eq!(m.limits.timeout, Interval(Duration::from_secs(5)));
        assert_eq!(m.limits.pids, Pids(64));
        assert_eq!(m.scale.max_instances, Count(16));
        assert_eq!(m.code, ".");
        assert_eq!(m.tenant.0, "default");
        assert_eq!(m.env["GREETING"], "hi");
    }

    #[test]
    fn errors_name_the_key_line_and_column() {
        assert_eq!(
            err("name: a\nruntime: python3\nhandler: m.h\nlimts: {}\n"),
            "skiff.yaml:4:1: unknown field `limts`, expected one of `name`, `runtime`, `handler`, `code`, `packages`, `env`, `limits`, `scale`, `tenant`, `network`, `session`"
        );
        assert_eq!(
            err("name: a\nruntime: python3\nhandler: m.h\nlimits:\n  memory: lots\n"),
            "skiff.yaml:5:11: limits.memory: invalid size \"lots\": use bytes or a K, M or G suffix, like 128M"
        );
        assert!(err("name: a\nruntime: ruby\nhandler: m.h\n")
            .starts_with("skiff.yaml:2:10: runtime: unknown variant `ruby`"));
        assert!(err("name: Bad_Name\nruntime: node\nhandler: i.h\n")
            .starts_with("skiff.yaml:1:7: name: invalid name"));
        assert!(
            err("name: a\nruntime: node\nhandler: i.h\nlimits:\n  cpu: 100\n")
                .starts_with("skiff.yaml:5:8: limits.cpu: 100 CPUs is out of range")
        );
        assert!(
            err("name: a\nruntime: node\nhandler: i.h\nlimits:\n  timeout: soon\n")
                .contains("limits.timeout: invalid duration")
        );
        assert!(err("name: a\nruntime: python3\n").contains("missing field `handler`"));
        assert!(err("name: a\nruntime: python3\nhandler: nodot\n")
            .starts_with("skiff.yaml:3:1: handler: \"nodot\" does not fit runtime Python3"));
        assert!(
            err("name: a\nruntime: node\nhandler: i.h\nsession:\n  key: header:x\n")
                .starts_with("skiff.yaml:4:1: session: sessions are only for runtime wasm")
        );
        assert!(
            err("name: a\nruntime: wasm\nhandler: f.wasm\nsession:\n  key: cookie:x\n")
                .contains("session.key: invalid session key")
        );
        assert!(
            err("name: a\nruntime: binary\nhandler: ./x\npackages: [left-pad]\n")
                .starts_with("skiff.yaml:4:1: packages:")
        );
        assert!(
            err("name: a\nruntime: binary\nhandler: ./x\ncode: ../elsewhere\n")
                .starts_with("skiff.yaml:4:1: code:")
        );
        // A mis-indented key folds into the previous value: the error points there.
        assert!(err("name: a\nruntime: binary\n  handler: x\n")
            .starts_with("skiff.yaml:2:10: runtime: unknown variant"));
    }
}

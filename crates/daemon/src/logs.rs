//! Function logs: `DATA/logs/<function>.log`, one JSON object per line (`ts`,
//! `invocation`, `stream`, `line`), rotated to `.log.1` past [`MAX_FILE`] so a function
//! that floods its output costs a bounded amount of disk.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

const MAX_FILE: u64 = 16 << 20;

#[derive(Serialize, Deserialize)]
pub struct Line {
    pub ts: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    pub stream: String,
    pub line: String,
}

pub struct Logs {
    dir: PathBuf,
    open: Mutex<HashMap<String, (File, u64)>>,
}

impl Logs {
    pub fn open(data: &std::path::Path) -> std::io::Result<Logs> {
        let dir = data.join("logs");
        std::fs::create_dir_all(&dir)?;
        Ok(Logs {
            dir,
            open: Mutex::new(HashMap::new()),
        })
    }

    fn path(&self, function: &str) -> Option<PathBuf> {
        crate::names::inside(&self.dir, function, ".log").ok()
    }

    /// Appends each line of `text`. Logging never fails an invocation: errors are dropped.
    pub fn append(&self, function: &str, invocation: Option<&str>, stream: &str, text: &str) {
        let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let mut out = Vec::new();
        for line in text.lines() {
            let entry = Line {
                ts: ts.clone(),
                invocation: invocation.map(str::to_owned),
                stream: stream.to_owned(),
                line: line.to_owned(),
            };
            let _ = serde_json::to_writer(&mut out, &entry);
            out.push(b'\n');
        }
        let Some(path) = self.path(function) else {
            return;
        };
        let mut open = self.open.lock().unwrap();
        if !open.contains_key(function) {
            let Ok(file) = File::options().create(true).append(true).open(&path) else {
                return;
            };
            let size = file.metadata().map_or(0, |m| m.len());
            open.insert(function.to_owned(), (file, size));
        }
        let (file, size) = open.get_mut(function).expect("just opened");
        if *size + out.len() as u64 > MAX_FILE {
            let _ = std::fs::rename(&path, path.with_extension("log.1"));
            match File::options().create(true).append(true).open(&path) {
                Ok(fresh) => (*file, *size) = (fresh, 0),
                Err(_) => return,
            }
        }
        if file.write_all(&out).is_ok() {
            *size += out.len() as u64;
        }
    }

    /// The last `tail` lines of a function's log (of one invocation, if given).
    pub fn read(&self, function: &str, invocation: Option<&str>, tail: usize) -> Vec<Line> {
        let Some(path) = self.path(function) else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        for file in [path.with_extension("log.1"), path] {
            let Ok(f) = File::open(&file) else { continue };
            for text in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                let Ok(line) = serde_json::from_str::<Line>(&text) else {
                    continue;
                };
                if invocation.is_none() || line.invocation.as_deref() == invocation {
                    lines.push(line);
                }
            }
        }
        let skip = lines.len().saturating_sub(tail);
        lines.split_off(skip)
    }

    /// The log file, for following it.
    pub fn file(&self, function: &str) -> Option<PathBuf> {
        self.path(function)
    }

    /// Forgets a removed function's logs.
    pub fn remove(&self, function: &str) {
        self.open.lock().unwrap().remove(function);
        let Some(path) = self.path(function) else {
            return;
        };
        let _ = std::fs::remove_file(path.with_extension("log.1"));
        let _ = std::fs::remove_file(path);
    }
}

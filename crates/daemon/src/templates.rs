//! Template processes (zygotes), one per interpreter: a cold start of a python3
//! function forks one into a fresh sandbox instead of starting the interpreter (SOCK's
//! idea). Templates are started from one long-lived thread, because a template's
//! parent-death signal follows the thread that started it and the async runtime's
//! threads come and go.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use skiff_sandbox::template::Template;

type StartRequest = (Vec<String>, mpsc::Sender<Result<Template>>);

pub struct Templates {
    /// By the interpreter's (device, inode): every environment of one runtime layer
    /// links the same interpreter file.
    running: Mutex<HashMap<(u64, u64), Arc<Template>>>,
    starter: Mutex<mpsc::Sender<StartRequest>>,
}

impl Templates {
    pub fn new() -> Templates {
        let (tx, rx) = mpsc::channel::<StartRequest>();
        std::thread::Builder::new()
            .name("skiff-templates".into())
            .spawn(move || {
                for (argv, reply) in rx {
                    let _ = reply.send(Template::start(&argv));
                }
            })
            .expect("spawn the template thread");
        Templates {
            running: Mutex::new(HashMap::new()),
            starter: Mutex::new(tx),
        }
    }

    /// The template for the interpreter at `interpreter` (inside an environment's
    /// root), started on first use with `argv_tail` after the interpreter's path.
    pub fn get(&self, interpreter: &Path, argv_tail: &[&str]) -> Result<Arc<Template>> {
        let real = interpreter
            .canonicalize()
            .with_context(|| format!("no interpreter at {}", interpreter.display()))?;
        let meta = std::fs::metadata(&real)?;
        let key = (meta.dev(), meta.ino());
        if let Some(t) = self.running.lock().unwrap().get(&key) {
            if t.is_alive() {
                return Ok(t.clone());
            }
        }
        let mut argv = vec![real.to_string_lossy().into_owned()];
        argv.extend(argv_tail.iter().map(|s| s.to_string()));
        let (tx, rx) = mpsc::channel();
        self.starter
            .lock()
            .unwrap()
            .send((argv, tx))
            .context("the template thread is gone")?;
        let template = Arc::new(rx.recv().context("the template thread is gone")??);
        self.running.lock().unwrap().insert(key, template.clone());
        Ok(template)
    }

    /// Stops every template.
    pub fn clear(&self) {
        self.running.lock().unwrap().clear();
    }
}

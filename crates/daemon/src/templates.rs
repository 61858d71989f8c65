//! Template processes (zygotes), one per interpreter: a cold start of a python3
//! function forks one into a fresh sandbox instead of starting the interpreter (SOCK's
//! idea). Templates are started from one long-lived thread, because a template's
//! parent-death signal follows the thread that started it and the async runtime's
//! threads come and go.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use skiff_cgroups::Entry;
use skiff_sandbox::template::Template;
use skiff_sandbox::{Child, Spec};

use crate::instance::{NODE_BOOTSTRAP, PYTHON_BOOTSTRAP};
use crate::registry::{Function, Runtime};

/// The node template's native half, built by build.rs (empty when it could not be).
const NODE_TEMPLATE_ADDON: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/node_template.node"));

/// An interpreter file's (device, inode).
type InterpreterKey = (u64, u64);

/// A template's command line, its environment, and where its answer goes.
type StartRequest = (
    Vec<String>,
    Vec<(String, String)>,
    mpsc::Sender<Result<Template>>,
);

pub struct Templates {
    /// By the interpreter's (device, inode): every environment of one runtime layer
    /// links the same interpreter file.
    running: Mutex<HashMap<InterpreterKey, Arc<Template>>>,
    /// The compiled python bootstrap, by interpreter as above.
    python_code: Mutex<HashMap<InterpreterKey, Option<Arc<[u8]>>>>,
    starter: Mutex<mpsc::Sender<StartRequest>>,
}

impl Templates {
    pub fn new() -> Templates {
        let (tx, rx) = mpsc::channel::<StartRequest>();
        std::thread::Builder::new()
            .name("skiff-templates".into())
            .spawn(move || {
                for (argv, env, reply) in rx {
                    let _ = reply.send(Template::start(&argv, &env));
                }
            })
            .expect("spawn the template thread");
        Templates {
            running: Mutex::new(HashMap::new()),
            python_code: Mutex::new(HashMap::new()),
            starter: Mutex::new(tx),
        }
    }

    /// Forks an instance of `f` for `spec` from its runtime's template (started on first
    /// use), and says which template; `None` for runtimes without one.
    pub fn fork(
        &self,
        data: &Path,
        f: &Function,
        spec: &Spec,
        entry: &Entry,
    ) -> Option<Result<(Child, Arc<Template>)>> {
        let started = match f.runtime {
            Runtime::Python3 => self.get(&spec.rootfs.join("usr/bin/python3"), || {
                let argv = ["-I", "-S", "-c", PYTHON_BOOTSTRAP, "--template"];
                Ok((argv.map(String::from).to_vec(), vec![]))
            }),
            // Forking node is sound only with no helper threads at work: V8's worker
            // pool off, and its collector on the main thread. --no-lazy: the template
            // compiles its own code up front rather than each fork compiling it again
            // (the bootstrap turns lazy compilation back on for the function's code).
            // The addon is preloaded too, for its madvise (see node_template.c).
            // --use-largepages: node's code moves to anonymous huge pages, which a fork
            // shares as they are (a file's pages it would make each child fault in again).
            Runtime::Node if !NODE_TEMPLATE_ADDON.is_empty() => {
                self.get(&spec.rootfs.join("usr/bin/node"), || {
                    let addon = node_addon(data)?;
                    let argv = [
                        "--v8-pool-size=0",
                        "--single-threaded",
                        "--no-lazy",
                        "--use-largepages=on",
                        "-e",
                        NODE_BOOTSTRAP,
                        "@template",
                        &addon,
                    ];
                    let env = vec![("LD_PRELOAD".to_owned(), addon.clone())];
                    Ok((argv.map(String::from).to_vec(), env))
                })
            }
            _ => return None,
        };
        let mut extra = serde_json::Map::new();
        extra.insert("handler".into(), f.handler.clone().into());
        extra.insert("concurrency".into(), f.scale.concurrency.into());
        Some(started.and_then(|template| Ok((template.fork(spec, entry, extra)?, template))))
    }

    /// The template for the interpreter at `interpreter` (inside an environment's
    /// root), started on first use with the arguments and environment `how` makes.
    fn get(
        &self,
        interpreter: &Path,
        how: impl FnOnce() -> Result<(Vec<String>, Vec<(String, String)>)>,
    ) -> Result<Arc<Template>> {
        let (real, key) = identify(interpreter)?;
        if let Some(t) = self.running.lock().unwrap().get(&key) {
            if t.is_alive() {
                return Ok(t.clone());
            }
        }
        let (tail, env) = how()?;
        let mut argv = vec![real.to_string_lossy().into_owned()];
        argv.extend(tail);
        let (tx, rx) = mpsc::channel();
        self.starter
            .lock()
            .unwrap()
            .send((argv, env, tx))
            .context("the template thread is gone")?;
        let template = Arc::new(rx.recv().context("the template thread is gone")??);
        self.running.lock().unwrap().insert(key, template.clone());
        Ok(template)
    }

    /// The python bootstrap compiled by the interpreter under `root` (marshalled): a
    /// plain start then skips compiling its ~400 lines (several ms). Made on first use
    /// and kept per interpreter; `None` if that interpreter could not make it.
    pub fn python_bootstrap_code(&self, root: &Path) -> Option<Arc<[u8]>> {
        let (real, key) = identify(&root.join("usr/bin/python3")).ok()?;
        if let Some(code) = self.python_code.lock().unwrap().get(&key) {
            return code.clone();
        }
        let code = compile_python_bootstrap(&real)
            .inspect_err(|e| eprintln!("skiff: warning: the python bootstrap stays source: {e:#}"))
            .ok()
            .map(Arc::from);
        self.python_code.lock().unwrap().insert(key, code.clone());
        code
    }

    /// Stops every template.
    pub fn clear(&self) {
        self.running.lock().unwrap().clear();
    }
}

/// The interpreter's real path and its key.
fn identify(interpreter: &Path) -> Result<(PathBuf, InterpreterKey)> {
    let real = interpreter
        .canonicalize()
        .with_context(|| format!("no interpreter at {}", interpreter.display()))?;
    let meta = std::fs::metadata(&real)?;
    Ok((real, (meta.dev(), meta.ino())))
}

/// Runs `python` (on the host, as its template does) to compile the bootstrap under
/// the name `-c` gives, which its tracebacks filter on.
fn compile_python_bootstrap(python: &Path) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    const COMPILE: &str = "import marshal, sys; \
        sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), '<string>', 'exec')))";
    let mut child = Command::new(python)
        .args(["-I", "-S", "-c", COMPILE])
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", python.display()))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(PYTHON_BOOTSTRAP.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!(
            "{} {}: {}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The addon, written once under the data directory (node loads addons from files);
/// named by a hash of its bytes, so a new build writes a new file.
fn node_addon(data: &Path) -> Result<String> {
    let digest = NODE_TEMPLATE_ADDON
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let dir = data.join("pool").join("templates");
    let path = dir.join(format!("node-template-{digest:016x}.node"));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".node-template-{}", std::process::id()));
        std::fs::write(&tmp, NODE_TEMPLATE_ADDON)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path.to_string_lossy().into_owned())
}

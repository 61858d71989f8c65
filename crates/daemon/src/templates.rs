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
use skiff_sandbox::template::{Template, View};
use skiff_sandbox::{Child, Spec};

use crate::instance::{NODE_BOOTSTRAP, PYTHON_BOOTSTRAP};
use crate::registry::{Function, Runtime};

/// The node template's native half, built by build.rs (empty when it could not be).
const NODE_TEMPLATE_ADDON: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/node_template.node"));
/// The sandbox entry as a shared object, for python's template (ctypes), built by
/// build.rs (empty when it could not be).
const SANDBOX_ENTRY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/skiff_entry.so"));

/// An interpreter file's (device, inode).
type InterpreterKey = (u64, u64);

/// How to start a template, and where its answer goes.
struct StartRequest {
    /// The runtime layer's root, which the template sees as `/`.
    root: PathBuf,
    /// Host files it sees under /tmp, by name.
    files: Vec<(PathBuf, String)>,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    reply: mpsc::Sender<Result<Template>>,
}

pub struct Templates {
    /// By the interpreter's (device, inode): every environment of one runtime layer
    /// links the same interpreter file.
    running: Mutex<HashMap<InterpreterKey, Arc<Template>>>,
    /// The compiled python bootstrap, by interpreter as above.
    python_code: Mutex<HashMap<InterpreterKey, Option<Arc<[u8]>>>>,
    starter: Mutex<mpsc::Sender<StartRequest>>,
}

impl Templates {
    /// Templates whose /dev is the device template `dev`.
    pub fn new(dev: PathBuf) -> Templates {
        let (tx, rx) = mpsc::channel::<StartRequest>();
        std::thread::Builder::new()
            .name("skiff-templates".into())
            .spawn(move || {
                for r in rx {
                    let view = View {
                        root: &r.root,
                        dev: &dev,
                        files: r.files,
                    };
                    let _ = r.reply.send(Template::start(&view, &r.argv, &r.env));
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
    /// use), or `f`'s own template (see `crate::fn_templates`) when `as_function_template`;
    /// says which template; `None` for runtimes without one.
    pub fn fork(
        &self,
        data: &Path,
        f: &Function,
        spec: &Spec,
        entry: &Entry,
        as_function_template: bool,
    ) -> Option<Result<(Child, Arc<Template>)>> {
        let started = match f.runtime {
            Runtime::Python3 if !SANDBOX_ENTRY.is_empty() => {
                self.get(data, &spec.rootfs, "python3", || {
                    // The entry, as the template sees it (see `View`).
                    let argv = [
                        "-I",
                        "-S",
                        "-c",
                        PYTHON_BOOTSTRAP,
                        "--template",
                        "/tmp/skiff_entry.so",
                    ];
                    Ok(Launch {
                        argv: argv.map(String::from).to_vec(),
                        files: vec![(
                            written_once(data, "skiff_entry", "so", SANDBOX_ENTRY)?,
                            "skiff_entry.so".to_owned(),
                        )],
                        ..Launch::default()
                    })
                })
            }
            // Forking node is sound only with no helper threads at work: V8's worker
            // pool off, and its collector on the main thread. --no-lazy: the template
            // compiles its own code up front rather than each fork compiling it again
            // (the bootstrap turns lazy compilation back on for the function's code).
            // The addon is preloaded too, for its madvise (see node_template.c).
            // --use-largepages: node's code moves to anonymous huge pages, which a fork
            // shares as they are (a file's pages it would make each child fault in again).
            Runtime::Node if !NODE_TEMPLATE_ADDON.is_empty() => {
                self.get(data, &spec.rootfs, "node", || {
                    // The addon, as the template sees it (see `View`).
                    const ADDON: &str = "/tmp/node_template.node";
                    let argv = [
                        "--v8-pool-size=0",
                        "--single-threaded",
                        "--no-lazy",
                        "--use-largepages=on",
                        "-e",
                        NODE_BOOTSTRAP,
                        "@template",
                        ADDON,
                    ];
                    Ok(Launch {
                        argv: argv.map(String::from).to_vec(),
                        env: vec![("LD_PRELOAD".to_owned(), ADDON.to_owned())],
                        files: vec![(
                            written_once(data, "node-template", "node", NODE_TEMPLATE_ADDON)?,
                            "node_template.node".to_owned(),
                        )],
                    })
                })
            }
            _ => return None,
        };
        let mut extra = serde_json::Map::new();
        extra.insert("handler".into(), f.handler.clone().into());
        extra.insert("concurrency".into(), f.scale.concurrency.into());
        if as_function_template {
            extra.insert("function_template".into(), true.into());
        }
        Some(started.and_then(|template| Ok((template.fork(spec, entry, extra)?, template))))
    }

    /// The template for the interpreter `/usr/bin/NAME` of the environment at `rootfs`,
    /// started on first use, in its runtime layer's view, as `how` says.
    fn get(
        &self,
        data: &Path,
        rootfs: &Path,
        name: &str,
        how: impl FnOnce() -> Result<Launch>,
    ) -> Result<Arc<Template>> {
        let interpreter = Path::new("usr/bin").join(name);
        let (_, key) = identify(&rootfs.join(&interpreter))?;
        if let Some(t) = self.running.lock().unwrap().get(&key) {
            if t.is_alive() {
                return Ok(t.clone());
            }
        }
        let root = runtime_root(data, &interpreter, key)?;
        let Launch {
            argv: tail,
            env,
            files,
        } = how()?;
        // The name a plain start runs (python3, a link to python3.11): sys.executable is
        // the same in a forked instance.
        let mut argv = vec![format!("/{}", interpreter.display())];
        argv.extend(tail);
        let (reply, rx) = mpsc::channel();
        let request = StartRequest {
            root,
            files,
            argv,
            env,
            reply,
        };
        self.starter
            .lock()
            .unwrap()
            .send(request)
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

/// A template's command line after the interpreter, its environment, and the host files
/// it sees under /tmp.
#[derive(Default)]
struct Launch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    files: Vec<(PathBuf, String)>,
}

/// The root of the runtime layer whose `interpreter` (a path inside it) is the file `key`
/// names: every environment of that runtime links the same file.
fn runtime_root(data: &Path, interpreter: &Path, key: InterpreterKey) -> Result<PathBuf> {
    let envs = data.join("envs");
    for entry in std::fs::read_dir(&envs)?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("runtime-") {
            continue;
        }
        let root = entry.path().join("root");
        let same = identify(&root.join(interpreter)).is_ok_and(|(_, k)| k == key);
        if same && root.join("tmp").is_dir() {
            return Ok(root);
        }
    }
    anyhow::bail!(
        "no runtime layer in {} holds this environment's {}",
        envs.display(),
        interpreter.display()
    )
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

/// `bytes` (a template's native code), written once under the data directory as
/// `NAME-HASH.EXT` (interpreters load native code from files): a new build writes a new
/// file.
fn written_once(data: &Path, name: &str, ext: &str, bytes: &[u8]) -> Result<PathBuf> {
    let digest = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let dir = data.join("pool").join("templates");
    let path = dir.join(format!("{name}-{digest:016x}.{ext}"));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{name}-{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path)
}

//! The wasm host: WASI preview 1 modules on wasmtime, compiled once at deploy and kept
//! on disk (the worker memory-maps the compiled file), one fresh instance per request
//! from the pooling allocator and a pre-instantiated module, with a time limit (epochs)
//! and a memory limit per request, and skiff's guest API (the import module `skiff`).

use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use skiff_session::{Error as StateError, Mode, State};
use wasmtime::{
    Caller, Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Memory, Module,
    PoolingAllocationConfig, ResourceLimiter, Store, Trap,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::WasiCtxBuilder;

/// How often the epoch advances: the granularity of per-request time limits.
const EPOCH_TICK: Duration = Duration::from_millis(2);
/// A request's stdout and stderr kept for its log (each).
const LOG_CAPACITY: usize = 64 << 10;
/// The longest state key a guest may use.
pub const MAX_KEY: usize = 4096;
/// Keys starting with this byte are the platform's (published values), never a guest's.
const RESERVED: u8 = 0;

/// The guest API's error codes (negative returns; -1 is "absent").
pub mod code {
    pub const ABSENT: i32 = -1;
    pub const CONFLICT: i32 = -2;
    pub const LOCK_TIMEOUT: i32 = -3;
    pub const UNAVAILABLE: i32 = -4;
    pub const BAD_ARGUMENT: i32 = -5;
}

/// The compile settings: a module compiled at deploy only loads into an engine made
/// with the same ones.
fn base_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.cranelift_opt_level(wasmtime::OptLevel::Speed);
    config
}

/// Compiles a module ahead of time (at deploy), checking that skiff can serve it: it
/// compiles, exports `memory` and every function named in `exports` as `() -> ()`, and
/// imports only WASI preview 1 and skiff's API (the error says what is wrong). The
/// result is what [`Host::load`] maps.
pub fn compile(wasm: &[u8], exports: &[&str]) -> Result<Vec<u8>> {
    let engine = Engine::new(&base_config())?;
    let module = Module::new(&engine, wasm).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    if module.get_export("memory").is_none() {
        anyhow::bail!("the module does not export `memory`");
    }
    for name in exports {
        match module.get_export(name) {
            Some(wasmtime::ExternType::Func(f))
                if f.params().len() == 0 && f.results().len() == 0 => {}
            Some(_) => anyhow::bail!("the module's export `{name}` is not a function () -> ()"),
            None => anyhow::bail!("the module does not export `{name}`"),
        }
    }
    for import in module.imports() {
        if !matches!(import.module(), "skiff" | "wasi_snapshot_preview1") {
            anyhow::bail!(
                "the module imports `{}::{}`: only `skiff` and `wasi_snapshot_preview1` are provided",
                import.module(),
                import.name()
            );
        }
    }
    let mut linker: Linker<Ctx> = Linker::new(&engine);
    add_imports(&mut linker)?;
    linker
        .instantiate_pre(&module)
        .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    Ok(module.serialize()?)
}

/// How many requests run at once and what each may use.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// Instances alive at once (the worker's concurrency, plus hook calls).
    pub instances: u32,
    /// Linear memory per instance.
    pub memory_bytes: u64,
}

/// Reads values other sessions published (the worker asks the daemon).
pub trait Published: Send + Sync {
    fn read(
        &self,
        address: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, StateError>;
}

/// What one request is given.
pub struct Request<'a> {
    /// The export to call: `handle`, or a session hook.
    pub export: &'a str,
    pub input: Vec<u8>,
    /// Unique within the worker: the request's strong reads are held under it.
    pub txn: u64,
    pub deadline: Instant,
    pub state: Arc<dyn State>,
    pub published: Arc<dyn Published>,
}

/// What one request did.
pub struct Outcome {
    pub output: Vec<u8>,
    /// The guest's stdout and stderr.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Why it failed: a trap, the time limit, the memory limit.
    pub failure: Option<String>,
    /// It was stopped at its time limit.
    pub timed_out: bool,
}

/// A loaded module, ready to instantiate per request.
pub struct Host {
    engine: Engine,
    pre: InstancePre<Ctx>,
    has_initialize: bool,
    memory_bytes: u64,
}

struct Ctx {
    wasi: WasiP1Ctx,
    memory_bytes: u64,
    memory_denied: bool,
    memory: Option<Memory>,
    input: Vec<u8>,
    output: Vec<u8>,
    txn: u64,
    deadline: Instant,
    state: Arc<dyn State>,
    published: Arc<dyn Published>,
}

impl ResourceLimiter for Ctx {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = desired as u64 <= self.memory_bytes;
        self.memory_denied |= !ok;
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl Host {
    /// Maps a module compiled by [`precompile`] and prepares its instances. Starts the
    /// thread that advances the engine's epoch.
    pub fn load(compiled: &Path, sizing: Sizing) -> Result<Host> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_core_instances(sizing.instances)
            .total_memories(sizing.instances)
            .total_tables(sizing.instances)
            .total_stacks(sizing.instances)
            .max_memory_size(sizing.memory_bytes as usize)
            // Give freed memory back except a little, so an idle worker stays small.
            .linear_memory_keep_resident(64 << 10)
            .table_keep_resident(4 << 10);
        let mut config = base_config();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        // SAFETY: the file is one skiff compiled at deploy (the store is not writable
        // by functions), and it is not modified while mapped.
        let module = unsafe { Module::deserialize_file(&engine, compiled) }
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .with_context(|| format!("loading {}", compiled.display()))?;
        let mut linker: Linker<Ctx> = Linker::new(&engine);
        add_imports(&mut linker)?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let ticker = engine.weak();
        thread::Builder::new().name("epoch".into()).spawn(move || {
            while let Some(engine) = ticker.upgrade() {
                engine.increment_epoch();
                drop(engine);
                thread::sleep(EPOCH_TICK);
            }
        })?;
        Ok(Host {
            has_initialize: module.get_export("_initialize").is_some(),
            engine,
            pre,
            memory_bytes: sizing.memory_bytes,
        })
    }

    /// Runs one request in a fresh instance. The state's open strong reads of this
    /// request are released when it ends, however it ends.
    pub fn run(&self, request: Request<'_>) -> Outcome {
        let stdout = MemoryOutputPipe::new(LOG_CAPACITY);
        let stderr = MemoryOutputPipe::new(LOG_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build_p1();
        let (state, txn) = (request.state.clone(), request.txn);
        let mut store = Store::new(
            &self.engine,
            Ctx {
                wasi,
                memory_bytes: self.memory_bytes,
                memory_denied: false,
                memory: None,
                input: request.input,
                output: Vec::new(),
                txn,
                deadline: request.deadline,
                state: request.state,
                published: request.published,
            },
        );
        store.limiter(|ctx| ctx);
        let left = request.deadline.saturating_duration_since(Instant::now());
        store.set_epoch_deadline((left.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64);
        store.epoch_deadline_trap();
        let result = self.call(&mut store, request.export);
        state.finish(txn);
        let ctx = store.data();
        let timed_out = result
            .as_ref()
            .err()
            .is_some_and(|e| matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)));
        let failure = result.err().map(|e| {
            if ctx.memory_denied {
                format!(
                    "the request exceeded its memory limit of {} MiB ({e})",
                    self.memory_bytes >> 20
                )
            } else if timed_out {
                "the request ran past its time limit".to_owned()
            } else if let Some(trap) = e.downcast_ref::<Trap>() {
                // The reason first; where it happened after.
                match e.downcast_ref::<wasmtime::WasmBacktrace>() {
                    Some(trace) => format!("{trap}\n{trace}"),
                    None => trap.to_string(),
                }
            } else {
                format!("{e:#}")
            }
        });
        Outcome {
            output: std::mem::take(&mut store.data_mut().output),
            stdout: stdout.contents().to_vec(),
            stderr: stderr.contents().to_vec(),
            failure,
            timed_out,
        }
    }

    fn call(&self, store: &mut Store<Ctx>, export: &str) -> wasmtime::Result<()> {
        let instance = self.pre.instantiate(&mut *store)?;
        store.data_mut().memory = instance.get_memory(&mut *store, "memory");
        if self.has_initialize {
            instance
                .get_typed_func::<(), ()>(&mut *store, "_initialize")?
                .call(&mut *store, ())?;
        }
        instance
            .get_typed_func::<(), ()>(&mut *store, export)?
            .call(&mut *store, ())
    }
}

/// The guest's memory as a slice, or `None` when `[ptr, ptr + len)` is outside it.
fn guest(memory: &[u8], ptr: i32, len: i32) -> Option<&[u8]> {
    let (ptr, len) = (usize::try_from(ptr).ok()?, usize::try_from(len).ok()?);
    memory.get(ptr..ptr.checked_add(len)?)
}

fn guest_mut(memory: &mut [u8], ptr: i32, len: i32) -> Option<&mut [u8]> {
    let (ptr, len) = (usize::try_from(ptr).ok()?, usize::try_from(len).ok()?);
    memory.get_mut(ptr..ptr.checked_add(len)?)
}

fn state_code(e: StateError) -> i32 {
    match e {
        StateError::Conflict => code::CONFLICT,
        StateError::LockTimeout => code::LOCK_TIMEOUT,
        StateError::Unavailable(_) => code::UNAVAILABLE,
    }
}

fn mode(m: i32) -> Option<Mode> {
    match m {
        0 => Some(Mode::Weak),
        1 => Some(Mode::Strong),
        _ => None,
    }
}

/// A guest's key: within bounds, not too long, not reserved.
fn guest_key(memory: &[u8], ptr: i32, len: i32) -> Option<Vec<u8>> {
    let key = guest(memory, ptr, len)?;
    (key.len() <= MAX_KEY && key.first() != Some(&RESERVED)).then(|| key.to_vec())
}

/// Where a published value lives in its session's state.
pub fn published_key(name: &[u8]) -> Vec<u8> {
    [&[RESERVED][..], b"pub/", name].concat()
}

/// Copies `value` into the guest's buffer (as much as fits); returns its full length.
fn give(memory: &mut [u8], buf: i32, buf_len: i32, value: Option<Vec<u8>>) -> i32 {
    let Some(value) = value else {
        return code::ABSENT;
    };
    let Some(out) = guest_mut(memory, buf, buf_len) else {
        return code::BAD_ARGUMENT;
    };
    let n = out.len().min(value.len());
    out[..n].copy_from_slice(&value[..n]);
    i32::try_from(value.len()).unwrap_or(i32::MAX)
}

fn memory<'a>(caller: &'a mut Caller<'_, Ctx>) -> Option<(&'a mut [u8], &'a mut Ctx)> {
    let memory = caller.data().memory?;
    Some(memory.data_and_store_mut(caller))
}

fn add_imports(linker: &mut Linker<Ctx>) -> Result<()> {
    wasmtime_wasi::p1::add_to_linker_sync(linker, |ctx: &mut Ctx| &mut ctx.wasi)?;
    linker.func_wrap("skiff", "input_len", |caller: Caller<'_, Ctx>| {
        caller.data().input.len() as i32
    })?;
    linker.func_wrap(
        "skiff",
        "read_input",
        |mut caller: Caller<'_, Ctx>, buf: i32, len: i32| -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let input = std::mem::take(&mut ctx.input);
            let copied = match guest_mut(memory, buf, len) {
                Some(out) => {
                    let n = out.len().min(input.len());
                    out[..n].copy_from_slice(&input[..n]);
                    n as i32
                }
                None => code::BAD_ARGUMENT,
            };
            ctx.input = input;
            copied
        },
    )?;
    linker.func_wrap(
        "skiff",
        "set_output",
        |mut caller: Caller<'_, Ctx>, buf: i32, len: i32| -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            match guest(memory, buf, len) {
                Some(out) => {
                    ctx.output = out.to_vec();
                    0
                }
                None => code::BAD_ARGUMENT,
            }
        },
    )?;
    linker.func_wrap(
        "skiff",
        "read_state",
        |mut caller: Caller<'_, Ctx>,
         key: i32,
         key_len: i32,
         buf: i32,
         buf_len: i32,
         m: i32|
         -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let (Some(key), Some(m)) = (guest_key(memory, key, key_len), mode(m)) else {
                return code::BAD_ARGUMENT;
            };
            match ctx.state.read(ctx.txn, &key, m, ctx.deadline) {
                Ok(value) => give(memory, buf, buf_len, value),
                Err(e) => state_code(e),
            }
        },
    )?;
    linker.func_wrap(
        "skiff",
        "write_state",
        |mut caller: Caller<'_, Ctx>,
         key: i32,
         key_len: i32,
         val: i32,
         val_len: i32,
         m: i32|
         -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let (Some(key), Some(value), Some(m)) = (
                guest_key(memory, key, key_len),
                guest(memory, val, val_len),
                mode(m),
            ) else {
                return code::BAD_ARGUMENT;
            };
            match ctx.state.write(ctx.txn, &key, value, m, ctx.deadline) {
                Ok(()) => 0,
                Err(e) => state_code(e),
            }
        },
    )?;
    linker.func_wrap(
        "skiff",
        "delete_state",
        |mut caller: Caller<'_, Ctx>, key: i32, key_len: i32| -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let Some(key) = guest_key(memory, key, key_len) else {
                return code::BAD_ARGUMENT;
            };
            match ctx.state.delete(ctx.txn, &key, ctx.deadline) {
                Ok(existed) => existed as i32,
                Err(e) => state_code(e),
            }
        },
    )?;
    linker.func_wrap(
        "skiff",
        "publish",
        |mut caller: Caller<'_, Ctx>, name: i32, name_len: i32, val: i32, val_len: i32| -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let (Some(name), Some(value)) =
                (guest(memory, name, name_len), guest(memory, val, val_len))
            else {
                return code::BAD_ARGUMENT;
            };
            if name.len() > MAX_KEY {
                return code::BAD_ARGUMENT;
            }
            match ctx.state.write(
                ctx.txn,
                &published_key(name),
                value,
                Mode::Weak,
                ctx.deadline,
            ) {
                Ok(()) => 0,
                Err(e) => state_code(e),
            }
        },
    )?;
    linker.func_wrap(
        "skiff",
        "read_published",
        |mut caller: Caller<'_, Ctx>,
         addr: i32,
         addr_len: i32,
         name: i32,
         name_len: i32,
         buf: i32,
         buf_len: i32|
         -> i32 {
            let Some((memory, ctx)) = memory(&mut caller) else {
                return code::BAD_ARGUMENT;
            };
            let (Some(addr), Some(name)) =
                (guest(memory, addr, addr_len), guest(memory, name, name_len))
            else {
                return code::BAD_ARGUMENT;
            };
            let (Ok(addr), Ok(name)) = (std::str::from_utf8(addr), std::str::from_utf8(name))
            else {
                return code::BAD_ARGUMENT;
            };
            let (addr, name) = (addr.to_owned(), name.to_owned());
            match ctx.published.read(&addr, &name, ctx.deadline) {
                Ok(value) => give(memory, buf, buf_len, value),
                Err(e) => state_code(e),
            }
        },
    )?;
    Ok(())
}

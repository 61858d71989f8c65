//! The `skiff` command line.

mod admin;
mod arena;
mod client;
mod envs;
mod log;
mod records;
mod remote;
mod run;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// skiff: a serverless function platform for Linux.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Data directory: pools, sandbox records, logs, environments, functions.
    #[arg(
        long = "data-dir",
        value_name = "DIR",
        global = true,
        env = "SKIFF_DATA",
        default_value = "/var/lib/skiff"
    )]
    data_dir: PathBuf,
    /// The daemon's Unix socket (serve listens on it; other commands talk to it).
    #[arg(long, global = true, env = "SKIFF_SOCKET", default_value = skiff_daemon::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Talk to the daemon at this URL (http://HOST:PORT) instead of its socket.
    #[arg(long, global = true, env = "SKIFF_HOST")]
    host: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a new sandbox, like `docker run`.
    Run(run::RunArgs),
    /// List sandboxes, and the instances of a daemon serving the same data directory.
    Ps {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Signal a sandbox (SIGKILL by default, then free its resources).
    Kill {
        /// Signal name or number (KILL, TERM, INT, HUP, USR1, USR2, 9, ...).
        #[arg(short, long, default_value = "KILL")]
        signal: String,
        /// Sandbox id (or a unique prefix).
        id: String,
    },
    /// Remove what crashed skiff processes left behind and report it.
    Gc {
        /// Also remove the cgroup and network namespace pools themselves.
        #[arg(long)]
        pools: bool,
    },
    /// Run the daemon: the HTTP API on the Unix socket and on TCP.
    Serve {
        /// TCP address to listen on.
        #[arg(long, env = "SKIFF_LISTEN", default_value = skiff_daemon::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
        /// How long invocation records (GET /v1/invocations) are kept, e.g. 1h, 30m.
        #[arg(long, env = "SKIFF_KEEP_RECORDS", default_value = "1h", value_parser = humantime::parse_duration)]
        keep_records: std::time::Duration,
        /// How python3 instances start cold: `template` forks a ready interpreter
        /// (a zygote), `plain` starts the interpreter in the sandbox.
        #[arg(long, env = "SKIFF_COLD_START", default_value = "template", value_parser = ["template", "plain"])]
        cold_start: String,
        /// Threads that serve HTTP and dispatch calls [default: a quarter of the CPUs,
        /// at least 1]. The functions' instances need the rest, and handing a request
        /// from one thread to another costs more than the proxying it would spread.
        #[arg(long, env = "SKIFF_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
        threads: Option<u16>,
        /// Memory that idle function templates may hold together (python3 functions
        /// with packages get a template that has imported them); past it the least
        /// recently used idle ones stop.
        #[arg(long, env = "SKIFF_TEMPLATE_MEMORY", default_value = "1G", value_parser = units::parse_size)]
        template_memory: u64,
    },
    /// Deploy a function directory (with skiff.yaml) to the daemon.
    Deploy {
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Invoke a function and print its response.
    Invoke {
        name: String,
        /// The request body, as in curl: DATA, @FILE for a file's bytes (as they are),
        /// @- for standard input.
        #[arg(
            short = 'd',
            long = "data",
            visible_alias = "data-binary",
            value_name = "DATA|@FILE"
        )]
        data: Option<String>,
        /// A request header K:V (repeatable).
        #[arg(short = 'H', long = "header")]
        headers: Vec<String>,
        /// Queue the invocation and print its id instead of waiting for the result.
        #[arg(long = "async")]
        is_async: bool,
        /// A session hint (from an earlier response's x-skiff-session header): the
        /// request goes to that session.
        #[arg(long, value_name = "HINT")]
        session: Option<String>,
    },
    /// Show an invocation's record: status, timings, cold start, logs, async result.
    Invocation { id: String },
    /// Print a function's log lines.
    Logs {
        name: String,
        /// Keep printing new lines as they are written.
        #[arg(short, long)]
        follow: bool,
        /// How many of the last lines to print first.
        #[arg(long, default_value_t = 100)]
        tail: usize,
        /// Only the lines of this invocation.
        #[arg(long, value_name = "ID")]
        invocation: Option<String>,
    },
    /// List deployed functions.
    Ls,
    /// Show a deployed function.
    Describe { name: String },
    /// Delete a deployed function.
    Rm { name: String },
    /// Check a function's skiff.yaml without building it.
    Validate {
        /// The function's directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Build a function's environment in the shared store.
    Build {
        /// The function's directory (with skiff.yaml).
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// List environments with their total, unique and shared bytes.
    Envs {
        /// Remove this environment (its files stay in the store until `skiff gc`).
        #[arg(long, value_name = "NAME")]
        rm: Option<String>,
    },
    /// Import an OCI image (layout directory, OCI archive, or `docker save` tarball) as an
    /// environment.
    Import {
        /// The image: a directory or a tar file.
        image: PathBuf,
        /// The environment's name (for `skiff run --env NAME`).
        #[arg(long)]
        name: String,
    },
    /// Re-hash every file in the store and report corruption.
    Fsck,
    /// The wasm host the daemon runs inside a sandbox for `runtime: wasm` functions;
    /// it speaks skiff's framed protocol on its stdin (not for direct use).
    Worker {
        /// The module compiled at deploy (`.cwasm`).
        #[arg(long)]
        module: PathBuf,
        /// Requests run at once, each in its own instance.
        #[arg(long, default_value_t = 10)]
        concurrency: u32,
        /// Linear memory per request, in bytes.
        #[arg(long, default_value_t = 64 << 20)]
        memory: u64,
        /// The worker's part in its session: `primary` holds the state, `secondary`
        /// reaches the primary's.
        #[arg(long, value_parser = ["primary", "secondary"])]
        session: Option<String>,
        /// The session's directory: checkpoint, log and the primary's state socket.
        #[arg(long, default_value = "/work")]
        state_dir: PathBuf,
        #[arg(long, default_value = "checkpoint", value_parser = ["checkpoint", "wal"])]
        durability: String,
        #[arg(long, default_value = "pessimistic", value_parser = ["pessimistic", "optimistic"])]
        locking: String,
    },
    /// Show the sandbox pools, or resize the cgroup pool.
    Pool {
        /// Number of pre-created cgroup slots.
        #[arg(long)]
        size: Option<usize>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and bare `skiff` (which shows the help).
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            // Usage errors as one line, like every other error of skiff's own.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let message = first.trim_start_matches("error: ");
            // clap's tip names the flag meant, e.g. --data-dir for the old global --data.
            let tip = text
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("tip: "))
                .map_or(String::new(), |tip| format!("; {tip}"));
            eprintln!("skiff: error: {message}{tip} (see `skiff help`)");
            return ExitCode::from(125);
        }
    };
    let data = cli.data_dir;
    let target = client::Target {
        socket: &cli.socket,
        host: cli.host.as_deref(),
    };
    let result = match cli.command {
        Command::Serve {
            listen,
            keep_records,
            cold_start,
            threads,
            template_memory,
        } => serve(skiff_daemon::Config {
            data: data.clone(),
            socket: cli.socket.clone(),
            listen,
            keep_records,
            templates: cold_start == "template",
            threads: threads.map_or_else(default_threads, usize::from),
            template_memory,
        })
        .map(|()| 0),
        Command::Deploy { dir } => remote::deploy(&target, &dir).map(|()| 0),
        Command::Invoke {
            name,
            data: body,
            mut headers,
            is_async,
            session,
        } => {
            headers.extend(session.map(|hint| format!("{}:{hint}", skiff_daemon::SESSION_HEADER)));
            remote::invoke(&target, &name, body.as_deref(), &headers, is_async).map(|()| 0)
        }
        Command::Invocation { id } => remote::invocation(&target, &id).map(|()| 0),
        Command::Logs {
            name,
            follow,
            tail,
            invocation,
        } => remote::logs(&target, &name, follow, tail, invocation.as_deref()).map(|()| 0),
        Command::Ls => remote::ls(&target).map(|()| 0),
        Command::Describe { name } => remote::describe(&target, &name).map(|()| 0),
        Command::Rm { name } => remote::rm(&target, &name).map(|()| 0),
        Command::Run(args) => run::run(&data, args),
        Command::Ps { json } => {
            admin::ps(&data, json, remote::instances(&target, &data)).map(|()| 0)
        }
        Command::Kill { signal, id } => admin::kill(&data, &id, &signal).map(|()| 0),
        Command::Gc { pools } => admin::gc(&data, pools).map(|()| 0),
        Command::Worker {
            module,
            concurrency,
            memory,
            session,
            state_dir,
            durability,
            locking,
        } => skiff_worker::run(skiff_worker::Options {
            module,
            concurrency,
            memory_bytes: memory,
            role: match session.as_deref() {
                Some("primary") => skiff_worker::Role::Primary,
                Some(_) => skiff_worker::Role::Secondary,
                None => skiff_worker::Role::None,
            },
            state_dir,
            durability: if durability == "wal" {
                skiff_session::Durability::Wal
            } else {
                skiff_session::Durability::Checkpoint
            },
            locking: if locking == "optimistic" {
                skiff_session::Locking::Optimistic
            } else {
                skiff_session::Locking::Pessimistic
            },
        })
        .map(|()| 0),
        Command::Pool { size } => admin::pool(&data, size).map(|()| 0),
        Command::Validate { dir } => envs::validate(&dir).map(|()| 0),
        Command::Build { dir } => envs::build(&data, &dir).map(|()| 0),
        Command::Envs { rm } => envs::list(&data, rm.as_deref()).map(|()| 0),
        Command::Fsck => envs::fsck(&data),
        Command::Import { image, name } => envs::import(&data, &image, &name).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(err) => {
            let code = err
                .downcast_ref::<run::Failure>()
                .map_or(125, |f| f.exit_code);
            // One line: the chain of causes joined, as users grep for it.
            eprintln!("skiff: error: {err:#}");
            ExitCode::from(code)
        }
    }
}

/// Forks the spawner while this process is still single-threaded, then starts the daemon.
fn serve(config: skiff_daemon::Config) -> anyhow::Result<()> {
    let spawner = skiff_sandbox::RemoteSpawner::start()?;
    skiff_daemon::serve(config, spawner)
}

/// `skiff serve`'s threads when not given: a quarter of the CPUs, at least one.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))
}

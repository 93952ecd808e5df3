//! The `capataz` executable.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use capataz::config::{self, LogFormat};
use capataz::handover::Inherited;
use capataz::sd_notify;
use capataz::workers::Runtimes;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

/// jemalloc, not the system allocator (glibc's): with many idle connections, the small
/// allocations that outlive a request (a backend socket's registration, the pooled connection)
/// sit in glibc's heap between the freed buffers of the requests and keep their pages resident;
/// jemalloc keeps each size class on pages of its own. Its background threads give pages unused
/// for a second back to the system, so resident memory falls after a burst even when nothing
/// allocates (BENCHMARKS.md, "jemalloc"). `_RJEM_MALLOC_CONF` in the environment overrides these
/// options. The `jemalloc` feature (on by default) brings it; without it (the README's quick
/// demo build), the system allocator.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Gives the calling thread's jemalloc cache back (`thread.tcache.flush`, in jemalloc's manual
/// for a thread that stops allocating): a worker's watcher calls it after connections of its
/// worker parked, so what they freed does not stay cached, pages and all, while the worker is
/// idle (`workers::set_cache_release`).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
fn flush_thread_cache() {
    // SAFETY: `thread.tcache.flush` takes and returns nothing; the name is a C string.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// A load balancer that keeps its pool honest with active and passive health checks.
#[derive(Parser, Debug)]
#[command(name = "capataz", version, about, subcommand_value_name = "COMMAND")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a self-contained demo: four loopback backends (steady, flaky, crashy, liar) behind a
    /// balancer on 127.0.0.1:8080, with every state change printed as it happens.
    Demo {
        /// Where the balancer listens.
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR", value_parser = config::parse_listen_address)]
        listen: SocketAddr,
        /// Where the admin API and live dashboard listen.
        #[arg(long, default_value = "127.0.0.1:9901", value_name = "ADDR", value_parser = config::parse_listen_address)]
        admin: SocketAddr,
        /// Requests per second the built-in client sends so passive checks have traffic to
        /// judge (0 for none).
        #[arg(long, default_value = "5", value_name = "N")]
        rate: u32,
        /// Stop after this many seconds (default: run until Ctrl-C).
        #[arg(long, value_name = "SECONDS")]
        duration: Option<u64>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: Format,
        /// Also listen with TLS (default 127.0.0.1:8443), with a self-signed certificate for
        /// localhost generated at start.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:8443", value_parser = config::parse_listen_address)]
        tls: Option<SocketAddr>,
    },
    /// Run the balancer.
    ///
    /// `capataz run FILE` and `capataz run --config FILE` are the same. SIGTERM or SIGINT
    /// drains and exits 0, SIGHUP reloads the file, SIGUSR2 upgrades the binary.
    Run {
        #[command(flatten)]
        file: ConfigFile,
        /// Log format (overrides the config's `log.format`).
        #[arg(long, value_enum)]
        log_format: Option<Format>,
    },
    /// Show every pool and backend: state, weights, last probe, and why (from the admin API).
    Status {
        /// The admin API's address.
        #[arg(long, default_value = "127.0.0.1:9901", value_name = "ADDR", value_parser = config::parse_listen_address)]
        admin: SocketAddr,
        /// Bearer token, if the admin API needs one (or CAPATAZ_ADMIN_TOKEN).
        #[arg(long, env = "CAPATAZ_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the admin API's JSON (`GET /status`) instead of the tables.
        #[arg(long)]
        json: bool,
    },
    /// A live terminal view of pools, backends and recent events (from the admin API); q or
    /// Ctrl-C quits. Not on a terminal, it prints one frame after another.
    Top {
        /// The admin API's address.
        #[arg(long, default_value = "127.0.0.1:9901", value_name = "ADDR", value_parser = config::parse_listen_address)]
        admin: SocketAddr,
        /// Bearer token, if the admin API needs one (or CAPATAZ_ADMIN_TOKEN).
        #[arg(long, env = "CAPATAZ_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Seconds between frames (at least 0.1).
        #[arg(long, default_value = "2", value_name = "SECONDS", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after this many frames (default: until q or Ctrl-C).
        #[arg(long, value_name = "N")]
        iterations: Option<u64>,
        /// How many of the most recent events to show.
        #[arg(long, default_value = "10", value_name = "N")]
        events: usize,
    },
    /// Act on a running balancer through its admin API: drain, force down or up, clear, reload.
    Ctl {
        #[command(subcommand)]
        action: CtlAction,
        /// The admin API's address.
        #[arg(
            long,
            global = true,
            default_value = "127.0.0.1:9901",
            value_name = "ADDR",
            value_parser = config::parse_listen_address
        )]
        admin: SocketAddr,
        /// Bearer token, if the admin API needs one (or CAPATAZ_ADMIN_TOKEN).
        #[arg(
            long,
            global = true,
            env = "CAPATAZ_ADMIN_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
        /// Print the admin API's JSON answer instead of a sentence.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Validate a configuration and warn about known foot-guns.
    ///
    /// `capataz check FILE` and `capataz check --config FILE` are the same. Exit status: 0
    /// valid (with or without warnings), 1 valid with warnings under --strict, 2 invalid or
    /// unreadable.
    Check {
        #[command(flatten)]
        file: ConfigFile,
        /// Exit 1 when the file is valid but has warnings (by default warnings are printed
        /// and the exit status is 0).
        #[arg(long)]
        strict: bool,
    },
    /// Drive the health engine with the replay line protocol (from FILE, or stdin).
    ///
    /// Commands: POOL <b1> <b2> ... | PROBE <b> <answer> | OBSERVE <b> <answer> | STATUS |
    /// HEALTHY | WAIT <ms> | OVERRIDE ... | ELIGIBLE | AGENT <b> <line> | AT <ms> |
    /// TRAFFIC <b> <ms|-> <answer> | SHED <b> <ms|-> <status> <ms>.
    /// An answer is TIMEOUT, REFUSED, RESET, TLS, GRPC <code> or a status line as received.
    Replay {
        /// The script to run; standard input when absent.
        file: Option<PathBuf>,
        /// Take the engine's settings from a pool of this config file (its passive checks,
        /// detectors and load shedding), as the balancer would run it.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The pool of --config (or of --set's defaults) to take; needed when there are several.
        #[arg(long, value_name = "NAME")]
        pool: Option<String>,
        /// Write KEY=VALUE into the pool's table first (e.g.
        /// passive.latency_outliers.factor=5); without --config, into a pool with every
        /// default. Repeatable.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Consecutive passing probes that bring a DOWN backend back UP [default: 2].
        #[arg(long, value_name = "N")]
        rise: Option<NonZeroU32>,
        /// Consecutive failed probes that take an UP backend DOWN [default: 3].
        #[arg(long, value_name = "N")]
        fall: Option<NonZeroU32>,
        /// Consecutive traffic errors that eject a backend [default: 3].
        #[arg(long, value_name = "N")]
        consecutive_errors: Option<NonZeroU32>,
        /// Also write each verdict change, with its reason, to standard error.
        #[arg(long)]
        explain: bool,
    },
    /// Print a shell completion script for capataz to standard output.
    ///
    /// For example `capataz completions bash > /usr/share/bash-completion/completions/capataz`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print capataz's manual page, capataz(1), in roff, to standard output.
    ///
    /// For example `capataz man > /usr/local/share/man/man1/capataz.1`.
    Man,
}

/// What `capataz ctl` does.
#[derive(Subcommand, Debug)]
enum CtlAction {
    /// No new requests to the backend; in-flight ones finish.
    Drain {
        #[command(flatten)]
        target: Target,
    },
    /// Take the backend out whatever its health says.
    Down {
        #[command(flatten)]
        target: Target,
    },
    /// Put the backend in whatever its health says.
    Up {
        #[command(flatten)]
        target: Target,
    },
    /// Take the backend out and stop probing it; on leaving (clear), it must pass its probes
    /// (`rise_after_maintenance`, default `rise`) before traffic.
    Maintenance {
        #[command(flatten)]
        target: Target,
    },
    /// Remove a manual override: health checks decide again.
    Clear {
        #[command(flatten)]
        target: Target,
    },
    /// Re-read the configuration file and apply it (like SIGHUP).
    Reload,
}

/// The backend a `ctl` action is for.
#[derive(clap::Args, Debug)]
struct Target {
    /// The pool.
    pool: String,
    /// The backend.
    backend: String,
    /// The override lapses after this long (e.g. 30s, 10m).
    #[arg(long)]
    ttl: Option<String>,
}

/// The configuration file of `run` and `check`, as an argument or as `--config`: `capataz run
/// FILE` and `capataz run --config FILE` alike.
#[derive(clap::Args, Debug)]
struct ConfigFile {
    /// The configuration file (TOML; see docs/config.md).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// The configuration file, given as an option instead of FILE.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl ConfigFile {
    /// The file, given once in either form (or twice naming the same file); otherwise the usage
    /// error of `subcommand`.
    fn path(self, subcommand: &str) -> Result<PathBuf, clap::Error> {
        let usage = |kind, message: String| {
            let mut cli = Cli::command();
            cli.build();
            match cli.find_subcommand_mut(subcommand) {
                Some(command) => command.error(kind, message),
                None => cli.error(kind, message),
            }
        };
        match (self.file, self.config) {
            (Some(file), None) | (None, Some(file)) => Ok(file),
            (Some(file), Some(config)) if same_file(&file, &config) => Ok(file),
            (Some(file), Some(config)) => Err(usage(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "two configuration files, {} and --config {}: give one (FILE or --config FILE)",
                    file.display(),
                    config.display()
                ),
            )),
            (None, None) => Err(usage(
                clap::error::ErrorKind::MissingRequiredArgument,
                format!("no configuration file: capataz {subcommand} FILE (or --config FILE)"),
            )),
        }
    }
}

/// Whether two paths name one file: the same text, or the same file once resolved.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// `--interval` of `capataz top`: seconds, at least 0.1 and at most an hour.
fn parse_interval(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.1..=3600.0).contains(&seconds) => Ok(Duration::from_secs_f64(seconds)),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0.1 to 3600 (e.g. 2 or 0.5)"
        )),
    }
}

/// The signals `capataz run` answers, installed before the balancer starts: a SIGHUP, SIGUSR2
/// or SIGTERM sent as soon as "listening" is logged must find its handler, not the default
/// action (which ends the process). `None` where they cannot be installed (then Ctrl-C only).
struct Signals {
    #[cfg(unix)]
    handlers: Option<UnixSignals>,
}

#[cfg(unix)]
struct UnixSignals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

/// What a signal asks of `capataz run`.
enum Asked {
    /// SIGTERM or SIGINT: drain and exit.
    Stop,
    /// SIGHUP: reload the configuration file.
    Reload,
    /// SIGUSR2: hand over to a new process of the binary (a zero-downtime upgrade).
    Upgrade,
}

/// How `capataz run` came to stop serving.
enum Stopped {
    /// Asked to stop.
    Asked,
    /// A new process (this pid) took over.
    Upgraded(u32),
}

/// How this process was started, for an upgrade to start the binary at the same path the
/// same way. Read at the start: once the file is replaced, `/proc/self/exe` names the old,
/// deleted one.
struct Invocation {
    exe: Option<PathBuf>,
    args: Vec<OsString>,
}

impl Signals {
    /// Installs the handlers; call it on the runtime, before anything is logged as listening.
    fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let handlers = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
                signal(SignalKind::user_defined2()),
            ) {
                (Ok(term), Ok(hup), Ok(usr2)) => Some(UnixSignals { term, hup, usr2 }),
                _ => None,
            };
            Signals { handlers }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next signal that asks something.
    async fn next(&mut self) -> Asked {
        #[cfg(unix)]
        if let Some(handlers) = &mut self.handlers {
            return tokio::select! {
                _ = tokio::signal::ctrl_c() => Asked::Stop,
                _ = handlers.term.recv() => Asked::Stop,
                _ = handlers.hup.recv() => Asked::Reload,
                _ = handlers.usr2.recv() => Asked::Upgrade,
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        Asked::Stop
    }

    /// Runs until SIGTERM or Ctrl-C, or until a new process took over after SIGUSR2; SIGHUP
    /// reloads the configuration file meanwhile.
    async fn serve_until_stopped(
        mut self,
        balancer: &capataz::server::Balancer,
        invocation: &Invocation,
    ) -> Stopped {
        type Handing = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<u32, capataz::upgrade::UpgradeError>>>,
        >;
        let mut handing: Option<(Handing, tokio::sync::oneshot::Sender<()>)> = None;
        loop {
            let handover = async {
                match handing.as_mut() {
                    Some((future, _)) => future.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                asked = self.next() => match asked {
                    Asked::Stop => {
                        if let Some((future, cancel)) = handing.take() {
                            tracing::info!("stopping: the upgrade in progress is abandoned");
                            let _ = cancel.send(());
                            let _ = future.await;
                        }
                        return Stopped::Asked;
                    }
                    Asked::Reload => {
                        tracing::info!("SIGHUP: reloading the configuration");
                        notify("RELOADING=1");
                        // On a task of its own: a reload that takes long (a slow resolver, a
                        // file that never finishes arriving) must not keep this loop from
                        // seeing SIGTERM.
                        let supervisor = balancer.supervisor().clone();
                        tokio::spawn(async move {
                            if let Err(e) = supervisor.reload_from_file().await {
                                tracing::error!(
                                    "reload refused, the running configuration stays: {e}"
                                );
                            }
                            notify("READY=1");
                        });
                    }
                    Asked::Upgrade if handing.is_some() => {
                        tracing::warn!("SIGUSR2: an upgrade is already in progress; ignored");
                    }
                    Asked::Upgrade => {
                        let Some(exe) = &invocation.exe else {
                            tracing::error!("SIGUSR2: upgrade refused: the path of the running binary is unknown; this process keeps serving");
                            continue;
                        };
                        tracing::info!(binary = %exe.display(), "SIGUSR2: starting a new process to take over");
                        match capataz::upgrade::start(balancer, exe, &invocation.args) {
                            Ok(started) => {
                                let within = capataz::upgrade::ready_within(&balancer.supervisor().config());
                                tracing::info!(pid = started.pid(), "upgrade: the new process started; it probes its backends before it accepts (waiting up to {})", capataz_health::pool::human_duration(within));
                                let (cancel, cancelled) = tokio::sync::oneshot::channel();
                                handing = Some((Box::pin(started.ready(within, cancelled)), cancel));
                            }
                            Err(e) => tracing::error!("upgrade failed, this process keeps serving: {e}"),
                        }
                    }
                },
                handed = handover => {
                    handing = None;
                    match handed {
                        Ok(pid) => {
                            // systemd follows the service to its new main process.
                            notify(&format!("MAINPID={pid}"));
                            return Stopped::Upgraded(pid);
                        }
                        Err(e) => tracing::error!("upgrade failed, this process keeps serving: {e}"),
                    }
                }
            }
        }
    }
}

/// Tells systemd `state` (see `capataz::sd_notify`); a failure is logged, never fatal.
fn notify(state: &str) {
    if let Err(error) = sd_notify::notify(state) {
        tracing::warn!(%error, state, "cannot notify systemd (NOTIFY_SOCKET)");
    }
}

/// A log format on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<Format> for LogFormat {
    fn from(format: Format) -> LogFormat {
        match format {
            Format::Text => LogFormat::Text,
            Format::Json => LogFormat::Json,
        }
    }
}

fn init_logging(format: LogFormat, level: &str) {
    capataz::logging::init(format, level);
}

/// The runtimes of a command that serves (`run`, `demo`): `CAPATAZ_WORKER_THREADS` workers
/// (default one per core), each a thread with a current-thread runtime of its own, the main
/// thread's first; 1 is the main thread's runtime alone, the cheapest per request. As many
/// workers as CPUs are pinned one to each unless `CAPATAZ_WORKER_PINNING=off`
/// (`capataz::workers`).
fn runtimes() -> anyhow::Result<Runtimes> {
    let count = Runtimes::count_from(std::env::var("CAPATAZ_WORKER_THREADS").ok().as_deref());
    let pinning = Runtimes::pinning_from(std::env::var("CAPATAZ_WORKER_PINNING").ok().as_deref());
    Runtimes::start(count, pinning).context("cannot start the async runtime")
}

/// The runtime of a command that asks a running balancer (`status`, `top`, `ctl`): the main
/// thread's alone, which is plenty for one client.
fn client_runtime() -> anyhow::Result<Runtimes> {
    Runtimes::start(1, false).context("cannot start the async runtime")
}

/// Prints a command-line usage error as clap does, and gives exit status 2, as clap does for
/// its own.
fn usage_error(error: &clap::Error) -> anyhow::Result<ExitCode> {
    error.print().context("cannot write to standard error")?;
    Ok(ExitCode::from(2))
}

/// Writes `text` to standard output. A reader that went away (`capataz status | head -1`) is a
/// normal way to stop, not a panic as with `print!`.
fn stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to standard output")
        }
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    capataz::workers::set_cache_release(flush_thread_cache);
    // Before any thread starts: this reads and removes the handover variables of an upgrade.
    let inherited = Inherited::from_env();
    let invocation = Invocation {
        exe: std::env::current_exe().ok(),
        args: std::env::args_os().skip(1).collect(),
    };
    let cli = Cli::parse();
    match run(cli, inherited, &invocation) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("capataz: {error:#}");
            ExitCode::from(1)
        }
    }
}

/// The subcommand's function, by the command line.
fn run(
    cli: Cli,
    inherited: Result<Option<Inherited>, capataz::handover::HandoverError>,
    invocation: &Invocation,
) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo {
            listen,
            admin,
            rate,
            duration,
            log_format,
            tls,
        } => demo(
            capataz::demo::DemoOptions {
                listen,
                admin,
                rate,
                duration: duration.map(Duration::from_secs),
                tls,
                workers: Default::default(),
            },
            log_format,
        ),
        Command::Run { file, log_format } => serve(file, log_format, inherited, invocation),
        Command::Status { admin, token, json } => status(admin, token.as_deref(), json),
        Command::Top {
            admin,
            token,
            interval,
            iterations,
            events,
        } => top(capataz::ctl::top::TopOptions {
            admin,
            token,
            interval,
            iterations,
            events,
        }),
        Command::Ctl {
            action,
            admin,
            token,
            json,
        } => ctl(&action, admin, token.as_deref(), json),
        Command::Check { file, strict } => check(file, strict),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "capataz", &mut script);
            stdout(&String::from_utf8_lossy(&script))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let page =
                capataz::manual::render(Cli::command()).context("cannot render the manual page")?;
            stdout(&page)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay {
            file,
            config,
            pool,
            sets,
            rise,
            fall,
            consecutive_errors,
            explain,
        } => replay(
            ReplayArgs {
                config,
                pool,
                sets,
                rise,
                fall,
                consecutive_errors,
            },
            file.as_deref(),
            explain,
        ),
    }
}

/// `capataz demo`.
fn demo(options: capataz::demo::DemoOptions, log_format: Format) -> anyhow::Result<ExitCode> {
    init_logging(log_format.into(), "info");
    let runtimes = runtimes()?;
    let options = capataz::demo::DemoOptions {
        workers: runtimes.workers(),
        ..options
    };
    runtimes.block_on(capataz::demo::run(options))?;
    Ok(ExitCode::SUCCESS)
}

/// `capataz run`: load the file, take over from an upgrading process if there is one, serve
/// until asked to stop or upgraded, then drain.
fn serve(
    file: ConfigFile,
    log_format: Option<Format>,
    inherited: Result<Option<Inherited>, capataz::handover::HandoverError>,
    invocation: &Invocation,
) -> anyhow::Result<ExitCode> {
    let path = match file.path("run") {
        Ok(path) => path,
        Err(usage) => return usage_error(&usage),
    };
    let config = match config::load_all_errors(&path) {
        Ok(config) => config,
        Err(errors) => {
            for error in errors.iter() {
                eprintln!("capataz: invalid configuration: {error}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    init_logging(
        log_format.map_or(config.log.format, LogFormat::from),
        &config.log.level,
    );
    // Only `run` takes sockets over; for any other command they are closed here.
    let mut inherited = inherited.context("cannot take over from the upgrading process")?;
    let runtimes = runtimes()?;
    let workers = runtimes.workers();
    let served = runtimes.block_on(async {
        let mut signals = Signals::install();
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let mut balancer = capataz::server::Balancer::start_taking_over(
            &config,
            events,
            Some(path),
            (inherited.as_mut(), workers),
        )
        .await?;
        match inherited {
            Some(inherited) => take_over(&mut balancer, inherited, &config, &mut signals).await?,
            None => notify("READY=1"),
        }
        let stopped = signals.serve_until_stopped(&balancer, invocation).await;
        let deadline = balancer.supervisor().config().server.shutdown_timeout;
        match stopped {
            Stopped::Asked => {
                notify("STOPPING=1");
                tracing::info!(
                    "stopping: no new connections; finishing requests in flight (up to {})",
                    capataz_health::pool::human_duration(deadline)
                );
            }
            Stopped::Upgraded(pid) => tracing::info!(
                pid,
                "upgraded: the new process serves; this one stops accepting and finishes requests in flight (up to {})",
                capataz_health::pool::human_duration(deadline)
            ),
        }
        balancer.shutdown(deadline).await;
        anyhow::Ok(())
    });
    // Dropping a runtime would wait for every blocking task, and a reload may still be
    // reading a file that never finishes arriving: give them a moment, then exit.
    runtimes.shutdown(Duration::from_secs(1));
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The new process of an upgrade: probe every backend before accepting (up to the configured
/// bound), then open the listeners, close the inherited sockets no longer listened on, and tell
/// the old process (and systemd) that this one serves. A stop or a bound passed first is an
/// error: the old process keeps serving.
async fn take_over(
    balancer: &mut capataz::server::Balancer,
    inherited: Inherited,
    config: &config::Config,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    let within = capataz::upgrade::decide_within(config);
    tracing::info!(
        "taking over from the upgrading process: probing every backend before accepting (up to {})",
        capataz_health::pool::human_duration(within)
    );
    let decided = capataz::upgrade::wait_decided(balancer, within);
    let mut decided = Box::pin(decided);
    loop {
        tokio::select! {
            decided = &mut decided => match decided {
                Ok(()) => break,
                Err(waiting) => anyhow::bail!(
                    "not ready within {}: still waiting for the first probe of {}; the old process keeps serving",
                    capataz_health::pool::human_duration(within),
                    waiting.join(", ")
                ),
            },
            asked = signals.next() => {
                if matches!(asked, Asked::Stop) {
                    anyhow::bail!("stopped before the takeover; the old process keeps serving");
                }
                // A reload or an upgrade is for a process that serves.
                tracing::warn!("signal ignored while taking over");
            }
        }
    }
    drop(decided);
    balancer.open().await;
    for address in inherited.untaken() {
        tracing::info!(%address, "closing an inherited socket the configuration no longer listens on");
    }
    for path in inherited.untaken_unix() {
        let path = path.display();
        tracing::info!(%path, "closing an inherited Unix socket the configuration no longer listens on, and removing its file");
    }
    if let Err(error) = inherited.ready() {
        tracing::warn!(%error, "cannot tell the old process that this one serves; it will stop when it sees this process is not ready");
    }
    notify(&format!("MAINPID={}\nREADY=1", std::process::id()));
    tracing::info!("took over from the old process: accepting connections");
    Ok(())
}

/// `capataz status`.
fn status(admin: SocketAddr, token: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let status = client_runtime()?.block_on(capataz::ctl::request(
        admin,
        http::Method::GET,
        "/status",
        token,
    ))?;
    if json {
        stdout(&capataz::ctl::pretty(&status))?;
    } else {
        stdout(&capataz::ctl::render_status(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `capataz top`.
fn top(options: capataz::ctl::top::TopOptions) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout();
    client_runtime()?.block_on(capataz::ctl::top::run(options, &mut out))?;
    Ok(ExitCode::SUCCESS)
}

/// `capataz ctl`.
fn ctl(
    action: &CtlAction,
    admin: SocketAddr,
    token: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let path = match action {
        CtlAction::Reload => "/reload".to_string(),
        CtlAction::Drain { target }
        | CtlAction::Down { target }
        | CtlAction::Up { target }
        | CtlAction::Maintenance { target }
        | CtlAction::Clear { target } => {
            let verb = match action {
                CtlAction::Drain { .. } => "drain",
                CtlAction::Down { .. } => "down",
                CtlAction::Up { .. } => "up",
                CtlAction::Maintenance { .. } => "maintenance",
                _ => "clear",
            };
            capataz::ctl::override_path(&target.pool, &target.backend, verb, target.ttl.as_deref())
        }
    };
    let answer = client_runtime()?.block_on(capataz::ctl::request(
        admin,
        http::Method::POST,
        &path,
        token,
    ))?;
    let text = if json {
        capataz::ctl::pretty(&answer)
    } else if let CtlAction::Reload = action {
        capataz::ctl::render_reload(&answer)
    } else {
        capataz::ctl::render_override(&answer)
    };
    stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// `capataz check`: 2 for an invalid file, 1 for warnings under `--strict`, else 0.
fn check(file: ConfigFile, strict: bool) -> anyhow::Result<ExitCode> {
    let file = match file.path("check") {
        Ok(path) => path,
        Err(usage) => return usage_error(&usage),
    };
    let config = match config::load_all_errors(&file) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            if errors.len() > 1 {
                eprintln!("{}: {} errors", file.display(), errors.len());
            }
            return Ok(ExitCode::from(2));
        }
    };
    let warnings = config::check(&config);
    let mut text = String::new();
    for warning in &warnings {
        text.push_str(&format!("warning: {warning}\n"));
    }
    let backends: usize = config.pools.iter().map(|p| p.backends.len()).sum();
    text.push_str(&format!(
        "{}: valid ({} listeners, {} pools, {} backends, {} warnings)\n",
        file.display(),
        config.listeners.len(),
        config.pools.len(),
        backends,
        warnings.len()
    ));
    stdout(&text)?;
    Ok(ExitCode::from(if strict && !warnings.is_empty() {
        1
    } else {
        0
    }))
}

/// What `capataz replay` takes to pick a pool's settings.
struct ReplayArgs {
    config: Option<PathBuf>,
    pool: Option<String>,
    sets: Vec<String>,
    rise: Option<NonZeroU32>,
    fall: Option<NonZeroU32>,
    consecutive_errors: Option<NonZeroU32>,
}

/// `capataz replay`: the settings from a config's pool (with `--set` edits) or the defaults,
/// then the script from FILE or standard input.
fn replay(
    args: ReplayArgs,
    file: Option<&std::path::Path>,
    explain: bool,
) -> anyhow::Result<ExitCode> {
    let (mut settings, options) =
        if args.config.is_some() || args.pool.is_some() || !args.sets.is_empty() {
            let text = match &args.config {
                Some(path) => Some((
                    std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?,
                    path.display().to_string(),
                )),
                None => None,
            };
            let text = text.as_ref().map(|(t, s)| (t.as_str(), s.as_str()));
            match capataz::replay::pool_settings(text, args.pool.as_deref(), &args.sets) {
                Ok(found) => found,
                Err(message) => {
                    eprintln!("capataz replay: {message}");
                    return Ok(ExitCode::from(2));
                }
            }
        } else {
            Default::default()
        };
    settings.rise = args.rise.unwrap_or(settings.rise);
    settings.fall = args.fall.unwrap_or(settings.fall);
    settings.consecutive_errors = args
        .consecutive_errors
        .unwrap_or(settings.consecutive_errors);
    let stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let explain: Option<&mut dyn std::io::Write> = if explain { Some(&mut stderr) } else { None };
    let result = match file {
        Some(path) => {
            let input = std::fs::File::open(path)
                .with_context(|| format!("cannot open replay script {}", path.display()))?;
            capataz::replay::run_with(settings, options, input, stdout, explain)
        }
        None => {
            capataz::replay::run_with(settings, options, std::io::stdin().lock(), stdout, explain)
        }
    };
    match result {
        Ok(_) => Ok(ExitCode::SUCCESS),
        // A closed pipe downstream (`capataz replay | head`) is a normal way to stop.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("replay failed"),
    }
}

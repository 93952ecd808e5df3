//! The `capataz` executable.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use capataz::config::{self, LogFormat};
use clap::{Parser, Subcommand, ValueEnum};

/// A load balancer that keeps its pool honest with active and passive health checks.
#[derive(Parser, Debug)]
#[command(name = "capataz", version, about)]
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
    Run {
        /// The configuration file (TOML; see docs/config.md).
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
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
    /// Exit status: 0 fine, 1 valid with warnings, 2 invalid.
    Check {
        /// The configuration file.
        file: PathBuf,
    },
    /// Drive the health engine with the replay line protocol (from FILE, or stdin).
    ///
    /// Commands: POOL <b1> <b2> ... | PROBE <b> <answer> | OBSERVE <b> <answer> | STATUS | HEALTHY.
    /// An answer is TIMEOUT, REFUSED, RESET, TLS, GRPC <code> or a status line as received.
    Replay {
        /// The script to run; standard input when absent.
        file: Option<PathBuf>,
        /// Consecutive passing probes that bring a DOWN backend back UP.
        #[arg(long, default_value = "2", value_name = "N")]
        rise: NonZeroU32,
        /// Consecutive failed probes that take an UP backend DOWN.
        #[arg(long, default_value = "3", value_name = "N")]
        fall: NonZeroU32,
        /// Consecutive traffic errors that eject a backend.
        #[arg(long, default_value = "3", value_name = "N")]
        consecutive_errors: NonZeroU32,
        /// Also write each verdict change, with its reason, to standard error.
        #[arg(long)]
        explain: bool,
    },
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

/// `--interval` of `capataz top`: seconds, at least 0.1 and at most an hour.
fn parse_interval(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.1..=3600.0).contains(&seconds) => Ok(Duration::from_secs_f64(seconds)),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0.1 to 3600 (e.g. 2 or 0.5)"
        )),
    }
}

/// The signals `capataz run` answers, installed before the balancer starts: a SIGHUP or
/// SIGTERM sent as soon as "listening" is logged must find its handler, not the default action
/// (which ends the process). `None` where they cannot be installed (then Ctrl-C only).
struct Signals {
    #[cfg(unix)]
    handlers: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
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
            ) {
                (Ok(term), Ok(hup)) => Some((term, hup)),
                _ => None,
            };
            Signals { handlers }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Runs until SIGTERM or Ctrl-C; SIGHUP reloads the configuration file meanwhile.
    async fn serve_until_stopped(self, balancer: &capataz::server::Balancer) {
        #[cfg(unix)]
        if let Some((mut term, mut hup)) = self.handlers {
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => return,
                    _ = term.recv() => return,
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the configuration");
                        // On a task of its own: a reload that takes long (a slow resolver, a
                        // file that never finishes arriving) must not keep this loop from
                        // seeing SIGTERM.
                        let shared = balancer.shared().clone();
                        tokio::spawn(async move {
                            if let Err(e) = shared.reload_from_file().await {
                                tracing::error!(
                                    "reload refused, the running configuration stays: {e}"
                                );
                            }
                        });
                    }
                }
            }
        }
        let _ = balancer;
        let _ = tokio::signal::ctrl_c().await;
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

/// The async runtime: one worker per core by default; `CAPATAZ_WORKER_THREADS=N` sets the
/// count, and 1 gives a single-threaded runtime (no work stealing, cheapest per request).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let threads = std::env::var("CAPATAZ_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0);
    let mut builder = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
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
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("capataz: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo {
            listen,
            admin,
            rate,
            duration,
            log_format,
            tls,
        } => {
            init_logging(log_format.into(), "info");
            let options = capataz::demo::DemoOptions {
                listen,
                admin,
                rate,
                duration: duration.map(Duration::from_secs),
                tls,
            };
            runtime()?.block_on(capataz::demo::run(options))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            config: path,
            log_format,
        } => {
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
            let runtime = runtime()?;
            let served = runtime.block_on(async {
                let signals = Signals::install();
                let (events, _) = tokio::sync::broadcast::channel(1024);
                let balancer =
                    capataz::server::Balancer::start_with_path(&config, events, Some(path)).await?;
                signals.serve_until_stopped(&balancer).await;
                let deadline = balancer.shared().config().server.shutdown_timeout;
                tracing::info!(
                    "stopping: no new connections; finishing requests in flight (up to {})",
                    capataz_health::pool::human_duration(deadline)
                );
                balancer.shutdown(deadline).await;
                anyhow::Ok(())
            });
            // Dropping the runtime would wait for every blocking task, and a reload may still
            // be reading a file that never finishes arriving: give them a moment, then exit.
            runtime.shutdown_timeout(Duration::from_secs(1));
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { admin, token, json } => {
            let status = runtime()?.block_on(capataz::ctl::request(
                admin,
                http::Method::GET,
                "/status",
                token.as_deref(),
            ))?;
            if json {
                stdout(&capataz::ctl::pretty(&status))?;
            } else {
                stdout(&capataz::ctl::render_status(&status))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Top {
            admin,
            token,
            interval,
            iterations,
            events,
        } => {
            let options = capataz::ctl::top::TopOptions {
                admin,
                token,
                interval,
                iterations,
                events,
            };
            let mut out = std::io::stdout();
            runtime()?.block_on(capataz::ctl::top::run(options, &mut out))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ctl {
            action,
            admin,
            token,
            json,
        } => {
            let path = match &action {
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
                    capataz::ctl::override_path(
                        &target.pool,
                        &target.backend,
                        verb,
                        target.ttl.as_deref(),
                    )
                }
            };
            let answer = runtime()?.block_on(capataz::ctl::request(
                admin,
                http::Method::POST,
                &path,
                token.as_deref(),
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
        Command::Check { file } => {
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
            Ok(ExitCode::from(if warnings.is_empty() { 0 } else { 1 }))
        }
        Command::Replay {
            file,
            rise,
            fall,
            consecutive_errors,
            explain,
        } => {
            let settings = capataz_health::Settings {
                rise,
                fall,
                consecutive_errors,
                ..Default::default()
            };
            let stdout = std::io::stdout().lock();
            let mut stderr = std::io::stderr().lock();
            let explain: Option<&mut dyn std::io::Write> =
                if explain { Some(&mut stderr) } else { None };
            let result = match &file {
                Some(path) => {
                    let input = std::fs::File::open(path)
                        .with_context(|| format!("cannot open replay script {}", path.display()))?;
                    capataz::replay::run(settings, input, stdout, explain)
                }
                None => capataz::replay::run(settings, std::io::stdin().lock(), stdout, explain),
            };
            match result {
                Ok(_) => Ok(ExitCode::SUCCESS),
                // A closed pipe downstream (`capataz replay | head`) is a normal way to stop.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
                Err(e) => Err(e).context("replay failed"),
            }
        }
    }
}

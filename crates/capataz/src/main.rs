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
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
        listen: SocketAddr,
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
    /// An answer is TIMEOUT, REFUSED, RESET or a status line as received.
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

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
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
            rate,
            duration,
            log_format,
        } => {
            init_logging(log_format.into(), "info");
            let options = capataz::demo::DemoOptions {
                listen,
                rate,
                duration: duration.map(Duration::from_secs),
            };
            runtime()?.block_on(capataz::demo::run(options))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { config, log_format } => {
            let config = match config::load(&config) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("capataz: invalid configuration: {error}");
                    return Ok(ExitCode::from(2));
                }
            };
            init_logging(
                log_format.map_or(config.log.format, LogFormat::from),
                &config.log.level,
            );
            runtime()?.block_on(async {
                let (events, _) = tokio::sync::broadcast::channel(1024);
                let balancer = capataz::server::Balancer::start(&config, events).await?;
                wait_for_stop().await;
                tracing::info!("stopping: no new connections; finishing requests in flight");
                balancer.shutdown(Duration::from_secs(10)).await;
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { file } => {
            let config = match config::load(&file) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("{error}");
                    return Ok(ExitCode::from(2));
                }
            };
            let warnings = config::check(&config);
            for warning in &warnings {
                println!("warning: {warning}");
            }
            let backends: usize = config.pools.iter().map(|p| p.backends.len()).sum();
            println!(
                "{}: valid ({} listeners, {} pools, {} backends, {} warnings)",
                file.display(),
                config.listeners.len(),
                config.pools.len(),
                backends,
                warnings.len()
            );
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

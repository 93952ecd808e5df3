//! The `capataz` executable.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// A load balancer that keeps its pool honest with active and passive health checks.
#[derive(Parser, Debug)]
#[command(name = "capataz", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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

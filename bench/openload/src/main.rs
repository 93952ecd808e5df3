//! `openload`: an open-loop HTTP/1.1 load generator for the benchmarks (`bench/overload.sh`).
//!
//! A closed-loop generator (wrk, h2load) sends a connection's next request only when the last
//! one is answered, so a proxy that stalls also slows the load, and its tail hides in requests
//! never sent ("coordinated omission"). Here the load is a schedule: `-c` keep-alive
//! connections, each sending one `GET` every `c / rate` seconds (connection `i`'s schedule
//! offset by `i / rate`), whatever the answers do. A request whose connection is still busy
//! when it is due is sent as soon as the connection is free, and its latency counts from when
//! it was due (the wait is the proxy's doing); one whose connection was free counts from when
//! it was sent (so the loop's own lateness, up to a millisecond, is not counted). That is
//! wrk2's correction; wrk2 itself is not packaged in Debian.
//!
//! One thread, one `epoll` loop over every connection (`load.rs`), no async runtime: the
//! requests due go out together on a millisecond grid, each costing two system calls (its
//! write and its read) and no task, timer or allocation of its own. Nearly all of its CPU per
//! request is then the kernel's loopback TCP work in those calls, as for wrk (bench/README.md,
//! "overload.sh and openload"). It prints what `bench/overload.sh`
//! parses: requests due, answered, failed and answered with a status other than 2xx; the
//! offered and achieved rate; latency percentiles in microseconds of the requests due after
//! the warm-up; its own CPU time, and per request (warm-up included).

mod args;
mod connection;
mod load;
mod poll;

use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use args::Args;

/// What the run brings back.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    /// Requests done (answered or failed), warm-up included.
    all: u64,
    due: u64,
    failed: u64,
    not_2xx: u64,
    first_error: Option<String>,
    /// When the last answer of a measured request came.
    last_answer: Option<Instant>,
    /// The measured requests slower than `-s`: connection, when due, latency in microseconds.
    slow: Vec<(usize, Instant, u32)>,
}

/// At most this many slow requests are kept for printing.
const SLOW_KEPT: usize = 10_000;

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("openload: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let (tally, measured) = run(&args);
    report(&args, tally, measured)
}

/// Runs the schedule; gives what came back and when the measured part began.
fn run(args: &Args) -> (Tally, Instant) {
    let failed = |e: String| {
        let tally = Tally {
            failed: 1,
            first_error: Some(e),
            ..Tally::default()
        };
        (tally, Instant::now())
    };
    // Every connection is opened before the schedule starts.
    let mut streams = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        match TcpStream::connect(args.addr) {
            Ok(stream) => streams.push(stream),
            Err(e) => return failed(format!("connect to {}: {e}", args.addr)),
        }
    }
    let start = Instant::now() + Duration::from_millis(50);
    match load::run(args, streams, start) {
        Ok(tally) => (tally, start + args.warmup),
        Err(e) => failed(format!("epoll: {e}")),
    }
}

/// The user and system CPU time this process used so far, in microseconds.
fn cpu_us() -> (u64, u64) {
    // SAFETY: an all-zero rusage is a valid value; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid and writable for the call's duration.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
}

/// CLOCK_MONOTONIC now, in seconds.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The nearest-rank percentile, `per_mille` thousandths (990: p99).
fn percentile(sorted: &[u32], per_mille: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (per_mille * sorted.len()).div_ceil(1000);
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Prints the figures; `measured`: when the measured part began. The achieved rate is the
/// answers over the time from then to the last answer (late answers stretch it).
fn report(args: &Args, mut tally: Tally, measured: Instant) -> ExitCode {
    let (user_us, system_us) = cpu_us();
    tally.latencies_us.sort_unstable();
    let answered = tally.latencies_us.len() as u64;
    let seconds = tally
        .last_answer
        .map_or(0.0, |last| last.duration_since(measured).as_secs_f64())
        .max(args.duration.as_secs_f64());
    println!(
        "requests: {} due, {answered} answered, {} failed, {} not 2xx",
        tally.due, tally.failed, tally.not_2xx
    );
    println!(
        "rate: offered {} achieved {:.0}",
        args.rate,
        answered as f64 / seconds
    );
    let l = &tally.latencies_us;
    println!(
        "latency_us: p50 {} p90 {} p99 {} p99.9 {} max {}",
        percentile(l, 500),
        percentile(l, 900),
        percentile(l, 990),
        percentile(l, 999),
        l.last().copied().unwrap_or(0)
    );
    // Its own cost: whether the load generator's core, not the server, set the pace.
    println!(
        "cpu_us: user {user_us} system {system_us} per_request {:.2}",
        (user_us + system_us) as f64 / tally.all.max(1) as f64
    );
    if !tally.slow.is_empty() {
        // CLOCK_MONOTONIC, which std's Instant reads on Linux, as seconds: the clock perf can
        // stamp its events with, so a slow request can be found in a trace.
        let (now, mono) = (Instant::now(), monotonic());
        tally.slow.sort_unstable_by_key(|&(_, due, _)| due);
        for (connection, due, us) in &tally.slow {
            let at = mono - now.duration_since(*due).as_secs_f64();
            println!("slow: connection {connection} due {at:.6} latency_us {us}");
        }
    }
    if let Some(e) = tally.first_error {
        println!("first error: {e}");
    }
    if answered == 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&l, 500), 500);
        assert_eq!(percentile(&l, 990), 990);
        assert_eq!(percentile(&l, 999), 999);
        assert_eq!(percentile(&[7], 990), 7);
        assert_eq!(percentile(&[], 990), 0);
    }
}

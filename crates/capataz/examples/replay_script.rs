//! Writes a deterministic replay script to standard output, for benchmarking `capataz replay`.
//!
//! Usage: `cargo run --release --example replay_script -- LINES [BACKENDS]` (defaults 10,000,000
//! lines over 1,000 backends). The mix looks like a day of probe logs with traffic observations:
//! about 70 % PROBE and 30 % OBSERVE lines with mostly healthy answers and streaks of failures,
//! and a STATUS or HEALTHY line every 100,000 lines.

use std::io::{self, Write};

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let lines: u64 = args
        .next()
        .map_or(Ok(10_000_000), |a| a.parse())
        .expect("LINES is a number");
    let backends: u64 = args
        .next()
        .map_or(Ok(1_000), |a| a.parse())
        .expect("BACKENDS is a number");
    let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
    write!(out, "POOL")?;
    for b in 0..backends {
        write!(out, " web-{b:04}")?;
    }
    writeln!(out)?;
    // A fixed linear congruential generator: the same script every run.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    const PROBE_ANSWERS: [&str; 8] = [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 503 Service Unavailable",
        "TIMEOUT",
        "REFUSED",
    ];
    const TRAFFIC_ANSWERS: [&str; 8] = [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 502 Bad Gateway",
        "HTTP/1.1 500 Internal Server Error",
        "RESET",
    ];
    for i in 1..lines {
        if i % 100_000 == 0 {
            writeln!(
                out,
                "{}",
                if i % 200_000 == 0 {
                    "HEALTHY"
                } else {
                    "STATUS"
                }
            )?;
            continue;
        }
        let r = next();
        let backend = r % backends;
        let pick = ((r >> 20) % 8) as usize;
        if (r >> 24) % 10 < 7 {
            writeln!(out, "PROBE web-{backend:04} {}", PROBE_ANSWERS[pick])?;
        } else {
            writeln!(out, "OBSERVE web-{backend:04} {}", TRAFFIC_ANSWERS[pick])?;
        }
    }
    out.flush()
}

//! `h3load`: a closed-loop HTTP/3 load generator for the benchmarks (`bench/h3.sh`).
//!
//! Debian's load generators speak no HTTP/3 (its h2load is built without ngtcp2, its curl
//! without HTTP/3), so this one does it with the stack capataz's own listener uses: quinn for
//! QUIC, hyperium's h3 over it, rustls on the ring provider.
//!
//! Two modes:
//! - keep-alive (the default): `-c` QUIC connections, each with `-m` requests in flight (one
//!   request per stream, the next sent when one is answered), for `-d` seconds;
//! - `--new`: `-c` clients, each doing one request per QUIC connection: a full handshake (no
//!   resumption, no 0-RTT), one `GET`, the connection closed, then the next. Requests per
//!   second is handshakes per second.
//!
//! It prints what `bench/h3.sh` parses: requests answered and failed, requests per second and
//! latency percentiles in microseconds (keep-alive: from the request sent to its answer's end;
//! `--new`: from the connect to the answer's end, handshake included).
//!
//! The server's certificate is pinned: `--cert PEM` names the one certificate to accept (the
//! benchmark's self-signed one); the handshake signature is still checked against it.

mod args;
mod tls;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use h3::client::SendRequest;

use args::Args;

/// What one task brings back: latencies of the requests it completed, and failures.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    failed: u64,
    /// The first failure's text, to show why.
    first_error: Option<String>,
}

impl Tally {
    fn fail(&mut self, error: String) {
        self.failed += 1;
        self.first_error.get_or_insert(error);
    }

    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.failed += other.failed;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("h3load: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let config = match tls::client_config(&args.cert) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("h3load: {e}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(args.threads);
        b
    };
    let runtime = runtime.enable_all().build().expect("tokio runtime");
    let (tally, elapsed) = runtime.block_on(run(&args, config));
    report(&args, tally, elapsed)
}

async fn run(args: &Args, config: quinn::ClientConfig) -> (Tally, Duration) {
    if args.new_connections {
        run_new(args, config).await
    } else {
        run_keepalive(args, config).await
    }
}

/// An endpoint on an ephemeral loopback port (its own UDP socket).
fn endpoint(config: &quinn::ClientConfig, server: SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let local: SocketAddr = if server.is_ipv4() {
        "127.0.0.1:0".parse().unwrap()
    } else {
        "[::1]:0".parse().unwrap()
    };
    let mut endpoint = quinn::Endpoint::client(local)?;
    endpoint.set_default_client_config(config.clone());
    Ok(endpoint)
}

type Sender = SendRequest<h3_quinn::OpenStreams, Bytes>;

/// A QUIC connection with HTTP/3 set up on it (its driver spawned).
async fn connect(
    endpoint: &quinn::Endpoint,
    args: &Args,
) -> Result<(quinn::Connection, Sender), String> {
    let connection = endpoint
        .connect(args.addr, &args.sni)
        .map_err(|e| format!("connect: {e}"))?
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(connection.clone()))
        .await
        .map_err(|e| format!("h3 setup: {e}"))?;
    tokio::spawn(async move { driver.wait_idle().await });
    Ok((connection, send))
}

/// One `GET`, its answer read to the end; an answer other than 200 is a failure.
async fn get(send: &mut Sender, args: &Args) -> Result<(), String> {
    let request = http::Request::get(&args.uri).body(()).unwrap();
    let mut stream = send
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    stream.finish().await.map_err(|e| format!("finish: {e}"))?;
    let head = stream
        .recv_response()
        .await
        .map_err(|e| format!("response: {e}"))?;
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| format!("body: {e}"))? {
        chunk.advance(chunk.remaining());
    }
    if head.status() != http::StatusCode::OK {
        return Err(format!("status {}", head.status()));
    }
    Ok(())
}

fn micros(since: Instant) -> u32 {
    u32::try_from(since.elapsed().as_micros()).unwrap_or(u32::MAX)
}

/// Keep-alive: all connections set up first, then `-m` request loops on each until the deadline.
async fn run_keepalive(args: &Args, config: quinn::ClientConfig) -> (Tally, Duration) {
    let mut tally = Tally::default();
    let mut senders = Vec::new();
    let setup = Instant::now();
    for _ in 0..args.connections {
        let opened = endpoint(&config, args.addr).map_err(|e| format!("socket: {e}"));
        match opened {
            Ok(endpoint) => match connect(&endpoint, args).await {
                Ok((connection, send)) => senders.push((endpoint, connection, send)),
                Err(e) => tally.fail(e),
            },
            Err(e) => tally.fail(e),
        }
    }
    println!("setup_s: {:.3}", setup.elapsed().as_secs_f64());
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut tasks = Vec::new();
    for (_, connection, send) in &senders {
        for _ in 0..args.streams {
            let (connection, mut send, args) = (connection.clone(), send.clone(), args.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = Tally::default();
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match get(&mut send, &args).await {
                        Ok(()) => mine.latencies_us.push(micros(sent)),
                        Err(e) => {
                            mine.fail(e);
                            if connection.close_reason().is_some() {
                                break;
                            }
                        }
                    }
                }
                mine
            }));
        }
    }
    for task in tasks {
        tally.merge(task.await.expect("request loop"));
    }
    let elapsed = start.elapsed();
    let closing = Instant::now();
    for (_, connection, _) in &senders {
        connection.close(0u32.into(), b"done");
    }
    for (endpoint, _, _) in senders {
        endpoint.wait_idle().await;
    }
    println!("close_s: {:.3}", closing.elapsed().as_secs_f64());
    (tally, elapsed)
}

/// `--new`: each client connects, asks once, closes, again, until the deadline.
async fn run_new(args: &Args, config: quinn::ClientConfig) -> (Tally, Duration) {
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.connections {
        let (config, args) = (config.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Tally::default();
            let endpoint = match endpoint(&config, args.addr) {
                Ok(endpoint) => endpoint,
                Err(e) => {
                    mine.fail(format!("socket: {e}"));
                    return mine;
                }
            };
            while Instant::now() < deadline {
                let began = Instant::now();
                let answered = match connect(&endpoint, &args).await {
                    Ok((connection, mut send)) => {
                        let answered = get(&mut send, &args).await;
                        connection.close(0u32.into(), b"done");
                        answered
                    }
                    Err(e) => Err(e),
                };
                match answered {
                    Ok(()) => mine.latencies_us.push(micros(began)),
                    Err(e) => {
                        mine.fail(e);
                        // A refused or unreachable server fails at once: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            endpoint.wait_idle().await;
            mine
        }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("client loop"));
    }
    (tally, start.elapsed())
}

fn percentile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn report(args: &Args, mut tally: Tally, elapsed: Duration) -> ExitCode {
    tally.latencies_us.sort_unstable();
    let ok = tally.latencies_us.len();
    let secs = elapsed.as_secs_f64();
    let mode = if args.new_connections {
        "new connection per request"
    } else {
        "keep-alive"
    };
    println!(
        "h3load: {mode}, {} connections x {} streams, {} thread(s), {}",
        args.connections,
        if args.new_connections {
            1
        } else {
            args.streams
        },
        args.threads,
        args.uri
    );
    println!("elapsed_s: {secs:.3}");
    println!("requests: {ok} ok, {} failed", tally.failed);
    println!("req_per_s: {:.1}", ok as f64 / secs);
    let l = &tally.latencies_us;
    println!(
        "latency_us: p50 {} p75 {} p90 {} p99 {} max {}",
        percentile(l, 0.50),
        percentile(l, 0.75),
        percentile(l, 0.90),
        percentile(l, 0.99),
        l.last().copied().unwrap_or(0)
    );
    if let Some(e) = tally.first_error {
        println!("first_error: {e}");
    }
    if ok == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 0.50), 50);
        assert_eq!(percentile(&sorted, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}

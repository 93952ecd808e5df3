//! The command line.

use std::net::SocketAddr;
use std::time::Duration;

pub(crate) const USAGE: &str =
    "usage: openload -r RATE [-c CONNS] [-d SECONDS] [-w SECONDS] [-s MS] \
http://IP:PORT/PATH
  -r RATE       requests per second, all connections together
  -c CONNS      keep-alive connections (default 50)
  -d SECONDS    how long to measure (default 10)
  -w SECONDS    warm-up at the same rate, not measured (default 2)
  -s MS         also print each measured request slower than MS milliseconds (at most 10,000):
                its connection, when it was due (CLOCK_MONOTONIC seconds, as `perf record -k
                CLOCK_MONOTONIC` stamps events) and its latency";

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) rate: u64,
    pub(crate) connections: usize,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    /// Requests slower than this are printed one by one (`-s`).
    pub(crate) slow: Option<Duration>,
    /// The server's address, from the URL.
    pub(crate) addr: SocketAddr,
    /// The request as sent.
    pub(crate) request: Vec<u8>,
}

fn number(flag: &str, value: Option<String>, min: u64, max: u64) -> Result<u64, String> {
    let value = value.ok_or(format!("{flag} needs a value"))?;
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} {value}: expected a number from {min} to {max}"
        )),
    }
}

impl Args {
    pub(crate) fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let (mut rate, mut connections, mut seconds, mut warmup) = (None, 50, 10, 2);
        let mut slow = None;
        let mut url = None;
        while let Some(arg) = argv.next() {
            match arg.as_str() {
                "-r" => rate = Some(number("-r", argv.next(), 1, 10_000_000)?),
                "-c" => connections = number("-c", argv.next(), 1, 10_000)?,
                "-d" => seconds = number("-d", argv.next(), 1, 3_600)?,
                "-w" => warmup = number("-w", argv.next(), 0, 3_600)?,
                "-s" => slow = Some(number("-s", argv.next(), 0, 3_600_000)?),
                _ if arg.starts_with("http://") && url.is_none() => url = Some(arg),
                _ => return Err(format!("unexpected argument {arg:?}")),
            }
        }
        let rate = rate.ok_or("no rate given (-r)")?;
        let url = url.ok_or("no URL given")?;
        let rest = &url["http://".len()..];
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr: SocketAddr = authority
            .parse()
            .map_err(|_| format!("{url}: expected http://IP:PORT/PATH"))?;
        let path = if path.is_empty() { "/" } else { path };
        let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n").into_bytes();
        Ok(Args {
            rate,
            connections: connections as usize,
            duration: Duration::from_secs(seconds),
            warmup: Duration::from_secs(warmup),
            slow: slow.map(Duration::from_millis),
            addr,
            request,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Args;

    fn parse(line: &str) -> Result<Args, String> {
        Args::parse(line.split(' ').map(String::from))
    }

    #[test]
    fn a_url_and_a_rate_make_a_request() {
        let args = parse("-r 1000 -c 10 http://127.0.0.1:9400/x").unwrap();
        assert_eq!(args.addr.port(), 9400);
        assert_eq!(args.connections, 10);
        assert_eq!(
            args.request,
            b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:9400\r\n\r\n".to_vec()
        );
        let bare = parse("-r 5 http://127.0.0.1:80").unwrap();
        assert!(bare.request.starts_with(b"GET / HTTP/1.1\r\n"));
        assert_eq!(bare.slow, None);
    }

    #[test]
    fn slow_requests_are_printed_only_when_asked() {
        let args = parse("-r 1000 -s 10 http://127.0.0.1:9400/").unwrap();
        assert_eq!(args.slow, Some(std::time::Duration::from_millis(10)));
        assert!(parse("-r 1000 -s http://127.0.0.1:9400/").is_err());
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert!(parse("http://127.0.0.1:80/").unwrap_err().contains("-r"));
        assert!(parse("-r 0 http://127.0.0.1:80/")
            .unwrap_err()
            .contains("-r 0"));
        assert!(parse("-r 5 http://localhost:80/")
            .unwrap_err()
            .contains("IP:PORT"));
        assert!(parse("-r 5 -c").unwrap_err().contains("-c needs"));
    }
}

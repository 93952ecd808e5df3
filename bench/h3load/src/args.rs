//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const USAGE: &str = "usage: h3load [--new] [-c CONNS] [-m STREAMS] [-d SECONDS] \
[-t THREADS] [--sni NAME] --cert PEM https://IP:PORT/PATH
  --new         one request per QUIC connection (a full handshake each); -m is ignored
  -c CONNS      connections (--new: clients) at once (default 50)
  -m STREAMS    requests in flight per connection (default 1)
  -d SECONDS    how long to load (default 5)
  -t THREADS    runtime threads (default 1)
  --sni NAME    TLS server name (default localhost)
  --cert PEM    the server's certificate: the only one accepted";

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) new_connections: bool,
    pub(crate) connections: usize,
    pub(crate) streams: usize,
    pub(crate) duration: Duration,
    pub(crate) threads: usize,
    pub(crate) sni: String,
    pub(crate) cert: PathBuf,
    /// The server's UDP address, from the URL.
    pub(crate) addr: SocketAddr,
    /// The request's URI as sent (`https://IP:PORT/PATH`).
    pub(crate) uri: String,
}

fn number(flag: &str, value: Option<String>, max: usize) -> Result<usize, String> {
    let value = value.ok_or(format!("{flag} needs a value"))?;
    match value.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{flag} {value}: expected a number from 1 to {max}")),
    }
}

impl Args {
    pub(crate) fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let (mut new_connections, mut connections, mut streams) = (false, 50, 1);
        let (mut seconds, mut threads) = (5, 1);
        let (mut sni, mut cert, mut url) = ("localhost".to_string(), None, None);
        while let Some(arg) = argv.next() {
            match arg.as_str() {
                "--new" => new_connections = true,
                "-c" => connections = number("-c", argv.next(), 100_000)?,
                "-m" => streams = number("-m", argv.next(), 10_000)?,
                "-d" => seconds = number("-d", argv.next(), 3_600)?,
                "-t" => threads = number("-t", argv.next(), 64)?,
                "--sni" => sni = argv.next().ok_or("--sni needs a value")?,
                "--cert" => cert = Some(PathBuf::from(argv.next().ok_or("--cert needs a file")?)),
                _ if arg.starts_with("https://") && url.is_none() => url = Some(arg),
                _ => return Err(format!("unexpected argument {arg:?}")),
            }
        }
        let url = url.ok_or("no URL given")?;
        let rest = &url["https://".len()..];
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr: SocketAddr = authority
            .parse()
            .map_err(|_| format!("{url}: the URL's host must be IP:PORT"))?;
        let path = if path.is_empty() { "/" } else { path };
        Ok(Args {
            new_connections,
            connections,
            streams,
            duration: Duration::from_secs(seconds as u64),
            threads,
            sni,
            cert: cert.ok_or("--cert is required (the server's certificate, PEM)")?,
            addr,
            uri: format!("https://{authority}{path}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        Args::parse(line.split_whitespace().map(str::to_string))
    }

    #[test]
    fn a_full_command_line_is_read_with_its_url_split_into_address_and_uri() {
        let a = parse(
            "--new -c 8 -m 3 -d 2 -t 2 --sni example.com --cert c.pem https://127.0.0.1:9400/x?y=1",
        )
        .unwrap();
        assert!(a.new_connections);
        assert_eq!((a.connections, a.streams, a.threads), (8, 3, 2));
        assert_eq!(a.duration, Duration::from_secs(2));
        assert_eq!(a.sni, "example.com");
        assert_eq!(a.addr, "127.0.0.1:9400".parse().unwrap());
        assert_eq!(a.uri, "https://127.0.0.1:9400/x?y=1");
    }

    #[test]
    fn defaults_and_a_url_without_a_path() {
        let a = parse("--cert c.pem https://[::1]:443").unwrap();
        assert!(!a.new_connections);
        assert_eq!((a.connections, a.streams, a.threads), (50, 1, 1));
        assert_eq!(a.sni, "localhost");
        assert_eq!(a.uri, "https://[::1]:443/");
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        for (line, says) in [
            ("--cert c.pem", "no URL"),
            ("https://127.0.0.1:1/", "--cert is required"),
            ("--cert c.pem https://localhost:443/", "IP:PORT"),
            ("-c 0 --cert c.pem https://127.0.0.1:1/", "-c 0"),
            ("-m x --cert c.pem https://127.0.0.1:1/", "-m x"),
            ("-d", "-d needs a value"),
            ("--bogus", "unexpected argument"),
        ] {
            let error = parse(line).unwrap_err();
            assert!(error.contains(says), "{line}: {error}");
        }
    }
}

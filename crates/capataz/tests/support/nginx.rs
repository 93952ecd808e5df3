//! A real nginx as a backend (Debian's `nginx`, installed by `.ci/deps/nginx.sh`): HTTP/2 over
//! TLS (ALPN `h2`, certificates from the test's [`Pki`]), HTTP/2 with prior knowledge (h2c) and
//! HTTP/1.1, each on a loopback port of its own. Each location answers with what nginx saw of
//! the request (`host=... protocol=... scheme=... uri=...`), so a test reads back the
//! `:authority`/`Host` capataz sent; `/big` answers `big_body_bytes` bytes.
//!
//! nginx runs as the test's child process, in the foreground and as a single process
//! (`daemon off`, `master_process off`: no workers to leave behind), with its prefix (`-p`),
//! configuration (`-c`), error log (`-e`), PID file, access log and temporary paths in a
//! temporary directory: nothing under /etc, /var or /run is read or written. Its ports are
//! reserved for its whole life ([`super::ReservedPort`]; nginx binds with `SO_REUSEADDR`). It
//! is killed by PID when dropped.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::backends_tls::Pki;
use super::tools::require_tool;
use super::{reserve_port, ReservedPort, DEADLINE};

/// The size of `/big`'s answer.
pub const BIG_BODY_BYTES: usize = 1 << 20;

/// A running nginx and its files.
pub struct Nginx {
    dir: PathBuf,
    tls: ReservedPort,
    h2c: ReservedPort,
    http1: ReservedPort,
    child: Option<Child>,
}

impl Nginx {
    /// Starts nginx with a certificate for 127.0.0.1 from `pki`; its files go to a fresh
    /// temporary directory named after `tag`. Returns once every port accepts connections.
    pub fn start(tag: &str, pki: &Pki) -> Nginx {
        let dir = std::env::temp_dir().join(format!(
            "capataz-nginx-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("create the nginx directory");
        let (cert, key) = pki.leaf_files(&format!("nginx-{tag}"), &["127.0.0.1"]);
        let mut nginx = Nginx {
            dir,
            tls: reserve_port(),
            h2c: reserve_port(),
            http1: reserve_port(),
            child: None,
        };
        nginx.write_config(&cert, &key);
        nginx.run();
        nginx
    }

    /// The HTTP/2-over-TLS address (ALPN `h2`, and `http/1.1`).
    pub fn tls_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.tls.port))
    }

    /// The h2c address (HTTP/2 with prior knowledge only).
    pub fn h2c_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.h2c.port))
    }

    /// The plaintext HTTP/1.1 address.
    pub fn http1_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http1.port))
    }

    /// nginx's error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    fn write_config(&self, cert: &str, key: &str) {
        let dir = self.dir.display();
        let text = format!(
            "daemon off;\n\
             master_process off;\n\
             worker_processes 1;\n\
             pid {dir}/nginx.pid;\n\
             error_log {dir}/error.log info;\n\
             events {{ worker_connections 512; }}\n\
             http {{\n\
             \x20   access_log {dir}/access.log;\n\
             \x20   client_body_temp_path {dir}/client_body;\n\
             \x20   proxy_temp_path {dir}/proxy;\n\
             \x20   fastcgi_temp_path {dir}/fastcgi;\n\
             \x20   uwsgi_temp_path {dir}/uwsgi;\n\
             \x20   scgi_temp_path {dir}/scgi;\n\
             \x20   default_type text/plain;\n\
             \x20   server {{\n\
             \x20       listen 127.0.0.1:{tls} ssl http2;\n\
             \x20       listen 127.0.0.1:{h2c} http2;\n\
             \x20       listen 127.0.0.1:{http1};\n\
             \x20       ssl_certificate {cert};\n\
             \x20       ssl_certificate_key {key};\n\
             \x20       root {dir}/www;\n\
             \x20       location = /big {{ }}\n\
             \x20       location / {{\n\
             \x20           return 200 \"host=$http_host protocol=$server_protocol \
             scheme=$scheme uri=$request_uri\\n\";\n\
             \x20       }}\n\
             \x20   }}\n\
             }}\n",
            tls = self.tls.port,
            h2c = self.h2c.port,
            http1 = self.http1.port,
        );
        std::fs::write(self.dir.join("nginx.conf"), text).expect("write nginx.conf");
        std::fs::create_dir_all(self.dir.join("www")).expect("create nginx's root");
        std::fs::write(self.dir.join("www/big"), vec![b'x'; BIG_BODY_BYTES])
            .expect("write nginx's /big");
    }

    fn run(&mut self) {
        let mut child = Command::new(require_tool("nginx", "nginx"))
            .arg("-p")
            .arg(&self.dir)
            .arg("-c")
            .arg(self.dir.join("nginx.conf"))
            .arg("-e")
            .arg(self.dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx runs");
        let end = Instant::now() + DEADLINE;
        let addrs = [self.tls_addr(), self.h2c_addr(), self.http1_addr()];
        // Ready once every port accepts (the reserved ports refuse until nginx listens).
        while !addrs
            .iter()
            .all(|addr| TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_ok())
        {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nginx exited at start ({status}): {}", self.error_log());
            }
            if Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "nginx did not listen within {DEADLINE:?}: {}",
                    self.error_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

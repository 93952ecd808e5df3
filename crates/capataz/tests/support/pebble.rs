//! Let's Encrypt's test ACME server, `pebble` (Debian package `pebble`, installed by
//! `.ci/deps/pebble.sh`), on loopback for the ACME tests, with `pebble-challtestsrv` (same
//! package) as its DNS server, answering 127.0.0.1 for every name, so any test domain
//! validates against the balancer on loopback.
//!
//! Both are separate processes whose ports are given on their command lines and in pebble's
//! config file, so they cannot bind port 0: each port is one the kernel handed out for
//! `127.0.0.1:0` and that was released just before. Another program (often another test's
//! pebble) can take one first; then this pebble exits while the other answers on the port. So
//! a start counts only when both processes still run and pebble's two HTTPS ports present the
//! certificate of this PKI; otherwise both are started again on new ports. Both processes are
//! killed, by their `Child`, when [`Pebble`] drops.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use super::tls::Pki;
use super::tools::require_tool;

/// A free TCP port on loopback (released: see the module's note).
pub fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

/// A running pebble and its DNS server (none when pebble asks a test's own server).
pub struct Pebble {
    pebble: Child,
    dns: Option<Child>,
    /// The PKI whose CA signed pebble's own HTTPS certificate (`ca_path()` for `ca_file`).
    pub pki: Pki,
    /// The directory URL.
    pub directory: String,
    management: SocketAddr,
}

impl Pebble {
    /// Starts challtestsrv and pebble; pebble validates TLS-ALPN-01 on 127.0.0.1:`tls_port`
    /// and issues certificates valid for `validity` seconds. Returns once pebble's directory
    /// accepts connections.
    pub fn start(tls_port: u16, validity: u64) -> Pebble {
        Pebble::start_ports(tls_port, free_tcp_port(), validity, None, "")
    }

    /// As [`Pebble::start`], naming `http://127.0.0.1:<ocsp_port>/` as the OCSP responder in
    /// every certificate it issues (pebble's `ocspResponderURL`; pebble runs no responder).
    pub fn start_ocsp(tls_port: u16, validity: u64, ocsp_port: u16) -> Pebble {
        let url = format!("http://127.0.0.1:{ocsp_port}/");
        Pebble::start_ports(tls_port, free_tcp_port(), validity, None, &url)
    }

    /// As [`Pebble::start`], asking the DNS server `dns` (a test's own, which the balancer
    /// updates) for everything, DNS-01's TXT records included; no challtestsrv.
    pub fn start_dns01(dns: SocketAddr, validity: u64) -> Pebble {
        Pebble::start_ports(free_tcp_port(), free_tcp_port(), validity, Some(dns), "")
    }

    /// As [`Pebble::start`], validating HTTP-01 on 127.0.0.1:`http_port` (TLS-ALPN-01 on a
    /// port where nothing listens).
    pub fn start_http01(http_port: u16, validity: u64) -> Pebble {
        Pebble::start_ports(free_tcp_port(), http_port, validity, None, "")
    }

    fn start_ports(
        tls_port: u16,
        http_port: u16,
        validity: u64,
        dns: Option<SocketAddr>,
        ocsp_url: &str,
    ) -> Pebble {
        const ATTEMPTS: usize = 8;
        for _ in 1..ATTEMPTS {
            match Pebble::try_start(tls_port, http_port, validity, dns, ocsp_url) {
                Ok(pebble) => return pebble,
                Err(why) => eprintln!("pebble did not start ({why}); again on other ports"),
            }
        }
        Pebble::try_start(tls_port, http_port, validity, dns, ocsp_url)
            .unwrap_or_else(|why| panic!("pebble did not start {ATTEMPTS} times: {why}"))
    }

    /// One start on fresh ports (and a fresh PKI): the pebble, or why it is not this one
    /// answering (the processes are killed and the files removed as it drops).
    fn try_start(
        tls_port: u16,
        http_port: u16,
        validity: u64,
        own_dns: Option<SocketAddr>,
        ocsp_url: &str,
    ) -> Result<Pebble, String> {
        let pki = Pki::new();
        let (cert, key) = pki.server("pebble", &["localhost"], None);
        let dns_port = free_udp_port();
        let dns_management = free_tcp_port();
        let dns_server = own_dns.unwrap_or(([127, 0, 0, 1], dns_port).into());
        let dns = own_dns.is_none().then(|| {
            Command::new(require_tool("pebble-challtestsrv", "pebble"))
                .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                .args(["-management", &format!("127.0.0.1:{dns_management}")])
                .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("pebble-challtestsrv starts")
        });
        let listen = free_tcp_port();
        let management: SocketAddr = ([127, 0, 0, 1], free_tcp_port()).into();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{listen}"),
                "managementListenAddress": management.to_string(),
                "certificate": cert,
                "privateKey": key,
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": ocsp_url,
                "externalAccountBindingRequired": false,
                "certificateValidityPeriod": validity,
            }
        });
        let config_path: PathBuf = pki.dir.join("pebble.json");
        std::fs::write(&config_path, config.to_string()).expect("write pebble's config");
        let log = std::fs::File::create(pki.dir.join("pebble.log")).expect("pebble's log");
        let pebble = Command::new(require_tool("pebble", "pebble"))
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &dns_server.to_string()])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_VA_ALWAYS_VALID", "0")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("pebble starts");
        let mut pebble = Pebble {
            pebble,
            dns,
            pki,
            directory: format!("https://localhost:{listen}/dir"),
            management,
        };
        let mut ports = vec![listen, management.port()];
        if own_dns.is_none() {
            ports.push(dns_management);
        }
        for port in ports {
            pebble.wait_for_port(port)?;
        }
        // The HTTPS ports are this pebble's if they present this PKI's certificate; its
        // processes must still run (the DNS server's ports answer nothing that says whose).
        for port in [listen, management.port()] {
            if let Err(e) = pebble.handshake(port) {
                return Err(format!("port {port}: {e}\n{}", pebble.log()));
            }
        }
        pebble.running()?;
        Ok(pebble)
    }

    /// `Err` if pebble or its DNS server has exited (a port of its was taken, say).
    fn running(&mut self) -> Result<(), String> {
        let exited = std::iter::once(&mut self.pebble)
            .chain(self.dns.as_mut())
            .find_map(|child| child.try_wait().ok().flatten());
        match exited {
            Some(status) => Err(format!("a process exited ({status})\n{}", self.log())),
            None => Ok(()),
        }
    }

    /// Waits until something listens on 127.0.0.1:`port`, while both processes run.
    fn wait_for_port(&mut self, port: u16) -> Result<(), String> {
        let end = Instant::now() + super::DEADLINE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.running()?;
            if Instant::now() >= end {
                return Err(format!("nothing listens on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// A TLS client trusting this PKI's CA alone, for `localhost`.
    fn tls_client(&self) -> rustls::ClientConnection {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.pki.ca_path()).expect("the CA") {
            roots.add(cert.expect("a CA")).expect("added");
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = ServerName::try_from("localhost").expect("a name");
        rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client")
    }

    /// A TLS handshake with 127.0.0.1:`port`, verified against this PKI.
    fn handshake(&self, port: u16) -> std::io::Result<()> {
        let mut connection = self.tls_client();
        let mut tcp = TcpStream::connect(("127.0.0.1", port))?;
        tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(20)))?;
        while connection.is_handshaking() {
            connection.complete_io(&mut tcp)?;
        }
        Ok(())
    }

    /// pebble's log so far, for a failed assertion's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.pki.dir.join("pebble.log")).unwrap_or_default()
    }

    /// The root pebble issues under (`/roots/0` of its management API), as PEM.
    pub fn root_pem(&self) -> String {
        self.management_pem("/roots/0")
    }

    /// The intermediate that signs the certificates pebble issues (`/intermediates/0`) and
    /// its private key (`/intermediate-keys/0`), as PEM: what an OCSP responder for them
    /// signs with.
    pub fn intermediate_pem(&self) -> (String, String) {
        (
            self.management_pem("/intermediates/0"),
            self.management_pem("/intermediate-keys/0"),
        )
    }

    /// The PEM body of `GET path` on pebble's management API.
    fn management_pem(&self, path: &str) -> String {
        let mut connection = self.tls_client();
        let mut tcp = TcpStream::connect(self.management).expect("pebble's management API");
        tcp.set_read_timeout(Some(Duration::from_secs(20))).ok();
        let mut tls = rustls::Stream::new(&mut connection, &mut tcp);
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tls.write_all(request.as_bytes()).expect("ask pebble");
        let mut answer = Vec::new();
        // pebble closes without close_notify at times: what was read is enough.
        let _ = tls.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let start = answer
            .find("-----BEGIN ")
            .unwrap_or_else(|| panic!("no PEM for {path} in {answer:?}"));
        answer[start..].to_owned()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in std::iter::once(&mut self.pebble).chain(self.dns.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

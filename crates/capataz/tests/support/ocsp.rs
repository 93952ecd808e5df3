//! OCSP scaffolding: a CA whose certificates name an OCSP responder on loopback, OpenSSL's
//! responder (`openssl ocsp -index`, Debian package `openssl`, `.ci/deps/openssl.sh`) serving
//! their status from an `index.txt`, offline responses written by the same tool, the same
//! responder for another CA's issuer ([`IssuerOcsp`]: pebble's intermediate, for the
//! certificates pebble issues), and `openssl s_client -status` to see what a server staples.
//!
//! The responder is a separate process whose port is in the certificates it answers for, so
//! it cannot bind port 0: the port is held by the [`OcspCa`] for its life
//! ([`super::ReservedPort`]; `openssl ocsp` binds with `SO_REUSEADDR` all the same), so no
//! other test's listener takes it before the responder starts or between two responders. It
//! is killed when [`Responder`] drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::tls::Pki;
use super::tools::require_tool;

/// A CA (ECDSA P-256, `ocsp-ca.pem` and `ocsp-ca.key`) in a temporary directory, whose leaves
/// name `http://127.0.0.1:<port>/` as their OCSP responder.
pub struct OcspCa {
    /// Holds the directory (removed when dropped).
    pub pki: Pki,
    /// The responder's port, written in every leaf.
    pub port: u16,
    /// The port, held.
    _held: super::ReservedPort,
    ca: rcgen::Certificate,
    key: rcgen::KeyPair,
    /// The index lines so far (`V` or `R`, per leaf).
    index: Vec<String>,
}

impl OcspCa {
    pub fn new() -> OcspCa {
        let pki = Pki::new();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "capataz OCSP test CA");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let ca = params.self_signed(&key).unwrap();
        std::fs::write(pki.dir.join("ocsp-ca.pem"), ca.pem()).unwrap();
        std::fs::write(pki.dir.join("ocsp-ca.key"), key.serialize_pem()).unwrap();
        let held = super::reserve_port();
        OcspCa {
            pki,
            port: held.port,
            _held: held,
            ca,
            key,
            index: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.pki.dir
    }

    pub fn ca_path(&self) -> PathBuf {
        self.pki.dir.join("ocsp-ca.pem")
    }

    /// A leaf for `name` with `serial` (below 0x8000), its chain (leaf then CA) written to
    /// `<name>.pem`, its key to `<name>.key`, and listed in the index as valid or revoked.
    pub fn leaf(&mut self, name: &str, serial: u16, revoked: bool) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(serial.to_be_bytes().to_vec()));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let url = format!("http://127.0.0.1:{}/", self.port);
        // AuthorityInfoAccess: SEQUENCE { SEQUENCE { id-ad-ocsp, [6] url } }.
        let mut description = vec![0x06, 0x08, 0x2b, 6, 1, 5, 5, 7, 0x30, 1, 0x86];
        description.push(url.len() as u8);
        description.extend_from_slice(url.as_bytes());
        let mut inner = vec![0x30, description.len() as u8];
        inner.extend(description);
        let mut aia = vec![0x30, inner.len() as u8];
        aia.extend(inner);
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 5, 5, 7, 1, 1],
                aia,
            ));
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.key).unwrap();
        let cert_path = self.pki.dir.join(format!("{name}.pem"));
        let key_path = self.pki.dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, format!("{}{}", cert.pem(), self.ca.pem())).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        std::fs::write(self.pki.dir.join(format!("{name}.leaf.pem")), cert.pem()).unwrap();
        let (status, revocation) = if revoked {
            ("R", "240101000000Z")
        } else {
            ("V", "")
        };
        self.index.push(format!(
            "{status}\t491231235959Z\t{revocation}\t{serial:04X}\tunknown\t/CN={name}"
        ));
        std::fs::write(self.pki.dir.join("index.txt"), self.index.join("\n") + "\n").unwrap();
        (cert_path, key_path)
    }

    /// The DER OCSP response for leaf `name`, fresh for `minutes`, made offline by `openssl
    /// ocsp` and written to `<name>.ocsp.der`.
    pub fn response_file(&self, name: &str, minutes: u32) -> PathBuf {
        let dir = &self.pki.dir;
        let request = dir.join(format!("{name}.req.der"));
        let response = dir.join(format!("{name}.ocsp.der"));
        openssl(
            dir,
            &[
                "ocsp",
                "-issuer",
                "ocsp-ca.pem",
                "-cert",
                &format!("{name}.leaf.pem"),
                "-no_nonce",
                "-reqout",
                &request.display().to_string(),
            ],
        );
        openssl(
            dir,
            &[
                "ocsp",
                "-index",
                "index.txt",
                "-rsigner",
                "ocsp-ca.pem",
                "-rkey",
                "ocsp-ca.key",
                "-CA",
                "ocsp-ca.pem",
                "-nmin",
                &minutes.to_string(),
                "-reqin",
                &request.display().to_string(),
                "-respout",
                &response.display().to_string(),
            ],
        );
        response
    }

    /// Starts `openssl ocsp` on the port the leaves name, answering from the index (each
    /// response fresh for `minutes`), logging every answer to `responder.log`.
    pub fn responder(&self, minutes: u32) -> Responder {
        spawn_responder(
            &self.pki.dir,
            ("ocsp-ca.pem", "ocsp-ca.key"),
            self.port,
            minutes,
            "responder.log",
        )
    }
}

/// Starts `openssl ocsp` in `dir` on 127.0.0.1:`port`, answering from `dir/index.txt` for the
/// certificates `issuer` (a PEM certificate and its key, in `dir`) signed, signing with it,
/// each response fresh for `minutes`, logging every answer to `dir/log`.
fn spawn_responder(
    dir: &Path,
    issuer: (&str, &str),
    port: u16,
    minutes: u32,
    log: &str,
) -> Responder {
    let log = dir.join(log);
    let mut child = Command::new(require_tool("openssl", "openssl"))
        .current_dir(dir)
        .args(["ocsp", "-index", "index.txt", "-CA", issuer.0])
        .args(["-rsigner", issuer.0, "-rkey", issuer.1])
        .args(["-port", &port.to_string(), "-nmin", &minutes.to_string()])
        .args(["-ignore_err", "-text", "-out"])
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl starts");
    // It says `ACCEPT [::]:PORT PID=...` once it listens. (Not a probe connection: one
    // that closes without a request leaves OpenSSL 3.0's responder stuck on it.)
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let read = std::io::BufRead::read_line(&mut stdout, &mut line);
    let responder = Responder {
        child,
        log,
        _stdout: stdout,
    };
    assert!(
        read.is_ok() && line.starts_with("ACCEPT"),
        "openssl ocsp does not listen: {line:?}"
    );
    responder
}

/// OpenSSL's responder answering for the certificates another CA's issuer signed (pebble's
/// intermediate, whose key pebble's management API hands out), from an index the test fills
/// with the serials it vouches for: a certificate not in it is `unknown`. The port is held
/// for the responder's whole life, as [`OcspCa`]'s.
pub struct IssuerOcsp {
    pki: Pki,
    held: super::ReservedPort,
    minutes: u32,
    index: Vec<String>,
    responder: Option<Responder>,
    /// The responders started so far (each logs to `responder-N.log`).
    starts: usize,
}

impl IssuerOcsp {
    /// Writes `issuer` (PEM certificate and key) and an index vouching for nothing, and starts
    /// the responder on `held`'s port.
    pub fn start(held: super::ReservedPort, issuer: (&str, &str), minutes: u32) -> IssuerOcsp {
        let pki = Pki::new();
        std::fs::write(pki.dir.join("issuer.pem"), issuer.0).unwrap();
        std::fs::write(pki.dir.join("issuer.key"), issuer.1).unwrap();
        let mut ocsp = IssuerOcsp {
            pki,
            held,
            minutes,
            // A placeholder: OpenSSL's responder wants an index it can read.
            index: vec!["V\t491231235959Z\t\t01\tunknown\t/CN=placeholder".into()],
            responder: None,
            starts: 0,
        };
        ocsp.restart();
        ocsp
    }

    /// Lists the certificate with serial `serial` (uppercase hex, whole bytes, as OpenSSL
    /// writes it) as valid, and restarts the responder so that its next answer reads it
    /// (OpenSSL's responder notices a changed index only after the request that follows it).
    pub fn vouch_for(&mut self, serial: &str) {
        // A name of its own: OpenSSL refuses an index where two valid lines share one.
        self.index.push(format!(
            "V\t491231235959Z\t\t{serial}\tunknown\t/CN=vouched {serial}"
        ));
        self.restart();
    }

    /// Stops the responder (its port stays held): every fetch fails from then on.
    pub fn stop(&mut self) {
        drop(self.responder.take());
    }

    fn restart(&mut self) {
        drop(self.responder.take());
        std::fs::write(self.pki.dir.join("index.txt"), self.index.join("\n") + "\n").unwrap();
        self.starts += 1;
        self.responder = Some(spawn_responder(
            &self.pki.dir,
            ("issuer.pem", "issuer.key"),
            self.held.port,
            self.minutes,
            &format!("responder-{}.log", self.starts),
        ));
    }

    /// What it answered so far, across restarts.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                let file = self.pki.dir.join(format!("responder-{n}.log"));
                std::fs::read_to_string(file).unwrap_or_default()
            })
            .collect()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new(require_tool("openssl", "openssl"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `openssl ocsp` responder.
pub struct Responder {
    child: Child,
    log: PathBuf,
    /// Kept open: the responder must not write to a closed pipe.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Responder {
    /// What it answered so far (`-text`: each request and response).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `openssl s_client -status` says of the OCSP response `addr` staples for
/// `server_name`: the part from `OCSP response:` to the certificate chain.
pub async fn stapled(addr: SocketAddr, server_name: &str) -> String {
    let text = handshake_text(addr, server_name).await;
    let start = text
        .find("OCSP response:")
        .unwrap_or_else(|| panic!("no OCSP part in {text}"));
    let end = text[start..]
        .find("Certificate chain")
        .map_or(text.len(), |e| start + e);
    text[start..end].to_owned()
}

/// All `openssl s_client -status` says of a handshake with `addr` for `server_name`: the
/// stapled response, the chain, the server's certificate (PEM).
pub async fn handshake_text(addr: SocketAddr, server_name: &str) -> String {
    let server_name = server_name.to_owned();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(require_tool("openssl", "openssl"))
            .args(["s_client", "-status", "-connect", &addr.to_string()])
            .args(["-servername", &server_name])
            .stdin(Stdio::null())
            .output()
            .expect("openssl runs")
    });
    let out = tokio::time::timeout(super::DEADLINE, run)
        .await
        .expect("s_client ends in time")
        .expect("s_client ran");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

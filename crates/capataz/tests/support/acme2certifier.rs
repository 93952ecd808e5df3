//! acme2certifier, a real ACME server in Python whose directory has `renewalInfo` (ACME Renewal
//! Information, RFC 9773), for the ARI test: from PyPI into the venv `/opt/acme2certifier`
//! (`.ci/deps/acme2certifier.sh`), run under the standard library's WSGI server on a loopback
//! port, with its OpenSSL CA handler signing by a CA made here, its SQLite store in the test's
//! directory, and certificates valid one day (its shortest). Its suggested window starts
//! `window_start_pctg` percent into a certificate's lifetime and lasts `window_seconds`.
//!
//! acme2certifier validates TLS-ALPN-01 on port 443 and HTTP-01 on port 80 only; a test binds
//! ephemeral ports, so challenge validation is disabled (its `challenge_validation_disable`,
//! which it honours only with `ACME2CERTIFIER_I_KNOW_THE_RISK=1`): the validations are tested
//! against pebble; this server is here for its renewal information.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::pebble::free_tcp_port;
use super::tls::Pki;
use super::tools::require_path;

const VENV_PYTHON: &str = "/opt/acme2certifier/bin/python";

/// Runs acme2certifier's WSGI application on 127.0.0.1:`sys.argv[1]`.
const SERVE: &str = "import os, sys\n\
from wsgiref.simple_server import make_server\n\
import acme2certifier\n\
sys.path.insert(0, os.path.join(os.path.dirname(acme2certifier.__file__), 'share'))\n\
import acme2certifier_wsgi as app\n\
srv = make_server('127.0.0.1', int(sys.argv[1]), app.application, handler_class=app.get_handler_cls())\n\
srv.serve_forever()\n";

/// A running acme2certifier.
pub struct Acme2certifier {
    child: Child,
    /// Its directory's URL (plain HTTP on loopback).
    pub directory: String,
    /// Where its config, CA, database and log are (in `_pki`'s directory, removed with it).
    pub dir: PathBuf,
    _pki: Pki,
}

impl Acme2certifier {
    /// Starts it (again on another port if the one chosen was taken meanwhile).
    pub fn start(window_start_pctg: f64, window_seconds: u64, retry_after: u64) -> Acme2certifier {
        let python = require_path(
            Path::new(VENV_PYTHON),
            "acme2certifier's venv: run `bash .ci/deps/acme2certifier.sh` (as .ci/test and CI do)",
        );
        let pki = Pki::new();
        let dir = pki.dir.join("acme2certifier");
        std::fs::create_dir_all(dir.join("certs")).expect("the server's directory");
        write_ca(&dir);
        let d = dir.display();
        let config = format!(
            "[DEFAULT]\ndebug: True\n\n[Nonce]\nnonce_check_disable: False\n\n\
             [CAhandler]\nhandler_module: acme2certifier.cahandlers.openssl_ca_handler\n\
             issuing_ca_key: {d}/ca.key\nissuing_ca_cert: {d}/ca.pem\nissuing_ca_crl: {d}/ca.crl\n\
             cert_save_path: {d}/certs\nca_cert_chain_list: []\ncert_validity_days: 1\n\n\
             [DBhandler]\nhandler_module: acme2certifier.dbhandlers.wsgi_handler\n\
             dbfile: {d}/acme_srv.db\n\n\
             [Challenge]\nchallenge_validation_disable: True\n\n\
             [Renewalinfo]\nrenewalthreshold_pctg: {window_start_pctg}\n\
             renewal_window_duration: {window_seconds}\nretry_after_timeout: {retry_after}\n"
        );
        std::fs::write(dir.join("acme_srv.cfg"), config).expect("the server's config");
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_tcp_port();
            let log = std::fs::File::create(dir.join("a2c.log")).expect("the server's log");
            let mut child = Command::new(&python)
                .args(["-c", SERVE, &port.to_string()])
                .env("ACME_SRV_CONFIGFILE", dir.join("acme_srv.cfg"))
                .env("ACME2CERTIFIER_I_KNOW_THE_RISK", "1")
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("the log"))
                .stderr(log)
                .spawn()
                .expect("acme2certifier starts");
            let end = Instant::now() + Duration::from_secs(30);
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if directory_answers(port) {
                    return Acme2certifier {
                        child,
                        directory: format!("http://127.0.0.1:{port}/directory"),
                        dir,
                        _pki: pki,
                    };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(dir.join("a2c.log")).unwrap_or_default();
        }
        panic!("acme2certifier did not start 3 times; its log:\n{last}");
    }

    /// The CA's certificate (PEM), which signs what it issues.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Its log (debug: every request's payload).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("a2c.log")).unwrap_or_default()
    }
}

impl Drop for Acme2certifier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether GET /directory on 127.0.0.1:`port` answers 200 with `renewalInfo`.
fn directory_answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /directory HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.take(1 << 16).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.starts_with("HTTP/1.0 200") && answer.contains("renewalInfo")
}

/// A CA for the OpenSSL handler: `ca.pem` and its key `ca.key` (PKCS#8) in `dir`.
fn write_ca(dir: &Path) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "acme2certifier test CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let ca = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("ca.key"), key.serialize_pem()).unwrap();
}

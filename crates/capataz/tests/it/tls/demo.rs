//! `capataz demo --tls`: HTTPS with a self-signed certificate generated at start, no files.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use super::DEADLINE;

/// Kills the demo if the test fails before it exits.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn demo_tls_serves_https_with_a_generated_certificate_and_removes_it_at_the_end() {
    let child = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--rate",
            "0",
        ])
        .args(["--duration", "6", "--tls", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the demo");
    let mut demo = Demo(child);
    let mut lines = BufReader::new(demo.0.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let (tls, try_line) = loop {
        assert!(started.elapsed() < DEADLINE, "no TLS line");
        let line = lines.next().expect("the demo prints its banner").unwrap();
        if let Some(rest) = line.strip_prefix("TLS: https://") {
            let addr = rest.split('/').next().unwrap().to_owned();
            break (addr, lines.next().unwrap().unwrap());
        }
    };
    let dir = try_line
        .split("--cacert ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the curl line names the certificate")
        .to_owned();
    let port = tls.rsplit(':').next().unwrap();
    for args in [
        vec!["-k".to_owned(), format!("https://{tls}/")],
        vec![
            "--cacert".to_owned(),
            dir.clone(),
            "--resolve".to_owned(),
            format!("localhost:{port}:127.0.0.1"),
            format!("https://localhost:{port}/"),
        ],
    ] {
        let out = Command::new(crate::support::tools::require_tool("curl", "curl"))
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
            ])
            .args(&args)
            .output()
            .expect("curl runs");
        let code = String::from_utf8_lossy(&out.stdout);
        // The liar may answer 500 before retries and ejection settle; any answer is HTTPS.
        assert!(
            code.starts_with('2') || code.starts_with('5'),
            "{args:?}: {code} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(std::path::Path::new(&dir).exists());
    let status = demo.0.wait().expect("the demo exits");
    assert!(status.success());
    assert!(
        !std::path::Path::new(&dir).exists(),
        "{dir} was left behind"
    );
}

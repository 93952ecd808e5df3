//! curl (OpenSSL) from the machine as the client: SNI picks the certificate, both versions
//! work, and the backend sees `X-Forwarded-Proto: https`. Installed by `.ci/deps/curl.sh`.

use tokio::process::Command;

use super::*;

/// Runs curl with `args` against `https://<host>:<port>/` resolved to loopback; its verbose
/// output (stderr) and the response head (stdout), lowercase.
async fn curl(host: &str, port: u16, args: &[&str]) -> (String, String) {
    let out = tokio::time::timeout(
        DEADLINE,
        Command::new(crate::support::tools::require_tool("curl", "curl"))
            .args([
                "-sS",
                "-v",
                "-D",
                "-",
                "-o",
                "/dev/null",
                "--max-time",
                "10",
            ])
            .arg("--resolve")
            .arg(format!("{host}:{port}:127.0.0.1"))
            .args(args)
            .arg(format!("https://{host}:{port}/"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("curl ends")
    .expect("curl runs");
    (
        String::from_utf8_lossy(&out.stderr).to_ascii_lowercase(),
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase(),
    )
}

#[tokio::test]
async fn curl_gets_the_certificate_named_by_sni_over_tls12_and_tls13() {
    let pki = Pki::new();
    let default = pki.server("default", &["default.test"], None);
    let wildcard = pki.server("wildcard", &["*.example.com"], None);
    let api = pki.server("api", &["api.example.com"], None);
    let files = [
        (default.0.as_path(), default.1.as_path()),
        (wildcard.0.as_path(), wildcard.1.as_path()),
        (api.0.as_path(), api.1.as_path()),
    ];
    let (b, balancer) = tls_balancer(&files, "", "").await;
    let port = balancer.local_addrs()[0].port();
    let ca = pki.ca_path().display().to_string();
    for (host, cn) in [
        ("api.example.com", "cn=api"),
        ("www.example.com", "cn=wildcard"),
        ("default.test", "cn=default"),
    ] {
        for version in [
            ["--tlsv1.2", "--tls-max", "1.2"],
            ["--tlsv1.3", "--tls-max", "1.3"],
        ] {
            let mut args = vec!["--cacert", ca.as_str()];
            args.extend(version);
            let (verbose, head) = curl(host, port, &args).await;
            assert!(
                head.starts_with("http/2 200"),
                "{host} {version:?}: {verbose}"
            );
            assert!(head.contains("x-seen-proto: https"), "{head}");
            assert!(verbose.contains(cn), "{host} should get {cn}: {verbose}");
            let want = if version[0] == "--tlsv1.2" {
                "tlsv1.2"
            } else {
                "tlsv1.3"
            };
            assert!(
                verbose.contains(&format!("ssl connection using {want}")),
                "{verbose}"
            );
            assert!(verbose.contains("alpn: server accepted h2"), "{verbose}");
        }
    }
    // An unknown name gets the default certificate, which curl refuses unless told not to
    // verify (-k).
    let (verbose, head) = curl("unknown.test", port, &["--cacert", &ca]).await;
    assert!(head.is_empty(), "{verbose}");
    let (verbose, head) = curl("unknown.test", port, &["-k"]).await;
    assert!(head.starts_with("http/2 200"), "{verbose}");
    assert!(verbose.contains("cn=default"), "{verbose}");
    assert_eq!(b[0].traffic_hits(), 7);
}

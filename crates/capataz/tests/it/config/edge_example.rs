//! The edge example of docs/config.md (TLS, HTTP/2 and gRPC) loads as written, with its files:
//! the test writes the certificates, key, CA bundle and token it names into a temporary
//! directory and points the example's `/etc/capataz/` and `/var/log/capataz/` there.

use capataz::config::{check, load, AccessLogFormat, BackendProtocol, CheckKind};

use crate::support::backends_tls::Pki;

/// The TOML block between the edge example's markers.
fn edge_example() -> String {
    let doc = include_str!("../../../../../docs/config.md");
    let start = doc
        .find("<!-- edge-example:start -->")
        .expect("docs/config.md marks its edge example");
    let block = &doc[start..];
    let open = block.find("```toml\n").unwrap() + "```toml\n".len();
    let close = block[open..].find("```").unwrap();
    block[open..open + close].to_owned()
}

#[test]
fn the_edge_example_loads_with_its_certificates_and_has_no_warning() {
    let pki = Pki::new("edge-example");
    let (cert, _key) = pki.leaf_files("edge", &["edge.example"]);
    let dir = std::path::Path::new(&cert).parent().unwrap().to_owned();
    let ca = pki.ca_file();
    std::fs::rename(&ca, dir.join("internal-ca.pem")).unwrap();
    pki.write("admin-token", "edge-example-token-0123456789\n");
    let text = edge_example()
        .replace("/etc/capataz/", &format!("{}/", dir.display()))
        .replace("/var/log/capataz/", &format!("{}/", dir.display()));
    let path = dir.join("edge.toml");
    std::fs::write(&path, &text).unwrap();

    let config = load(&path).unwrap_or_else(|error| panic!("{error}\n---\n{text}"));
    let warnings = check(&config);
    assert!(warnings.is_empty(), "{warnings:?}");

    let edge = &config.listeners[0];
    let tls = edge.tls.as_ref().expect("the edge listener terminates TLS");
    assert!(tls.loaded.is_some(), "its certificate was loaded");
    assert_eq!(
        edge.access_log.as_ref().unwrap().format,
        AccessLogFormat::Json
    );
    let (cart, web) = (&config.pools[0], &config.pools[1]);
    assert_eq!((cart.name.as_str(), web.name.as_str()), ("cart", "web"));
    assert_eq!(cart.protocol, BackendProtocol::H2c);
    assert_eq!(cart.active.kind, CheckKind::Grpc);
    assert_eq!(cart.active.grpc_service, "shop.Cart");
    assert_eq!(web.protocol, BackendProtocol::H2);
    let web_tls = web.tls.as_ref().expect("the web pool speaks TLS");
    assert_eq!(web_tls.server_name.as_deref(), Some("web.internal"));
    assert!(web_tls.verify);
    assert!(!web_tls.roots.is_empty(), "the internal CA was loaded");
    assert_eq!(web.active.kind, CheckKind::Http);
}

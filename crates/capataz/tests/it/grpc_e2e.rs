//! gRPC end to end: a real gRPC client (Python's grpcio, `tests/support/grpc/client.py`)
//! calling through capataz, over an h2c listener and over a TLS listener agreeing on `h2` by
//! ALPN, to real gRPC servers behind an `h2c` pool. The answers' statuses travel in HTTP/2
//! trailers both ways; an UNAVAILABLE backend is ejected while calls keep being answered.

use capataz_health::State;

use crate::support::balancer::{start, ConfigText};
use crate::support::events::{transition_of, wait_for};
use crate::support::grpc;
use crate::support::tls::Pki;
use crate::support::DEADLINE;

use super::grpc::GrpcServer;

/// `client.py` making `calls` calls to `target`; each call's status name and answer.
async fn grpc_client(
    target: String,
    calls: usize,
    tls: Option<(String, &str)>,
) -> Vec<(String, String)> {
    let mut command = grpc::peer("client.py");
    command.arg(target).arg(calls.to_string());
    if let Some((ca, name)) = tls {
        command.arg(ca).arg(name);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the client task")
        .unwrap_or_else(|e| panic!("{e}: {}", grpc::missing()));
    assert!(
        output.status.success(),
        "the gRPC client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let (status, answer) = line.split_once(' ').unwrap_or((line, ""));
            (status.to_owned(), answer.to_owned())
        })
        .collect()
}

fn h2c_pool() -> String {
    "protocol = \"h2c\"\n[pools.web.active]\nkind = \"tcp\"\ninterval = \"100ms\"\n\
     [pools.web.passive]\nconsecutive_errors = 3\nejection_time = \"60s\"\n"
        .to_owned()
}

#[tokio::test]
async fn a_grpc_client_through_an_h2c_listener_gets_every_call_and_an_unavailable_backend_is_ejected(
) {
    let good = GrpcServer::start("good", None);
    let failing = GrpcServer::start("failing", Some("UNAVAILABLE"));
    let text = ConfigText::new(&[good.entry("good"), failing.entry("failing")])
        .listener("h2c = true")
        .extra(&h2c_pool())
        .build();
    let (balancer, mut events) = start(&text).await;
    let target = balancer.local_addrs()[0].to_string();
    let answers = grpc_client(target.clone(), 12, None).await;
    assert_eq!(answers.len(), 12);
    for (status, answer) in &answers {
        match status.as_str() {
            "OK" => assert!(answer.starts_with("good:m"), "{answer}"),
            "UNAVAILABLE" => {}
            other => panic!("unexpected status {other} in {answers:?}"),
        }
    }
    assert!(answers.iter().any(|(s, _)| s == "OK"));
    assert!(
        answers.iter().any(|(s, _)| s == "UNAVAILABLE"),
        "{answers:?}"
    );
    wait_for(&mut events, "the failing backend ejected", |event| {
        transition_of(event, "failing", State::Down).is_some()
    })
    .await;
    // Ejected: every call is answered by the good backend, its status from the trailers.
    let answers = grpc_client(target, 8, None).await;
    assert!(
        answers
            .iter()
            .all(|(s, a)| s == "OK" && a.starts_with("good:m")),
        "{answers:?}"
    );
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_grpc_client_over_tls_agrees_on_h2_and_gets_its_answers() {
    let good = GrpcServer::start("good", None);
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["grpc.test"], None);
    let text = ConfigText::new(&[good.entry("good")])
        .listener(&Pki::listener(&[(&cert, &key)], ""))
        .extra(&h2c_pool())
        .build();
    let (balancer, _events) = start(&text).await;
    let target = balancer.local_addrs()[0].to_string();
    let ca = pki.ca_path().display().to_string();
    let answers = grpc_client(target, 5, Some((ca, "grpc.test"))).await;
    let expected: Vec<(String, String)> = (0..5)
        .map(|i| ("OK".to_owned(), format!("good:m{i}")))
        .collect();
    assert_eq!(answers, expected);
    balancer.shutdown(DEADLINE).await;
}

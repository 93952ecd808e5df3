//! The `etcd` source with TLS and authentication, against a real etcd (Debian's etcd-server,
//! see `support/etcd_secure.rs`): over TLS with a client certificate (`--client-cert-auth`)
//! it follows puts; a reload to a wrong CA or without the client certificate fails with an
//! event naming the cause and keeps the membership, and a reload back to good files follows
//! again (new certificates count from the reload on). With authentication: the right password
//! follows puts; a wrong one fails with a clear event, follows nothing, and the password never
//! shows; tokens that expire (`--auth-token-ttl`) are got again without a failure, and tokens
//! revoked (a change of users moves etcd's auth revision) are got again when the watch is
//! opened again; the source keeps following.

use std::time::Duration;

use capataz::events::MembershipChange;
use capataz::health::Notice;
use capataz::server::Balancer;
use tokio::sync::broadcast;

use crate::etcd_source::{names, value, wait_change, wait_total};
use crate::support::backends_tls::Pki;
use crate::support::balancer::{backends, parse, start};
use crate::support::etcd::{Etcd, EtcdSettings};
use crate::support::etcd_secure::{enable_auth, start_tls, PASSWORD, USER};
use crate::support::wait::wait_until;

/// Pool `web` following `/web/` of `endpoint`, with `access` (more keys and tables of
/// `[pools.web.source]`) and a `keepalive`.
fn config(endpoint: &str, keepalive: &str, access: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.active]\nkind = \"none\"\n\n\
         [pools.web.source]\nkind = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"/web/\"\n\
         timeout = \"2s\"\nreconnect_min = \"100ms\"\nreconnect_max = \"300ms\"\n\
         keepalive = \"{keepalive}\"\n{access}\n"
    )
}

fn tls(ca: &str, identity: Option<(&str, &str)>) -> String {
    let mut table = format!("[pools.web.source.tls]\nca_file = \"{ca}\"\n");
    if let Some((cert, key)) = identity {
        table.push_str(&format!("cert = \"{cert}\"\nkey = \"{key}\"\n"));
    }
    table
}

fn count(balancer: &Balancer) -> usize {
    balancer.pool("web").expect("pool web").backends.len()
}

async fn failing(rx: &mut broadcast::Receiver<Notice>) -> (String, usize) {
    match wait_change(rx, "a failing event", |c| {
        matches!(c, MembershipChange::Failing { .. })
    })
    .await
    {
        MembershipChange::Failing { error, kept } => (error, kept),
        _ => unreachable!("matched above"),
    }
}

#[tokio::test]
async fn etcd_over_tls_with_a_client_certificate_follows_puts_and_bad_files_keep_the_membership() {
    let sims = backends(&["a", "b", "c"]).await;
    let (etcd, files) = start_tls("tls", &[]).await;
    assert!(etcd.endpoint().starts_with("https://"));
    etcd.put("/web/a", &value(&sims[0])).await;
    let good = config(
        &etcd.endpoint(),
        "1s",
        &tls(&files.ca, Some((&files.cert, &files.key))),
    );
    let (balancer, mut rx) = start(&good).await;
    wait_total(&mut rx, 1).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    wait_total(&mut rx, 2).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a", "b"]);

    // Another CA: etcd's certificate fails verification; the membership stays.
    let other = Pki::new("tls-other");
    let wrong_ca = config(
        &etcd.endpoint(),
        "1s",
        &tls(&other.ca_file(), Some((&files.cert, &files.key))),
    );
    balancer.reload(&parse(&wrong_ca)).await.expect("reload");
    let (error, kept) = failing(&mut rx).await;
    assert_eq!(kept, 2, "{error}");
    assert!(error.starts_with(&etcd.endpoint()), "{error}");
    assert!(
        error.contains("TLS handshake") && error.contains("UnknownIssuer"),
        "{error}"
    );
    etcd.put("/web/c", &value(&sims[2])).await;
    assert_eq!(count(&balancer), 2);

    // The right files again: the change made meanwhile arrives (a reload starts the source
    // afresh from the membership in force, so no `restored` event: an update).
    balancer.reload(&parse(&good)).await.expect("reload");
    wait_total(&mut rx, 3).await;
    assert!(balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .failing
        .is_none());

    // No client certificate: etcd (`--client-cert-auth`) refuses the connection.
    let anonymous = config(&etcd.endpoint(), "1s", &tls(&files.ca, None));
    balancer.reload(&parse(&anonymous)).await.expect("reload");
    let (error, kept) = failing(&mut rx).await;
    assert_eq!(kept, 3, "{error}");
    assert!(error.starts_with(&etcd.endpoint()), "{error}");
    assert!(
        error.contains("BadCertificate") && error.contains("tls.cert"),
        "{error}"
    );
    assert_eq!(count(&balancer), 3);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_with_authentication_follows_puts_and_a_wrong_password_follows_nothing() {
    let sims = backends(&["a", "b"]).await;
    let mut etcd = Etcd::start("auth").await;
    enable_auth(&mut etcd, "/web/").await;
    etcd.put("/web/a", &value(&sims[0])).await;

    // A wrong password: a failure that says so (and not the password), and an empty pool.
    let wrong = config(
        &etcd.endpoint(),
        "1s",
        &format!("username = \"{USER}\"\npassword = \"not-the-password-e1\"\n"),
    );
    let (balancer, mut rx) = start(&wrong).await;
    let (error, kept) = failing(&mut rx).await;
    assert_eq!(kept, 0);
    assert!(
        error.contains(&format!("authenticating as {USER:?}"))
            && error.contains("authentication failed"),
        "{error}"
    );
    assert!(!error.contains("not-the-password-e1"), "{error}");
    // The source goes on trying (every 100-300 ms) and follows nothing meanwhile.
    etcd.put("/web/b", &value(&sims[1])).await;
    let followed = tokio::time::timeout(
        Duration::from_secs(1),
        wait_change(&mut rx, "an update", |c| {
            matches!(c, MembershipChange::Updated { .. })
        }),
    )
    .await;
    assert!(
        followed.is_err(),
        "followed with a wrong password: {followed:?}"
    );
    assert_eq!(count(&balancer), 0);
    assert!(balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .failing
        .is_some());

    // The right password (from a file): both keys, then the next put.
    let pki = Pki::new("auth-password");
    let password_file = pki.write("etcd-password", &format!("{PASSWORD}\n"));
    let right = config(
        &etcd.endpoint(),
        "1s",
        &format!("username = \"{USER}\"\npassword_file = \"{password_file}\"\n"),
    );
    balancer.reload(&parse(&right)).await.expect("reload");
    wait_total(&mut rx, 2).await;
    etcd.delete("/web/a").await;
    wait_total(&mut rx, 1).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["b"]);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_tokens_that_expire_are_got_again_without_a_failure() {
    let sims = backends(&["a", "b"]).await;
    // Tokens live 1 s without use; the keepalive check comes after 3 s of silence, so each
    // check carries a token etcd has dropped.
    let mut etcd = Etcd::start_with(
        "token",
        EtcdSettings {
            flags: vec!["--auth-token-ttl=1".into()],
            ..EtcdSettings::default()
        },
    )
    .await;
    enable_auth(&mut etcd, "/web/").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    let text = config(
        &etcd.endpoint(),
        "3s",
        &format!("username = \"{USER}\"\npassword = \"{PASSWORD}\"\n"),
    );
    let (balancer, mut rx) = start(&text).await;
    wait_total(&mut rx, 1).await;
    let pool = || balancer.pool("web").expect("pool web");
    let confirmed = || pool().source_record.state().confirmed;
    // Two keepalive checks pass, each after its token expired.
    for _ in 0..2 {
        let before = confirmed();
        wait_until("a keepalive check that passes", || confirmed() != before).await;
    }
    while let Ok(event) = rx.try_recv() {
        if let Notice::Membership { change, .. } = &event {
            assert!(
                !matches!(change, MembershipChange::Failing { .. }),
                "an expired token failed the source: {change:?}"
            );
        }
    }
    assert!(pool().source_record.state().failing.is_none());
    etcd.put("/web/b", &value(&sims[1])).await;
    wait_total(&mut rx, 2).await;

    assert_eq!(names(&pool()), vec!["a", "b"]);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_tokens_revoked_by_a_change_of_users_are_got_again_when_the_watch_reopens() {
    let sims = backends(&["a", "b"]).await;
    let mut etcd = Etcd::start("revoked").await;
    enable_auth(&mut etcd, "/web/").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    // No keepalive check in the test's time: only the watch uses the token.
    let text = config(
        &etcd.endpoint(),
        "60s",
        &format!("username = \"{USER}\"\npassword = \"{PASSWORD}\"\n"),
    );
    let (balancer, mut rx) = start(&text).await;
    wait_total(&mut rx, 1).await;
    // A change of users and roles moves etcd's auth revision: every token given before is
    // refused from now on (the running watch goes on: etcd checks a watch when it starts).
    etcd.must(&["role", "add", "another"]).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    wait_total(&mut rx, 2).await;
    // The watch cut: it is opened again, etcd refuses the old token, the source gets another.
    etcd.restart().await;
    failing(&mut rx).await;
    wait_change(&mut rx, "a restored event", |c| {
        matches!(c, MembershipChange::Restored { kept: 2 })
    })
    .await;
    etcd.delete("/web/a").await;
    wait_total(&mut rx, 1).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["b"]);
    balancer.shutdown(Duration::from_secs(5)).await;
}

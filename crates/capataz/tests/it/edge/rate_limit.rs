//! A route's `rate_limit`: a burst, then tokens at the rate; 429 with `Retry-After` over the
//! limit, never reaching a backend; counted, logged, and kept per key.

use std::time::Instant;

use bytes::Bytes;

use super::*;
use crate::support::access_log::{self, LogDir};
use crate::support::balancer::metrics_text;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// The value of the series of `name` whose labels contain `labels`, in `text`.
fn series(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(name) && line.contains(labels))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn a_burst_then_the_rate_over_the_limit_is_429_and_never_reaches_a_backend() {
    let b = backends(&["a"]).await;
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let listener = format!(
        "{}\n  [[listeners.routes]]\n  path_prefix = \"/api\"\n  pool = \"web\"\n  \
         rate_limit = {{ key = \"client_ip\", rate = 4, per = \"1s\", burst = 5 }}\n\n  \
         [[listeners.routes]]\n  pool = \"web\"\n",
        access_log::table(&log, "text", "")
    );
    let text = ConfigText::sims(&b)
        .listener(&listener)
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);

    // 30 requests as fast as they go: the burst of 5, plus 4 per second of the time taken.
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let answer = client.get("/api/x").await;
        if answer.status == 429 {
            assert_eq!(answer.headers["retry-after"], "1", "a token within 250 ms");
            assert_eq!(answer.backend, None);
        }
        statuses.push(answer.status);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(ok + limited, 30, "{statuses:?}");
    assert!(statuses[..5].iter().all(|&s| s == 200), "{statuses:?}");
    let most = 5 + (4.0 * elapsed).ceil() as usize;
    assert!((5..=most).contains(&ok), "{ok} allowed in {elapsed:.3}s");
    // Only allowed requests reached the backend.
    assert_eq!(b[0].traffic_hits() as usize, ok);
    // A route without a limit is not limited.
    for _ in 0..10 {
        assert_eq!(client.get("/other").await.status, 200);
    }

    // The refill: after a refusal, the next token comes within a quarter second (polled,
    // refused polls take nothing), and not long before.
    while client.get("/api/x").await.status == 200 {}
    let refused_at = Instant::now();
    let mut polls = 0;
    loop {
        polls += 1;
        if client.get("/api/x").await.status == 200 {
            break;
        }
        assert!(refused_at.elapsed() < DEADLINE, "no token came back");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // One token per 250 ms; the rest is slack for a loaded machine.
    let waited = refused_at.elapsed().as_secs_f64();
    assert!(waited <= 0.25 + 2.0, "waited {waited:.3}s ({polls} polls)");

    // Counted and logged as capataz's, with the reason.
    let refused = statuses.iter().filter(|&&s| s == 429).count() as f64;
    let metrics = metrics_text(&balancer);
    let counted = series(&metrics, "capataz_rate_limited_total", "route=\"/api\"").unwrap();
    assert!(
        counted >= refused + 1.0,
        "{counted} counted, {refused}+ refused"
    );
    wait_until("the log has the requests", || {
        access_log::lines(&log)
            .iter()
            .filter(|l| l.contains(" 429 "))
            .count() as f64
            >= counted
    })
    .await;
    let lines = access_log::lines(&log);
    let line = lines.iter().find(|l| l.contains(" 429 ")).unwrap();
    assert!(
        line.contains("attempts=0 ended_by=capataz phase=request")
            && line.ends_with("reason=rate_limited"),
        "{line}"
    );
    assert!(lines
        .iter()
        .filter(|l| l.contains(" 200 "))
        .all(|l| l.ends_with("reason=-")));
}

#[tokio::test]
async fn a_header_key_gives_each_value_its_bucket_and_a_request_without_it_its_address() {
    let b = backends(&["a"]).await;
    let listener = "\n  [[listeners.routes]]\n  pool = \"web\"\n  \
         rate_limit = { key = \"header:X-Api-Key\", rate = 1, per = \"1h\", burst = 2 }\n";
    let text = ConfigText::sims(&b)
        .listener(listener)
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let long = "k".repeat(8000);
    for (key, expected) in [
        (Some("alice"), [200, 200, 429]),
        (Some("bob"), [200, 200, 429]),
        // A very long value is a key like any other.
        (Some(long.as_str()), [200, 200, 429]),
        // Without the header: the client's address.
        (None, [200, 200, 429]),
        (Some("alice"), [429, 429, 429]),
    ] {
        let mut got = Vec::new();
        for _ in 0..3 {
            let mut request = http::Request::get("/").header("host", "t");
            if let Some(key) = key {
                request = request.header("x-api-key", key);
            }
            got.push(
                client
                    .request(request.body(Bytes::new()).unwrap())
                    .await
                    .status,
            );
        }
        assert_eq!(got, expected, "{:?}", key.map(|k| &k[..k.len().min(8)]));
    }
    assert_eq!(b[0].traffic_hits(), 8);
}

#[tokio::test]
async fn a_reload_keeps_an_unchanged_limits_buckets_and_a_changed_limit_starts_afresh() {
    let b = backends(&["a", "b"]).await;
    let route = |limit: &str| {
        format!("\n  [[listeners.routes]]\n  pool = \"web\"\n  rate_limit = {{ {limit} }}\n")
    };
    let config = |limit: &str, backends: &[capataz::sim::SimBackend]| {
        ConfigText::sims(backends)
            .listener(&route(limit))
            .extra("[pools.web.active]\nkind = \"none\"\n")
            .build()
    };
    let once_an_hour = "key = \"client_ip\", rate = 1, per = \"1h\", burst = 2";
    let (balancer, _rx) = start(&config(once_an_hour, &b[..1])).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    assert_eq!(two(&mut client).await, [200, 200]);
    // A reload that adds a backend: the same limit, the same (empty) bucket.
    let parsed = crate::support::balancer::parse(&config(once_an_hour, &b));
    balancer.reload(&parsed).await.expect("reload");
    assert_eq!(two(&mut client).await, [429, 429]);
    // A changed limit starts afresh.
    let changed = "key = \"client_ip\", rate = 1, per = \"1h\", burst = 3";
    let parsed = crate::support::balancer::parse(&config(changed, &b));
    balancer.reload(&parsed).await.expect("reload");
    assert_eq!(two(&mut client).await, [200, 200]);
}

/// The statuses of two requests.
async fn two(client: &mut Client) -> [u16; 2] {
    [client.get("/").await.status, client.get("/").await.status]
}

#[tokio::test]
async fn the_limit_applies_before_the_pool_even_with_every_backend_down() {
    use capataz::health::Notice;
    use capataz::sim::Mode;
    let b = backends(&["a"]).await;
    let listener = "\n  [[listeners.routes]]\n  pool = \"web\"\n  \
         rate_limit = { key = \"client_ip\", rate = 1, per = \"1h\", burst = 2 }\n";
    let pool = format!("when_all_down = \"reject\"\n{FAST_CHECKS}");
    let text = ConfigText::sims(&b).listener(listener).extra(&pool).build();
    let (balancer, mut rx) = start(&text).await;
    b[0].set_health(Mode::Status(503));
    wait_for(&mut rx, "all down", |e| matches!(e, Notice::AllDown { .. })).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    // Within the limit: the pool's 503; past it: 429, the pool never asked.
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(client.get("/").await.status);
    }
    assert_eq!(got, [503, 503, 429, 429]);
    let metrics = metrics_text(&balancer);
    assert_eq!(
        series(&metrics, "capataz_rejected_total", "pool=\"web\""),
        Some(2.0)
    );
    assert_eq!(
        series(&metrics, "capataz_rate_limited_total", "route=\"/\""),
        Some(2.0)
    );
}

/// Regression: `key = "header:host"` read the `Host` field only, which an HTTP/2 request does
/// not have (its host is `:authority`), so every HTTP/2 client shared its address's bucket
/// whatever host it asked for. The authority is the host now, over HTTP/2 as over HTTP/1.1.
#[tokio::test]
async fn a_host_key_reads_an_http2_requests_authority() {
    use crate::support::h2client;

    let b = backends(&["a"]).await;
    let listener = "h2c = true\n\n  [[listeners.routes]]\n  pool = \"web\"\n  \
         rate_limit = { key = \"header:host\", rate = 1, per = \"1h\", burst = 2 }\n";
    let text = ConfigText::sims(&b)
        .listener(listener)
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let mut h2 = h2client::connect(balancer.local_addrs()[0]).await;
    for (host, expected) in [("a.test", [200, 200, 429]), ("b.test", [200, 200, 429])] {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(h2.get(host, "/").await.status);
        }
        assert_eq!(got, expected, "{host}");
    }
    // Over HTTP/1.1, the same host is the same bucket.
    let mut client = Client::new(balancer.local_addrs()[0]);
    let request = http::Request::get("/").header("host", "a.test");
    let answer = client.request(request.body(Bytes::new()).unwrap()).await;
    assert_eq!(answer.status, 429);
}

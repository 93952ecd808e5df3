//! The client side's series, counted exactly: requests by route, method, class and who
//! answered (hyper's own 400 included), their durations, connections, bytes, reloads, the
//! build and the process; and the format each scraper gets.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{busy, exchange, scrape};
use crate::support;
use crate::support::balancer::{backends, start, ConfigText};
use crate::support::wait::until_ok;
use crate::support::DEADLINE;

/// How often a scrape is asked again while a count is not there yet.
const EVERY: Duration = Duration::from_millis(20);

/// The value of the sample line `series` (name and labels, exactly as written) in `text`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

fn requests(route: &str, pool: &str, method: &str, class: &str, by: &str) -> String {
    format!(
        "capataz_client_requests_total{{listener=\"front\",route=\"{route}\",pool=\"{pool}\",\
         method=\"{method}\",class=\"{class}\",answered_by=\"{by}\"}}"
    )
}

#[tokio::test]
async fn client_requests_are_counted_by_route_method_class_and_who_answered() {
    let busy = busy().await;
    let (_, page) = scrape(busy.admin, None).await;
    let count =
        |series: String| value(&page, &series).unwrap_or_else(|| panic!("{series}\n{page}"));
    assert_eq!(
        count(requests("/api/", "web", "GET", "2xx", "backend")),
        4.0
    );
    assert_eq!(
        count(requests("/api/", "web", "POST", "2xx", "backend")),
        1.0
    );
    // No route: capataz's 404.
    assert_eq!(count(requests("", "", "GET", "4xx", "capataz")), 1.0);
    // The backend refused the connection: capataz's 502.
    assert_eq!(
        count(requests("/dead/", "dead", "GET", "5xx", "capataz")),
        1.0
    );
    // A malformed head, answered 400 by hyper before any route or method was read.
    assert_eq!(count(requests("", "", "other", "4xx", "capataz")), 1.0);
    let total: f64 = page
        .lines()
        .filter(|l| l.starts_with("capataz_client_requests_total{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert_eq!(total, 8.0, "no other request counted:\n{page}");
    // Every answer the proxy wrote is timed; hyper's own 400 is not.
    let timed = "capataz_client_request_duration_seconds_count{listener=\"front\"}";
    assert_eq!(count(timed.into()), 7.0);
    let inf = "capataz_client_request_duration_seconds_bucket{listener=\"front\",le=\"+Inf\"}";
    assert_eq!(count(inf.into()), 7.0);
    assert_eq!(
        count("capataz_client_connections_accepted_total{listener=\"front\"}".into()),
        8.0
    );
    assert_eq!(
        count("capataz_config_reloads_total{result=\"success\"}".into()),
        1.0
    );
    assert_eq!(
        count("capataz_config_reloads_total{result=\"failure\"}".into()),
        1.0
    );
    assert_eq!(
        count(format!(
            "capataz_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert!(count("capataz_alerts_failed_total{hook=\"command\"}".into()) >= 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let stamp = count("capataz_config_last_reload_success_timestamp_seconds".into());
    assert!(
        stamp <= now && stamp > now - DEADLINE.as_secs_f64() * 3.0,
        "{stamp} {now}"
    );
    if cfg!(target_os = "linux") {
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(count(name.into()) > 0.0, "{name}");
        }
    }
}

#[tokio::test]
async fn connections_and_bytes_are_counted_per_listener() {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .listener("name = \"bytes\"")
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let proxy = balancer.local_addrs()[0];
    let admin = balancer.admin_addr().unwrap();
    let request = b"GET /x HTTP/1.1\r\nHost: capataz\r\nConnection: close\r\n\r\n";
    let answer = support::raw::raw_roundtrip(proxy, request).await;
    assert_eq!(support::raw::status_of(&answer), Some(200));
    // Counted when the connection ends, which the server sees after the client does.
    let received = "capataz_client_received_bytes_total{listener=\"bytes\"}";
    let sent = "capataz_client_sent_bytes_total{listener=\"bytes\"}";
    let open = "capataz_client_connections_open{listener=\"bytes\"}";
    let page = until_ok("the connection counted closed", EVERY, async || {
        let (_, page) = scrape(admin, None).await;
        match value(&page, open) {
            Some(0.0) => Ok(page),
            _ => Err(format!("the connection stayed open:\n{page}")),
        }
    })
    .await;
    assert_eq!(value(&page, received), Some(request.len() as f64), "{page}");
    assert_eq!(value(&page, sent), Some(answer.len() as f64), "{page}");
    assert_eq!(
        value(
            &page,
            "capataz_client_connections_accepted_total{listener=\"bytes\"}"
        ),
        Some(1.0)
    );
    // A connection counts as open while it is.
    let _idle = tokio::net::TcpStream::connect(proxy).await.unwrap();
    until_ok("an open connection", EVERY, async || {
        let (_, page) = scrape(admin, None).await;
        match value(&page, open) {
            Some(1.0) => Ok(()),
            _ => Err(format!("no open connection:\n{page}")),
        }
    })
    .await;
}

/// Polls `admin`'s `/metrics` until `series` has `want`.
async fn wait_for_value(admin: std::net::SocketAddr, series: &str, want: f64) {
    until_ok(&format!("{series} at {want}"), EVERY, async || {
        let (_, page) = scrape(admin, None).await;
        match value(&page, series) {
            Some(v) if v == want => Ok(()),
            _ => Err(format!("{series} never {want}:\n{page}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_quiet_keep_alive_connection_counts_as_parked_until_it_closes() {
    let b = backends(&["a"]).await;
    // A watcher period of 250 ms: a connection parks within about half a second of its answer.
    let text = ConfigText::sims(&b)
        .admin("")
        .listener("name = \"kept\"\nheader_read_timeout = \"1s\"")
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let admin = balancer.admin_addr().unwrap();
    let parked = "capataz_client_connections_parked{listener=\"kept\"}";
    let (_, page) = scrape(admin, None).await;
    assert_eq!(value(&page, parked), Some(0.0), "{page}");
    let mut stream = tokio::net::TcpStream::connect(balancer.local_addrs()[0])
        .await
        .unwrap();
    let mut buf = Vec::new();
    stream
        .write_all(b"GET /x HTTP/1.1\r\nHost: capataz\r\n\r\n")
        .await
        .unwrap();
    let reply = support::raw::read_reply(&mut stream, &mut buf).await;
    assert_eq!(reply.map(|r| r.status), Some(200));
    wait_for_value(admin, parked, 1.0).await;
    assert_eq!(balancer.parked_connections(), 1);
    // Closed by the client: no longer parked, nor open.
    drop(stream);
    wait_for_value(admin, parked, 0.0).await;
    wait_for_value(
        admin,
        "capataz_client_connections_open{listener=\"kept\"}",
        0.0,
    )
    .await;
}

#[tokio::test]
async fn metrics_are_open_metrics_only_for_who_asks() {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let admin = balancer.admin_addr().unwrap();
    assert_eq!(
        exchange(balancer.local_addrs()[0], "GET", "/", &[])
            .await
            .status,
        200
    );

    let (content_type, classic) = scrape(admin, None).await;
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!classic.contains("# EOF"));
    assert!(
        classic.contains("# TYPE capataz_requests_total counter\n"),
        "{classic}"
    );

    // What Prometheus 2 sends.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                      version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (content_type, open) = scrape(admin, Some(prometheus)).await;
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(open.ends_with("# EOF\n"));
    assert!(open.contains("# TYPE capataz_requests counter\n"), "{open}");

    let (content_type, _) = scrape(admin, Some("text/plain;version=0.0.4")).await;
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let answer = exchange(admin, "GET", "/metrics", &[]).await;
    assert_eq!(answer.headers.get("vary").unwrap(), "Accept");
}

/// hyper answers a head over the limit itself (431), before the proxy sees it: still counted,
/// as capataz's own answer to a request no route took.
#[tokio::test]
async fn a_head_over_the_limit_is_counted_as_capatazs_own_4xx() {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .listener("name = \"front\"")
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let proxy = balancer.local_addrs()[0];
    let big = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(40_000)
    );
    let answer = support::raw::raw_roundtrip(proxy, big.as_bytes()).await;
    assert_eq!(support::raw::status_of(&answer), Some(431));
    let series = requests("", "", "other", "4xx", "capataz");
    let admin = balancer.admin_addr().unwrap();
    let page = until_ok("the request counted", EVERY, async || {
        let (_, page) = scrape(admin, None).await;
        match value(&page, &series) {
            Some(1.0) => Ok(page),
            _ => Err(format!("not counted:\n{page}")),
        }
    })
    .await;
    assert!(
        !page.contains("answered_by=\"backend\""),
        "nothing reached the backend:\n{page}"
    );
}

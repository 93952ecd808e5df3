//! Section 9: the least-request algorithm.

use super::*;

#[tokio::test]
async fn least_request_sends_most_traffic_to_the_fast_backend() {
    let b = backends(&["slow", "fast"]).await;
    // With both backends as the two choices, each request goes to the one with fewer in
    // flight, so the slow one's share is about the fast one's latency over its own. At 100 ms
    // that was 20 to 25 % under load (the fast one answering in 20 to 25 ms; 9 of 27 runs
    // failed, three copies of several modules at once); at 500 ms it stays near 5 %.
    b[0].set_traffic(Mode::Delay(Duration::from_millis(500), 200));
    let extra = format!("algorithm = \"least_request\"\n{QUIET}");
    let (balancer, _rx) = start(&config_text(&sims(&b), "", &extra)).await;
    let addr = balancer.local_addrs()[0];
    let mut tasks = Vec::new();
    for _ in 0..8 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(addr);
            for _ in 0..50 {
                assert_eq!(client.get("/").await.status, 200);
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    let (slow, fast) = (b[0].traffic_hits(), b[1].traffic_hits());
    assert_eq!(slow + fast, 400);
    // Round robin would give each 200.
    assert!(slow * 5 < slow + fast, "slow {slow}, fast {fast}");
}

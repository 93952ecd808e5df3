//! Following a churning etcd prefix without falling behind, against a real
//! etcd (`support/etcd.rs`): a membership update keeps the backends that stay whole (the same
//! runtime, the same probe schedule and due time) and frees the pool's old build, and the changes
//! that arrive while an update is applied are applied together as one update, in order, each
//! `updated` event saying what its update did.

use std::sync::Arc;

use capataz::config;
use capataz::events::MembershipChange;
use capataz::health::Notice;
use capataz::server::Balancer;
use tokio::sync::broadcast;

use crate::etcd_source::{membership, names, value, wait_total};
use crate::support::balancer::{backends, start};
use crate::support::etcd::Etcd;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// Pool `web` following prefix `/web/` of `etcd`, probed with `checks`.
fn config_text(etcd: &Etcd, checks: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.source]\nkind = \"etcd\"\n\
         endpoints = [\"{}\"]\nprefix = \"/web/\"\ntimeout = \"1s\"\nreconnect_min = \"100ms\"\n\
         reconnect_max = \"300ms\"\nkeepalive = \"1s\"\nconfirm_after = \"500ms\"\n\
         [pools.web.active]\n{checks}\n",
        etcd.endpoint()
    )
}

/// Regression (churn): each etcd change rebuilt the pool and restarted the probe
/// task of every backend (a new random phase each), and old builds of a 5,000-backend pool
/// piled up in memory. A backend that stays is now the same runtime with the same probe
/// schedule (its next probe due when it was), a removed one is freed, and so is the old build.
#[tokio::test]
async fn etcd_an_update_keeps_the_backends_that_stay_and_frees_the_old_build() {
    let sims = backends(&["a", "b", "c"]).await;
    let etcd = Etcd::start("churn-keep").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    // Probes an hour apart: a probe never moves a due time during the test.
    let (balancer, mut rx) = start(&config_text(
        &etcd,
        "interval = \"1h\"\ntimeout = \"200ms\"\nrise = 1\n",
    ))
    .await;
    wait_total(&mut rx, 2).await;
    let first = balancer.pool("web").expect("pool web");
    wait_until("the first due times", || {
        (0..first.backends.len()).all(|i| first.next_probe(i).is_some())
    })
    .await;
    let a = first.backends[0].clone();
    let b = first.backends[1].clone();
    let due = first.next_probe(0);
    let old = Arc::downgrade(&first);
    drop(first);

    etcd.put("/web/c", &value(&sims[2])).await;
    assert_eq!(
        wait_total(&mut rx, 3).await,
        MembershipChange::Updated {
            added: 1,
            removed: 0,
            total: 3
        }
    );
    let second = balancer.pool("web").expect("pool web");
    assert!(Arc::ptr_eq(&second.backends[0], &a), "a was rebuilt");
    assert_eq!(second.next_probe(0), due, "a's probe schedule restarted");
    wait_until("the old build freed", || old.strong_count() == 0).await;

    etcd.delete("/web/b").await;
    wait_total(&mut rx, 2).await;
    let third = balancer.pool("web").expect("pool web");
    assert_eq!(names(&third), vec!["a", "c"]);
    assert!(Arc::ptr_eq(&third.backends[0], &a), "a was rebuilt");
    assert!(
        Arc::ptr_eq(&third.backends[1], &second.backends[2]),
        "c was rebuilt"
    );
    assert_eq!(third.next_probe(0), due, "a's probe schedule restarted");
    let old = Arc::downgrade(&second);
    drop(second);
    drop(third);
    wait_until("the removed backend freed", || Arc::strong_count(&b) == 1).await;
    wait_until("the old build freed", || old.strong_count() == 0).await;
    balancer.shutdown(std::time::Duration::from_secs(5)).await;
}

/// Waits until the membership task has read another answer from etcd (its record's
/// `confirmed` moved past `last`); returns the new value.
async fn next_read(
    balancer: &Balancer,
    last: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    let pool = balancer.pool("web").expect("pool web");
    wait_until("the source's next answer", || {
        pool.source_record.state().confirmed != last
    })
    .await;
    pool.source_record.state().confirmed
}

/// The `updated` events up to and including the one with `total` backends.
async fn updates_until(
    rx: &mut broadcast::Receiver<Notice>,
    total: usize,
) -> Vec<MembershipChange> {
    let mut seen = Vec::new();
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let event = match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Ok(event)) => event,
            Ok(Err(broadcast::error::RecvError::Lagged(n))) => panic!("lost {n} events"),
            Ok(Err(e)) => panic!("event stream ended: {e}"),
            Err(_) => panic!("no update to {total} within {DEADLINE:?}; saw {seen:?}"),
        };
        if let Some(change @ MembershipChange::Updated { total: t, .. }) = membership(&event) {
            seen.push(change.clone());
            if *t == total {
                return seen;
            }
        }
    }
}

/// A balancer following `/web/` of `etcd` (no probes), started from a file so that it can
/// reload, once its first update (to `total` backends) is in force.
#[cfg(target_os = "linux")]
async fn from_file(
    etcd: &Etcd,
    tag: &str,
    total: usize,
) -> (Balancer, broadcast::Receiver<Notice>, std::path::PathBuf) {
    let path =
        std::env::temp_dir().join(format!("capataz-churn-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, config_text(etcd, "kind = \"none\"\n")).expect("write config");
    let config = config::load(&path).expect("valid config");
    let (events, mut rx) = broadcast::channel(4096);
    let balancer = Balancer::start_with_path(&config, events, Some(path.clone()))
        .await
        .expect("balancer starts");
    wait_total(&mut rx, total).await;
    (balancer, rx, path)
}

/// A reload that holds the supervisor (so every membership update waits) while it reads its
/// config, which `path` becomes: a FIFO nobody writes yet. [`release`] lets it go.
#[cfg(target_os = "linux")]
async fn hold_updates(balancer: &Balancer, path: &std::path::Path) -> Held {
    use std::os::unix::fs::OpenOptionsExt;

    std::fs::remove_file(path).expect("remove config");
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let supervisor = balancer.supervisor().clone();
    let reload = tokio::spawn(async move { supervisor.reload_from_file().await });
    let mut writer = None;
    wait_until("the reload reading its FIFO", || {
        writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(0o4000) // O_NONBLOCK: opens once the reload is reading
            .open(path)
            .ok();
        writer.is_some()
    })
    .await;
    Held {
        reload,
        writer: writer.expect("the FIFO's write end"),
        path: path.to_owned(),
    }
}

/// A reload holding the membership updates back.
#[cfg(target_os = "linux")]
struct Held {
    reload: tokio::task::JoinHandle<
        Result<capataz::server::ReloadSummary, capataz::server::StartError>,
    >,
    writer: std::fs::File,
    path: std::path::PathBuf,
}

/// Fails the held reload (its file is not TOML): the updates go on.
#[cfg(target_os = "linux")]
async fn release(held: Held) {
    use std::io::Write;

    let Held {
        reload,
        mut writer,
        path,
    } = held;
    writer.write_all(b"not [toml").expect("write the FIFO");
    drop(writer);
    assert!(reload.await.expect("reload task").is_err());
    let _ = std::fs::remove_file(&path);
}

/// Regression (churn): each watch event was applied as its own update, so a burst
/// of 20 puts into a 5,000-backend pool took 20 rebuilds (114 s) to be in force. Now the
/// changes read while an update waits or runs are merged, and applied as one update. Here an
/// update is held (the supervisor applies a reload, stuck reading its FIFO) while four more
/// changes arrive: they come as one update, after the held one, with the right counts.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn etcd_changes_read_while_an_update_waits_are_applied_as_one_update() {
    let sims = backends(&["a", "b", "c", "d", "e", "f"]).await;
    let etcd = Etcd::start("churn-burst").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    let (balancer, mut rx, path) = from_file(&etcd, "burst", 1).await;
    let mut read = balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .confirmed;
    let held = hold_updates(&balancer, &path).await;

    // b's update waits for the reload; c, d and e come, a goes, meanwhile.
    etcd.put("/web/b", &value(&sims[1])).await;
    read = next_read(&balancer, read).await;
    for (key, sim) in [
        ("/web/c", &sims[2]),
        ("/web/d", &sims[3]),
        ("/web/e", &sims[4]),
    ] {
        etcd.put(key, &value(sim)).await;
        read = next_read(&balancer, read).await;
    }
    etcd.delete("/web/a").await;
    next_read(&balancer, read).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a"]);
    release(held).await;

    assert_eq!(
        updates_until(&mut rx, 4).await,
        vec![
            MembershipChange::Updated {
                added: 1,
                removed: 0,
                total: 2
            },
            MembershipChange::Updated {
                added: 3,
                removed: 1,
                total: 4
            },
        ]
    );
    assert_eq!(
        names(&balancer.pool("web").expect("pool")),
        vec!["b", "c", "d", "e"]
    );
    // Nothing else was pending: the next change is an update of its own.
    etcd.put("/web/f", &value(&sims[5])).await;
    assert_eq!(
        updates_until(&mut rx, 5).await,
        vec![MembershipChange::Updated {
            added: 1,
            removed: 0,
            total: 5
        }]
    );
    balancer.shutdown(std::time::Duration::from_secs(5)).await;
}

/// The drop guard judges a merged update as a whole: deletes that one by one stay within
/// `max_drop_percent` (50 %), read while an update waits, are one drop of two thirds of the
/// pool, held until a second read confirms it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn etcd_deletes_merged_into_one_update_are_one_drop_for_the_guard() {
    let sims = backends(&["a", "b", "c", "d"]).await;
    let etcd = Etcd::start("churn-drop").await;
    for (key, sim) in ["/web/a", "/web/b", "/web/c", "/web/d"].iter().zip(&sims) {
        etcd.put(key, &value(sim)).await;
    }
    let (balancer, mut rx, path) = from_file(&etcd, "drop", 4).await;
    let mut read = balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .confirmed;
    let held = hold_updates(&balancer, &path).await;
    // b's removal (a quarter) waits; c's and d's (a third, then a half, one by one) come
    // meanwhile.
    for key in ["/web/b", "/web/c", "/web/d"] {
        etcd.delete(key).await;
        read = next_read(&balancer, read).await;
    }
    release(held).await;

    assert_eq!(
        wait_total(&mut rx, 3).await,
        MembershipChange::Updated {
            added: 0,
            removed: 1,
            total: 3
        }
    );
    let held = crate::etcd_source::wait_change(&mut rx, "the drop held", |c| {
        matches!(
            c,
            MembershipChange::DropHeld { .. } | MembershipChange::Updated { .. }
        )
    })
    .await;
    assert_eq!(held, MembershipChange::DropHeld { from: 3, to: 1 });
    assert_eq!(
        names(&balancer.pool("web").expect("pool")),
        vec!["a", "c", "d"]
    );
    // The source reads the prefix again after `confirm_after`: confirmed, then applied.
    assert_eq!(
        crate::etcd_source::wait_change(&mut rx, "the drop confirmed", |c| {
            !matches!(c, MembershipChange::Skipped { .. })
        })
        .await,
        MembershipChange::DropConfirmed { from: 3, to: 1 }
    );
    assert_eq!(
        wait_total(&mut rx, 1).await,
        MembershipChange::Updated {
            added: 0,
            removed: 2,
            total: 1
        }
    );
    balancer.shutdown(std::time::Duration::from_secs(5)).await;
}

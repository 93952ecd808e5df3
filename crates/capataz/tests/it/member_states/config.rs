//! The keys of the eligibility states: defaults, values, errors and the foot-gun warning.

use capataz::config::{check, parse_str};
use capataz_health::{BackupUse, MinHealthy};

const BASE: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web]\n";

fn parse(pool: &str) -> Result<capataz::config::Config, String> {
    parse_str(&format!("{BASE}{pool}\n"), "config.toml").map_err(|e| e.to_string())
}

const TWO: &str = "backends = [{ name = \"a\", address = \"127.0.0.1:9001\" }, \
                   { name = \"b\", address = \"127.0.0.1:9002\", backup = true }]";

#[test]
fn the_new_keys_default_to_todays_behaviour() {
    let config = parse("backends = [{ address = \"127.0.0.1:9001\" }]").expect("valid");
    let pool = &config.pools[0];
    assert!(!pool.backends[0].backup);
    assert_eq!(pool.backups, BackupUse::First);
    assert_eq!(
        pool.min_healthy,
        MinHealthy {
            count: 1,
            percent: 0
        }
    );
    assert!(!pool.min_healthy.is_set());
    assert!(!pool.active.disable_on_404);
    assert_eq!(pool.active.rise_after_maintenance, None);
    assert!(!pool.close_tunnels_on_down);
}

#[test]
fn the_new_keys_are_read() {
    let config = parse(&format!(
        "{TWO}\nbackups = \"all\"\nmin_healthy = 1\nmin_healthy_percent = 50\n\
         close_tunnels_on_down = true\n[pools.web.active]\ndisable_on_404 = true\n\
         rise_after_maintenance = 4"
    ))
    .expect("valid");
    let pool = &config.pools[0];
    assert!(!pool.backends[0].backup);
    assert!(pool.backends[1].backup);
    assert_eq!(pool.backups, BackupUse::All);
    assert_eq!(
        pool.min_healthy,
        MinHealthy {
            count: 1,
            percent: 50
        }
    );
    assert!(pool.active.disable_on_404);
    assert_eq!(pool.active.rise_after_maintenance.map(|n| n.get()), Some(4));
    assert!(pool.close_tunnels_on_down);
}

#[test]
fn bad_state_keys_are_errors_that_say_what_to_do() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "backends = [{ address = \"127.0.0.1:9001\", backup = true }]",
            "pools.web.backends",
            "every backend is a backup",
        ),
        (
            &format!("{TWO}\nwhen_all_down = \"reject\"\nmin_healthy = 2"),
            "pools.web.min_healthy",
            "set when_all_down = \"fail_open\"",
        ),
        (
            &format!("{TWO}\nwhen_all_down = \"reject\"\nmin_healthy_percent = 30"),
            "pools.web.min_healthy_percent",
            "makes a pool fail open",
        ),
        (
            &format!("{TWO}\nmin_healthy = 0"),
            "pools.web.min_healthy",
            "out of range",
        ),
        (
            &format!("{TWO}\nmin_healthy_percent = 101"),
            "pools.web.min_healthy_percent",
            "out of range",
        ),
        (
            &format!("{TWO}\nbackups = \"some\""),
            "pools.web.backups",
            "",
        ),
        (
            &format!("{TWO}\n[pools.web.active]\nkind = \"tcp\"\ndisable_on_404 = true"),
            "pools.web.active.disable_on_404",
            "kind = \"http\"",
        ),
        (
            &format!("{TWO}\n[pools.web.active]\nrise_after_maintenance = 0"),
            "pools.web.active.rise_after_maintenance",
            "out of range",
        ),
    ];
    for (pool, key, advice) in cases {
        let error = parse(pool).expect_err(pool);
        assert!(error.contains(key), "{error} should name {key}");
        assert!(error.contains(advice), "{error} should say {advice:?}");
    }
    // A reject pool may keep the default thresholds, written out.
    parse(&format!(
        "{TWO}\nwhen_all_down = \"reject\"\nmin_healthy = 1\nmin_healthy_percent = 0"
    ))
    .expect("the defaults are fine with reject");
}

#[test]
fn a_min_healthy_above_the_primaries_warns() {
    let config = parse(&format!("{TWO}\nmin_healthy = 2")).expect("valid");
    let warnings = check(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].key, "pools.web.min_healthy");
    assert!(
        warnings[0].message.contains("above the pool's 1 primaries"),
        "{}",
        warnings[0].message
    );
    let config = parse(&format!("{TWO}\nmin_healthy = 1")).expect("valid");
    assert_eq!(check(&config), []);
}

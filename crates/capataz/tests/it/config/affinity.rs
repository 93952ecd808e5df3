//! A pool's `algorithm = "hash"` with `hash_key` and `hash_balance_factor`, and its `sticky`
//! table: defaults, values, and the errors for bad ones.

use std::time::Duration;

use capataz::config::{HashConfig, HashKey, OnDrain, SameSite, StickyConfig};

use super::*;

#[test]
fn hashing_defaults_to_the_client_address_without_bounded_loads() {
    assert_eq!(parse(MINIMAL).pools[0].affinity, Default::default());
    let config = parse(&with_pool("algorithm = \"hash\""));
    assert_eq!(config.pools[0].algorithm, Algorithm::Hash);
    assert_eq!(
        config.pools[0].affinity.hash,
        Some(HashConfig {
            key: HashKey::ClientIp,
            balance_factor: 0
        })
    );
    for (written, key) in [
        ("path", HashKey::Path),
        (
            "header:X-User",
            HashKey::Header(http::HeaderName::from_static("x-user")),
        ),
        ("cookie:sid", HashKey::Cookie("sid".into())),
        ("query:user", HashKey::Query("user".into())),
    ] {
        let text =
            format!("algorithm = \"hash\"\nhash_key = \"{written}\"\nhash_balance_factor = 150");
        let hash = parse(&with_pool(&text)).pools[0].affinity.hash.clone();
        assert_eq!(
            hash,
            Some(HashConfig {
                key,
                balance_factor: 150
            }),
            "{written}"
        );
    }
}

#[test]
fn sticky_takes_a_cookie_and_its_attributes() {
    let config = parse(&with_pool("[pools.web.sticky]\ncookie = \"SRV\""));
    assert_eq!(
        config.pools[0].affinity.sticky,
        Some(StickyConfig {
            cookie: "SRV".into(),
            path: "/".into(),
            max_age: None,
            secure: false,
            http_only: true,
            same_site: SameSite::Lax,
            on_drain: OnDrain::Keep,
        })
    );
    let config = parse(&with_pool(
        "[pools.web.sticky]\ncookie = \"SRV\"\npath = \"/app\"\nmax_age = \"1h\"\nsecure = true\n\
         httponly = false\nsamesite = \"none\"\non_drain = \"move\"",
    ));
    let sticky = config.pools[0].affinity.sticky.clone().expect("sticky");
    assert_eq!(sticky.path, "/app");
    assert_eq!(sticky.max_age, Some(Duration::from_secs(3600)));
    assert!(sticky.secure && !sticky.http_only);
    assert_eq!(
        (sticky.same_site, sticky.on_drain),
        (SameSite::None, OnDrain::Move)
    );
}

#[test]
fn affinity_errors_name_the_line_and_what_to_write() {
    let cases: &[(&str, usize, &str, &str)] = &[
        (
            "hash_key = \"path\"",
            7,
            "pools.web.hash_key",
            "applies only to a hashing pool",
        ),
        (
            "hash_balance_factor = 150",
            7,
            "pools.web.hash_balance_factor",
            "add algorithm = \"hash\"",
        ),
        (
            "algorithm = \"hash\"\nhash_key = \"ip\"",
            8,
            "pools.web.hash_key",
            "\"ip\" is not a hash key (use \"client_ip\"",
        ),
        (
            "algorithm = \"hash\"\nhash_key = \"header:\"",
            8,
            "pools.web.hash_key",
            "names no header",
        ),
        (
            "algorithm = \"hash\"\nhash_key = \"header:X User\"",
            8,
            "pools.web.hash_key",
            "\"X User\" is not a header name",
        ),
        (
            "algorithm = \"hash\"\nhash_key = \"query:a=b\"",
            8,
            "pools.web.hash_key",
            "is not a query name",
        ),
        (
            "algorithm = \"hash\"\nhash_balance_factor = 100",
            8,
            "pools.web.hash_balance_factor",
            "use a percentage above 100",
        ),
        (
            "algorithm = \"hash\"\nhash_balance_factor = 20000",
            8,
            "pools.web.hash_balance_factor",
            "out of range",
        ),
        (
            "[pools.web.sticky]\npath = \"/\"",
            7,
            "pools.web.sticky.cookie",
            "need the cookie's name",
        ),
        (
            "[pools.web.sticky]\ncookie = \"a;b\"",
            8,
            "pools.web.sticky.cookie",
            "is not a cookie name",
        ),
        (
            "[pools.web.sticky]\ncookie = \"SRV\"\npath = \"app\"",
            9,
            "pools.web.sticky.path",
            "start with '/'",
        ),
        (
            "[pools.web.sticky]\ncookie = \"SRV\"\nsamesite = \"none\"",
            9,
            "pools.web.sticky.samesite",
            "add secure = true",
        ),
        (
            "[pools.web.sticky]\ncookie = \"SRV\"\non_drain = \"stay\"",
            9,
            "pools.web.sticky.on_drain",
            "\"keep\"",
        ),
    ];
    for (extra, line, key, says) in cases {
        let error = check_err(&with_pool(extra), Some(*line), key);
        assert!(error.to_string().contains(says), "{extra}: {error}");
    }
}

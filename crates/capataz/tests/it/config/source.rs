//! `[pools.NAME.source]`: `static` by default, `dns` with its keys and defaults, and the
//! mistakes it refuses.

use super::*;
use capataz::config::{DnsRecord, DnsSource, PoolSource};

const DNS_POOL: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web.source]\n";

#[test]
fn a_pool_without_a_source_table_is_static() {
    assert_eq!(parse(MINIMAL).pools[0].source, PoolSource::Static);
}

#[test]
fn a_dns_source_has_its_defaults_and_no_backends() {
    let config = parse(&format!(
        "{DNS_POOL}kind = \"dns\"\nname = \"web.test.\"\nport = 8080\n"
    ));
    let pool = &config.pools[0];
    assert!(pool.backends.is_empty());
    assert_eq!(
        pool.source,
        PoolSource::Dns(DnsSource {
            name: "web.test.".into(),
            record: DnsRecord::Address { port: 8080 },
            resolver: None,
            ttl_min: Duration::from_secs(5),
            ttl_max: Duration::from_secs(300),
            timeout: Duration::from_secs(2),
            max_drop_percent: 50,
        })
    );
}

#[test]
fn a_dns_source_takes_srv_a_resolver_and_its_bounds() {
    let config = parse(&format!(
        "{DNS_POOL}kind = \"dns\"\nname = \"_http._tcp.web.test\"\nrecord = \"srv\"\n\
         resolver = \"127.0.0.1:5353\"\nttl_min = \"1s\"\nttl_max = \"10s\"\ntimeout = \"300ms\"\n\
         max_drop_percent = 100\n"
    ));
    let PoolSource::Dns(dns) = &config.pools[0].source else {
        panic!("a dns source");
    };
    assert_eq!(dns.record, DnsRecord::Srv);
    assert_eq!(dns.resolver, Some(addr("127.0.0.1:5353")));
    assert_eq!(
        (dns.ttl_min, dns.ttl_max),
        (Duration::from_secs(1), Duration::from_secs(10))
    );
    assert_eq!(dns.timeout, Duration::from_millis(300));
    assert_eq!(dns.max_drop_percent, 100);
}

#[test]
fn dns_source_mistakes_name_their_key() {
    let cases: &[(&str, &str)] = &[
        ("kind = \"etcd\"\n", "pools.web.source.kind"),
        ("kind = \"dns\"\nport = 80\n", "pools.web.source.name"),
        (
            "kind = \"dns\"\nname = \"web.test\"\n",
            "pools.web.source.port",
        ),
        (
            "kind = \"dns\"\nname = \"web..test\"\nport = 80\n",
            "pools.web.source.name",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nport = 0\n",
            "pools.web.source.port",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nrecord = \"srv\"\nport = 80\n",
            "pools.web.source.port",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nrecord = \"mx\"\n",
            "pools.web.source.record",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nport = 80\nresolver = \"ns1\"\n",
            "pools.web.source.resolver",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nport = 80\nttl_min = \"10s\"\nttl_max = \"5s\"\n",
            "pools.web.source.ttl_max",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nport = 80\nmax_drop_percent = 101\n",
            "pools.web.source.max_drop_percent",
        ),
        (
            "kind = \"static\"\nname = \"web.test\"\n",
            "pools.web.source.name",
        ),
    ];
    for (table, key) in cases {
        let text = format!("{DNS_POOL}{table}");
        let error = parse_str(&text, "config.toml").expect_err(&format!("refused: {table}"));
        assert!(
            error.key().contains(key),
            "{table}: key {:?}, want {key}: {error}",
            error.key()
        );
    }
}

#[test]
fn a_dns_pool_refuses_a_backends_list() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web]\n\
                backends = [{ address = \"127.0.0.1:9001\" }]\n[pools.web.source]\n\
                kind = \"dns\"\nname = \"web.test\"\nport = 80\n";
    check_err(text, Some(5), "pools.web.backends");
}

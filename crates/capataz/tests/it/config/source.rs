//! `[pools.NAME.source]`: `static` by default, `dns` and `etcd` with their keys and defaults,
//! and the mistakes they refuse.

use super::*;
use capataz::config::{DnsRecord, DnsSource, EtcdEndpoint, EtcdSource, PoolSource};

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
        ("kind = \"consul\"\n", "pools.web.source.kind"),
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

#[test]
fn an_etcd_source_has_its_defaults_and_no_backends() {
    let config = parse(&format!(
        "{DNS_POOL}kind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\", \"http://etcd-2\"]\n\
         prefix = \"/services/web/\"\n"
    ));
    let pool = &config.pools[0];
    assert!(pool.backends.is_empty());
    assert_eq!(
        pool.source,
        PoolSource::Etcd(EtcdSource {
            endpoints: vec![
                EtcdEndpoint {
                    url: "http://127.0.0.1:2379".into(),
                    host: "127.0.0.1".into(),
                    port: 2379,
                    access: Default::default(),
                },
                EtcdEndpoint {
                    url: "http://etcd-2".into(),
                    host: "etcd-2".into(),
                    port: 2379,
                    access: Default::default(),
                },
            ],
            prefix: "/services/web/".into(),
            timeout: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            keepalive: Duration::from_secs(10),
            confirm_after: Duration::from_secs(5),
            max_drop_percent: 50,
        })
    );
}

#[test]
fn etcd_source_mistakes_name_their_key() {
    const ETCD: &str = "kind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n";
    let cases: &[(&str, &str)] = &[
        (
            "kind = \"etcd\"\nprefix = \"/web/\"\n",
            "pools.web.source.endpoints",
        ),
        (
            "kind = \"etcd\"\nendpoints = []\nprefix = \"/web/\"\n",
            "pools.web.source.endpoints",
        ),
        (
            "kind = \"etcd\"\nendpoints = [\"https://a:1\", \"http://b:1\"]\nprefix = \"/w/\"\n",
            "pools.web.source.endpoints[1]",
        ),
        (
            "kind = \"etcd\"\nendpoints = [\"http://a:1\", \"127.0.0.1:2379\"]\nprefix = \"/w/\"\n",
            "pools.web.source.endpoints[1]",
        ),
        (ETCD, "pools.web.source.prefix"),
        (&format!("{ETCD}prefix = \"\"\n"), "pools.web.source.prefix"),
        (
            &format!("{ETCD}prefix = \"/w/\"\nreconnect_min = \"5s\"\nreconnect_max = \"1s\"\n"),
            "pools.web.source.reconnect_max",
        ),
        (
            &format!("{ETCD}prefix = \"/w/\"\nkeepalive = \"0s\"\n"),
            "pools.web.source.keepalive",
        ),
        (
            &format!("{ETCD}prefix = \"/w/\"\nname = \"web.test\"\n"),
            "pools.web.source.name",
        ),
        (
            "kind = \"dns\"\nname = \"web.test\"\nport = 80\nprefix = \"/w/\"\n",
            "pools.web.source.prefix",
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

//! TLS passthrough by SNI: a tcp listener's `[[listeners.sni_routes]]` and `inspect_timeout`,
//! their defaults, and the errors for bad names, repeated names, pools that are not tcp pools,
//! and the keys where they mean nothing.

use super::*;
use capataz::config::ServerNamePattern;

/// A tcp listener without a pool (`listener` appended to its table, then `routes`), beside tcp
/// pools `a` and `b` and an HTTP pool `web`.
fn passthrough(listener: &str, routes: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8443\"\nmode = \"tcp\"\n{listener}\n{routes}\n\n\
         [pools.a]\nprotocol = \"tcp\"\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n\n\
         [pools.b]\nprotocol = \"tcp\"\nbackends = [{{ address = \"127.0.0.1:9002\" }}]\n\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9003\" }}]\n"
    )
}

const TWO_ROUTES: &str = "[[listeners.sni_routes]]\nserver_names = [\"Shop.Example.com\", \
                          \"*.shop.example.com\"]\npool = \"a\"\n\
                          [[listeners.sni_routes]]\nserver_names = [\"*.example.com\"]\npool = \"b\"";

#[test]
fn sni_routes_name_pools_and_the_listeners_pool_is_the_default() {
    let config = parse(&passthrough("", TWO_ROUTES));
    let tcp = config.listeners[0].tcp.as_ref().expect("a tcp listener");
    assert_eq!(tcp.pool, None, "no default: unrouted sessions are closed");
    let sni = tcp.sni.as_ref().expect("sni routes");
    assert_eq!(sni.inspect_timeout, Duration::from_secs(5), "the default");
    assert_eq!(sni.routes.len(), 2);
    assert_eq!(config.pools[sni.routes[0].pool].name, "a");
    assert_eq!(config.pools[sni.routes[1].pool].name, "b");
    assert_eq!(
        sni.routes[0].server_names,
        [
            ServerNamePattern::Exact("shop.example.com".into()),
            ServerNamePattern::Suffix(".shop.example.com".into())
        ]
    );
    let at = |name| {
        sni.route(name)
            .map(|m| config.pools[sni.routes[m.route].pool].name.clone())
    };
    assert_eq!(at("SHOP.example.com").as_deref(), Some("a"));
    assert_eq!(at("eu.shop.example.com").as_deref(), Some("a"));
    assert_eq!(at("www.example.com").as_deref(), Some("b"));
    assert_eq!(at("example.com"), None);
    let config = parse(&passthrough(
        "pool = \"b\"\ninspect_timeout = \"750ms\"",
        TWO_ROUTES,
    ));
    let tcp = config.listeners[0].tcp.as_ref().expect("a tcp listener");
    assert_eq!(tcp.pool.map(|p| config.pools[p].name.as_str()), Some("b"));
    let sni = tcp.sni.as_ref().expect("sni routes");
    assert_eq!(sni.inspect_timeout, Duration::from_millis(750));
}

#[test]
fn bad_sni_routes_are_errors_naming_the_route_and_key() {
    let route = |names: &str, pool: &str| {
        passthrough(
            "",
            &format!("[[listeners.sni_routes]]\nserver_names = {names}\n{pool}"),
        )
    };
    for bad in [
        "\"10.0.0.1\"",
        "\"a.*.example.com\"",
        "\"*\"",
        "\"shop example\"",
        "\"\"",
    ] {
        let text = route(&format!("[{bad}]"), "pool = \"a\"");
        let error = check_err(&text, Some(6), "listeners[0].sni_routes[0].server_names");
        assert!(
            error.to_string().contains("is not a server name"),
            "{error}"
        );
    }
    let empty = route("[]", "pool = \"a\"");
    check_err(&empty, Some(6), "listeners[0].sni_routes[0].server_names");
    let no_pool = route("[\"a.example\"]", "");
    check_err(&no_pool, Some(5), "listeners[0].sni_routes[0].pool");
    let http_pool = route("[\"a.example\"]", "pool = \"web\"");
    let error = check_err(&http_pool, Some(7), "listeners[0].sni_routes[0].pool");
    assert!(error.to_string().contains("protocol = \"tcp\""), "{error}");
    let unknown = route("[\"a.example\"]", "pool = \"nope\"");
    check_err(&unknown, Some(7), "listeners[0].sni_routes[0].pool");
    // A name twice, in any case, in two routes.
    let twice = passthrough(
        "",
        "[[listeners.sni_routes]]\nserver_names = [\"*.example.com\"]\npool = \"a\"\n\
         [[listeners.sni_routes]]\nserver_names = [\"x.org\", \"*.EXAMPLE.com\"]\npool = \"b\"",
    );
    let error = check_err(&twice, Some(9), "listeners[0].sni_routes[1].server_names");
    assert!(error.to_string().contains("sni_routes[0]"), "{error}");
    // No routes and no pool.
    check_err(&passthrough("", ""), Some(1), "listeners[0].pool");
}

#[test]
fn sni_keys_where_they_mean_nothing_are_errors() {
    // An inspect timeout without routes, or zero.
    let alone = passthrough("pool = \"a\"\ninspect_timeout = \"2s\"", "");
    check_err(&alone, Some(5), "listeners[0].inspect_timeout");
    let zero = passthrough("inspect_timeout = \"0s\"", TWO_ROUTES);
    check_err(&zero, Some(4), "listeners[0].inspect_timeout");
    // On an HTTP listener.
    let http = MINIMAL.replace(
        "8080\"",
        "8080\"\n[[listeners.sni_routes]]\nserver_names = [\"a.example\"]\npool = \"web\"",
    );
    let error = check_err(&http, Some(4), "listeners[0].sni_routes");
    assert!(error.to_string().contains("mode = \"tcp\""), "{error}");
    let http = MINIMAL.replace("8080\"", "8080\"\ninspect_timeout = \"1s\"");
    check_err(&http, Some(4), "listeners[0].inspect_timeout");
    // On a listener that terminates TLS.
    let terminating = passthrough(
        "[listeners.tls]\ncertificates = [{ cert = \"c.pem\", key = \"k.pem\" }]",
        TWO_ROUTES,
    );
    let error = check_err(&terminating, Some(6), "listeners[0].sni_routes");
    assert!(error.to_string().contains("remove tls"), "{error}");
}

//! A route's matchers (`methods`, `path`, `path_regex`, `headers`, `query`, `name`): read as
//! written, and each bad value an error naming its line and key.

use super::*;

/// A listener whose one route has `keys` besides `pool = "web"`.
fn route(keys: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npool = \"web\"\n{keys}\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn route_matchers_are_read_as_written() {
    let config = parse(&route(
        "name = \"canary\"\nmethods = [\"GET\", \"PURGE\"]\npath = \"/login\"\n\
         path_regex = \"/[a-z]+\"\n\
         headers = [{ name = \"X-Canary\", value = \"1\" }, { name = \"cookie\", present = true }]\n\
         query = [{ name = \"v\", value_regex = \"[0-9]+\" }]",
    ));
    let first = &config.listeners[0].routes[0];
    assert_eq!(first.name.as_deref(), Some("canary"));
    let matches = first.matches.as_ref().expect("matchers");
    assert_eq!(matches.methods.len(), 2);
    assert_eq!(matches.methods[1].as_str(), "PURGE");
    assert_eq!(matches.path.as_deref(), Some("/login"));
    assert_eq!(matches.path_regex.as_ref().unwrap().as_str(), "/[a-z]+");
    assert_eq!(matches.headers[0].name.as_str(), "x-canary");
    assert_eq!(matches.query[0].name, "v");
    // A route with only host and path prefix carries no matchers at all.
    let plain = parse(&route("path_prefix = \"/api/\""));
    assert!(plain.listeners[0].routes[0].matches.is_none());
    assert!(plain.listeners[0].routes[0].name.is_none());
}

#[test]
fn bad_route_matchers_name_the_line_and_key() {
    let cases: &[(&str, &str, usize, &str)] = &[
        ("empty methods", "methods = []", 5, "routes[0].methods"),
        ("lowercase method", "methods = [\"GET\", \"get\"]", 5, "routes[0].methods[1]"),
        ("method with a space", "methods = [\"GE T\"]", 5, "routes[0].methods[0]"),
        ("path without slash", "path = \"login\"", 5, "routes[0].path"),
        ("path with a query", "path = \"/a?b\"", 5, "routes[0].path"),
        ("bad path regex", "path_regex = \"/api/(\"", 5, "routes[0].path_regex"),
        ("huge path regex", "path_regex = '\\w{1000}\\w{1000}'", 5, "routes[0].path_regex"),
        ("header without name", "headers = [{ value = \"1\" }]", 5, "routes[0].headers[0].name"),
        ("bad header name", "headers = [{ name = \"X Y\", present = true }]", 5, "headers[0].name"),
        (
            "header value and regex",
            "headers = [{ name = \"a\", value = \"1\", value_regex = \"1\" }]",
            5,
            "routes[0].headers[0]",
        ),
        ("header with nothing to match", "headers = [{ name = \"a\" }]", 5, "headers[0]"),
        ("header present false", "headers = [{ name = \"a\", present = false }]", 5, "present"),
        (
            "header value with a newline",
            "headers = [{ name = \"a\", value = \"1\\r\\nX: y\" }]",
            5,
            "headers[0].value",
        ),
        (
            "bad header value regex",
            "\nheaders = [\n  { name = \"a\", present = true },\n  { name = \"b\", value_regex = \"[\" },\n]",
            8,
            "routes[0].headers[1].value_regex",
        ),
        ("query name with =", "query = [{ name = \"a=b\", present = true }]", 5, "query[0].name"),
        ("query value with &", "query = [{ name = \"a\", value = \"1&b\" }]", 5, "query[0].value"),
        ("empty route name", "name = \"\"", 5, "routes[0].name"),
        ("unknown matcher key", "headers = [{ name = \"a\", regex = \"b\" }]", 5, "regex"),
    ];
    for (what, keys, line, key) in cases {
        eprintln!("case: {what}");
        check_err(&route(keys), Some(*line), key);
    }
}

#[test]
fn a_bad_regex_shows_the_regex_error() {
    let error = check_err(&route("path_regex = \"/api/(\""), Some(5), "path_regex");
    assert_eq!(
        error.to_string(),
        r#"config.toml:5: listeners[0].routes[0].path_regex: "/api/(" is not a usable regex: unclosed group (the regex crate's syntax; it must match the whole value)"#
    );
    let error = check_err(
        &route("path_regex = '\\w{1000}\\w{1000}'"),
        Some(5),
        "path_regex",
    );
    assert!(error.to_string().contains("size limit"), "{error}");
}

/// A listener with `keys` (and one pool).
fn listener(keys: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{keys}\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn header_rules_forwarded_and_request_id_are_read_as_written() {
    let config = parse(&listener(
        "forwarded = \"both\"\nrequest_id = { header = \"X-Trace\" }\n\
         request_headers = { set = { \"X-Id\" = \"%{request_id}\" }, remove = [\"X-Debug\"] }",
    ));
    let l = &config.listeners[0];
    assert_eq!(l.forwarded, capataz::config::ForwardedFields::Both);
    let id = l.request_id.as_ref().expect("request_id");
    assert_eq!(id.header.as_str(), "x-trace");
    assert!(id.keep_incoming);
    assert!(!id.response);
    let rules = l.request_headers.as_ref().expect("rules");
    assert_eq!(rules.set[0].0.as_str(), "x-id");
    assert_eq!(rules.remove[0].as_str(), "x-debug");
    // forwarded_headers = false is forwarded = "none"; the default is "x-forwarded".
    let off = parse(&listener("forwarded_headers = false"));
    assert_eq!(
        off.listeners[0].forwarded,
        capataz::config::ForwardedFields::None
    );
    let default = parse(&listener(""));
    assert_eq!(
        default.listeners[0].forwarded,
        capataz::config::ForwardedFields::XForwarded
    );
    assert!(default.listeners[0].request_headers.is_none());
}

#[test]
fn bad_header_rules_name_the_line_and_key() {
    let cases: &[(&str, &str, usize, &str)] = &[
        (
            "forwarded twice",
            "forwarded = \"both\"\nforwarded_headers = true",
            3,
            "listeners[0].forwarded",
        ),
        (
            "unknown forwarded",
            "forwarded = \"rfc\"",
            3,
            "listeners[0].forwarded",
        ),
        (
            "bad name",
            "request_headers = { set = { \"X Y\" = \"1\" } }",
            3,
            "request_headers.set.X Y",
        ),
        (
            "framing field",
            "response_headers = { remove = [\"Content-Length\"] }",
            3,
            "remove[0]",
        ),
        (
            "unknown variable",
            "request_headers = { add = { \"X-A\" = \"%{client}\" } }",
            3,
            "add.X-A",
        ),
        (
            "unclosed variable",
            "request_headers = { add = { \"X-A\" = \"%{host\" } }",
            3,
            "add.X-A",
        ),
        (
            "backend in a request",
            "request_headers = { set = { \"X-B\" = \"%{backend}\" } }",
            3,
            "set.X-B",
        ),
        (
            "request id without one",
            "response_headers = { set = { \"X-R\" = \"%{request_id}\" } }",
            3,
            "set.X-R",
        ),
        (
            "control character",
            "request_headers = { set = { \"X-C\" = \"a\\nb\" } }",
            3,
            "set.X-C",
        ),
        (
            "bad request id header",
            "request_id = { header = \"Transfer-Encoding\" }",
            3,
            "request_id.header",
        ),
    ];
    for (what, keys, line, key) in cases {
        eprintln!("case: {what}");
        check_err(&listener(keys), Some(*line), key);
    }
    // On a route too.
    check_err(
        &route("request_headers = { set = { \"X-B\" = \"%{backend}\" } }"),
        Some(5),
        "listeners[0].routes[0].request_headers.set.X-B",
    );
}

#[test]
fn bad_path_rewrites_name_the_line_and_key() {
    let cases: &[(&str, &str, usize, &str)] = &[
        (
            "two rewrites",
            "strip_prefix = true\nreplace_prefix = \"/v2/\"",
            3,
            "routes[0].regex_rewrite",
        ),
        (
            "prefix without slash",
            "replace_prefix = \"v2/\"",
            5,
            "routes[0].replace_prefix",
        ),
        (
            "no substitution",
            "regex_rewrite = { pattern = \"^/a\" }",
            5,
            "routes[0].regex_rewrite",
        ),
        (
            "bad pattern",
            "regex_rewrite = { pattern = \"(\", substitution = \"/\" }",
            5,
            "regex_rewrite.pattern",
        ),
        (
            "substitution with a space",
            "regex_rewrite = { pattern = \"a\", substitution = \"/a b\" }",
            5,
            "regex_rewrite.substitution",
        ),
        (
            "substitution with a query",
            "regex_rewrite = { pattern = \"a\", substitution = \"/a?b\" }",
            5,
            "regex_rewrite.substitution",
        ),
    ];
    for (what, keys, line, key) in cases {
        eprintln!("case: {what}");
        check_err(&route(keys), Some(*line), key);
    }
    let config = parse(&route("path_prefix = \"/api\"\nstrip_prefix = true"));
    assert_eq!(
        config.listeners[0].routes[0].rewrite.as_deref(),
        Some(&capataz::config::PathRewrite::StripPrefix)
    );
    let config = parse(&route("strip_prefix = false"));
    assert!(config.listeners[0].routes[0].rewrite.is_none());
}

/// A listener whose one route has `keys` and no pool.
fn redirect_route(keys: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\n{keys}\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn bad_redirects_name_the_line_and_key() {
    let cases: &[(&str, &str, usize, &str)] = &[
        (
            "pool and redirect",
            "pool = \"web\"\nredirect = { scheme = \"https\" }",
            5,
            "routes[0].redirect",
        ),
        ("neither", "path_prefix = \"/a\"", 3, "routes[0].pool"),
        (
            "bad status",
            "redirect = { status = 200, scheme = \"https\" }",
            4,
            "redirect.status",
        ),
        (
            "bad scheme",
            "redirect = { scheme = \"ftp\" }",
            4,
            "redirect.scheme",
        ),
        (
            "bad host",
            "redirect = { host = \"a b\" }",
            4,
            "redirect.host",
        ),
        ("bad port", "redirect = { port = 0 }", 4, "redirect.port"),
        (
            "path and prefix",
            "redirect = { path = \"/a\", prefix = \"/b\" }",
            4,
            "redirect.prefix",
        ),
        (
            "path with a query",
            "redirect = { path = \"/a?b\" }",
            4,
            "redirect.path",
        ),
        (
            "to itself",
            "redirect = { status = 301 }",
            4,
            "routes[0].redirect",
        ),
        (
            "with a rewrite",
            "strip_prefix = true\nredirect = { scheme = \"https\" }",
            5,
            "routes[0].redirect",
        ),
    ];
    for (what, keys, line, key) in cases {
        eprintln!("case: {what}");
        check_err(&redirect_route(keys), Some(*line), key);
    }
    let config = parse(&redirect_route("redirect = { scheme = \"https\" }"));
    let capataz::config::RouteTarget::Redirect(redirect) = &config.listeners[0].routes[0].target
    else {
        panic!("a redirect route");
    };
    assert_eq!(redirect.status, 302);
    assert_eq!(redirect.scheme.as_deref(), Some("https"));
}

//! Errors about a value's type or an unknown key, in the operator's words: the file, the line
//! of the key (of the element, inside a list), the full key path with indexes, and what is
//! allowed; never a Rust type, a serde term or a field count. One `check(text, expected)`
//! table for the exact messages, and a sweep over every table of the configuration.

use capataz::config::{parse_all_errors, ConfigError, ConfigErrors, Environment};
use proptest::prelude::*;

/// Every error of `text`, or none.
fn errors(text: &str) -> Option<ConfigErrors> {
    parse_all_errors(
        text,
        "config.toml",
        &Environment::from_pairs::<&str, &str>([]),
    )
    .err()
}

/// `text` must fail with exactly `expected` (every error, one per line).
fn check(text: &str, expected: &str) {
    match errors(text) {
        None => panic!("expected {expected:?}, got a valid config:\n{text}"),
        Some(errors) => assert_eq!(errors.to_string(), expected, "\n---\n{text}"),
    }
}

const LISTENER: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n";

/// Regression: `active = []` and `active = 5` said "expected struct RawActive with
/// 23 elements"; `backends = []` pointed at the `[pools.web]` line; a wrong type or an unknown
/// key inside a backend's inline table was placed at `pools.web.backends`, without the index
/// and the key that other backend errors carry, and in serde's words.
#[test]
fn config_errors_leaked_rust_names_and_lost_their_place() {
    let pool = format!("{LISTENER}[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n");
    let backends = |second: &str| {
        format!(
            "{LISTENER}[pools.web]\nalgorithm = \"round_robin\"\nbackends = [\n  \
             {{ address = \"127.0.0.1:9001\" }},\n  {{ address = \"127.0.0.1:9002\", {second} }},\n]\n"
        )
    };
    let cases: &[(String, &str)] = &[
        (
            format!("{pool}active = []\n"),
            "config.toml:6: pools.web.active: a list is not a table (write a [pools.web.active] \
             section with its keys on the lines below it, or active = { key = value, ... })",
        ),
        (
            format!("{pool}active = 5\n"),
            "config.toml:6: pools.web.active: 5 is not a table (write a [pools.web.active] \
             section with its keys on the lines below it, or active = { key = value, ... })",
        ),
        (
            // A list whose first elements would have fitted the table's first keys, in order.
            format!("{pool}active = [\"http\", \"/healthz\"]\n"),
            "config.toml:6: pools.web.active: a list is not a table (write a [pools.web.active] \
             section with its keys on the lines below it, or active = { key = value, ... })",
        ),
        (
            format!("{LISTENER}[pools.web]\nalgorithm = \"round_robin\"\n\nbackends = []\n"),
            "config.toml:7: pools.web.backends: a pool needs at least one backend (add backends \
             = [{ address = \"127.0.0.1:9001\" }])",
        ),
        (
            backends("weight = 1.5"),
            "config.toml:8: pools.web.backends[1].weight: 1.5 is not a whole number (write \
             digits without quotes or a decimal point, e.g. 3)",
        ),
        (
            backends("backup = \"yes\""),
            "config.toml:8: pools.web.backends[1].backup: \"yes\" is not true or false (write \
             true or false, without quotes)",
        ),
        (
            backends("colour = \"red\""),
            "config.toml:8: pools.web.backends[1].colour: unknown key \"colour\" (the keys here \
             are name, address, weight, backup, agent_port, track, max_connections, \
             max_requests)",
        ),
        (
            backends("wieght = 2"),
            "config.toml:8: pools.web.backends[1].wieght: unknown key \"wieght\": did you mean \
             \"weight\"? (the keys here are name, address, weight, backup, agent_port, track, \
             max_connections, max_requests)",
        ),
        (
            // Validation's own backend errors had the index already; now the line too.
            backends("agent_port = 9100"),
            "config.toml:8: pools.web.backends[1].agent_port: agent_port needs agent checks on \
             the pool (add [pools.web.agent] with its port, interval and timeout)",
        ),
    ];
    for (text, expected) in cases {
        check(text, expected);
    }
}

#[test]
fn wrong_types_say_what_is_allowed() {
    let pool = format!("{LISTENER}[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n");
    let cases: &[(String, &str)] = &[
        (
            format!("{pool}algorithm = 5\n"),
            "config.toml:6: pools.web.algorithm: 5 is not one of \"round_robin\", \
             \"least_request\", \"hash\", \"peak_ewma\" (write the word in double quotes)",
        ),
        (
            format!("{pool}algorithm = \"round-robin\"\n"),
            "config.toml:6: pools.web.algorithm: \"round-robin\" is not one of \"round_robin\", \
             \"least_request\", \"hash\", \"peak_ewma\" (did you mean \"round_robin\"?)",
        ),
        (
            // A one-key table was read as the word it names.
            format!("{pool}algorithm = {{ round_robin = [] }}\n"),
            "config.toml:6: pools.web.algorithm: a table is not one of \"round_robin\", \
             \"least_request\", \"hash\", \"peak_ewma\" (write the word in double quotes)",
        ),
        (
            format!("{pool}[pools.web.active]\ninitial = \"first_probe\"\nkind = \"icmp\"\n"),
            "config.toml:8: pools.web.active.kind: \"icmp\" is not one of \"http\", \"tcp\", \
             \"grpc\", \"none\"",
        ),
        (
            format!("{pool}active.rise = 2024-01-01\n"),
            "config.toml:6: pools.web.active.rise: 2024-01-01 is not a whole number (write \
             digits without quotes or a decimal point, e.g. 3)",
        ),
        (
            format!("{pool}active.rise = 99999999999999999999\n"),
            "config.toml:6: pools.web.active.rise: the number is too large (a whole number is at \
             most 9223372036854775807)",
        ),
        (
            format!("{pool}passive.grpc_error_codes = [14, \"4\"]\n"),
            "config.toml:6: pools.web.passive.grpc_error_codes[1]: \"4\" is not a whole number \
             (write digits without quotes or a decimal point, e.g. 3)",
        ),
        (
            format!("{pool}[pools.web.active.headers]\nX-Probe = 1\n"),
            "config.toml:7: pools.web.active.headers.X-Probe: 1 is not a string (write it in \
             double quotes)",
        ),
        (
            format!("{pool}tls = \"yes\"\n"),
            "config.toml:6: pools.web.tls: \"yes\" is not true, false, or a table of TLS settings",
        ),
        (
            format!("{pool}[pools.web.tls]\nca_fil = \"ca.pem\"\n"),
            "config.toml:7: pools.web.tls.ca_fil: unknown key \"ca_fil\": did you mean \
             \"ca_file\"? (the keys here are ca_file, server_name, verify, cert, key)",
        ),
        (
            format!("{LISTENER}[pools.web]\nbackends = 5\n"),
            "config.toml:5: pools.web.backends: 5 is not a list (write the values in brackets, \
             e.g. [\"a\", \"b\"])",
        ),
        (
            format!("{LISTENER}[pools.web]\nbackends = [\"127.0.0.1:9001\"]\n"),
            "config.toml:5: pools.web.backends[0]: \"127.0.0.1:9001\" is not a table (write each \
             one as { key = value, ... }, or as a [[pools.web.backends]] section)",
        ),
        (
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[listeners.tls]\n\
             certificates = [{ cert = \"a.pem\", key = \"a.key\" }, { cert = 5 }]\n"
                .to_owned(),
            "config.toml:4: listeners[0].tls.certificates[1].cert: 5 is not a string (write it \
             in double quotes)",
        ),
        (
            "pools = []\n".to_owned(),
            "config.toml:1: pools: a list is not a table (write a [pools] section with its keys \
             on the lines below it, or pools = { key = value, ... })",
        ),
        (
            "[logging]\nlevel = \"info\"\n".to_owned(),
            "config.toml:1: logging: unknown key \"logging\" (the keys here are log, admin, \
             listeners, pools, alerts, server, fleet)",
        ),
    ];
    for (text, expected) in cases {
        check(text, expected);
    }
}

/// The sample messages of docs/config.md are what capataz says.
#[test]
fn the_sample_messages_of_the_reference_are_what_capataz_says() {
    let doc = include_str!("../../../../../docs/config.md");
    let second = |entry: &str| {
        format!(
            "{LISTENER}[pools.web]\nalgorithm = \"round_robin\"\nretry_after = \"5s\"\nbackends = [\n  \
             {{ address = \"127.0.0.1:9001\" }},\n  {{ address = \"127.0.0.1:9002\", {entry} }},\n]\n"
        )
    };
    let said = |text: &str| errors(text).expect("an error").to_string();
    for entry in ["weight = 1.5", "colour = \"red\""] {
        let line = format!("    {}\n", said(&second(entry)));
        assert!(doc.contains(&line), "docs/config.md lacks {line:?}");
    }
    let round_robin = said(&format!(
        "{LISTENER}[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n\
         algorithm = \"round-robin\"\n"
    ));
    let sample = round_robin.split_once(": ").expect("placed").1;
    assert!(
        doc.replace('\n', " ").contains(sample),
        "docs/config.md lacks {sample:?}"
    );
    let typo = said(&second("wieght = 2"));
    let sample = typo.split_once("(the keys").expect("listed").0;
    let sample = sample.split_once(": unknown").expect("unknown key").1;
    assert!(
        doc.contains(&format!("`unknown{sample}(the keys here are ...)`")),
        "{sample:?}"
    );
}

/// A file with several validation errors still gets every one, in validation's order, each on
/// the line of its own key.
#[test]
fn several_errors_keep_their_order_and_their_lines() {
    let text = format!(
        "{LISTENER}[pools.api]\nalgorithm = \"least_request\"\nbackends = []\n\n\
         [pools.web]\nbackends = [\n  {{ address = \"127.0.0.1:9001\" }},\n  \
         {{ address = \"127.0.0.1:9002\", weight = 0 }},\n]\n[pools.web.active]\nrise = 0\n"
    );
    check(
        &text,
        "config.toml:6: pools.api.backends: a pool needs at least one backend (add backends = \
         [{ address = \"127.0.0.1:9001\" }])\n\
         config.toml:11: pools.web.backends[1].weight: 0 is out of range (use a whole number \
         from 1 to 1000)\n\
         config.toml:14: pools.web.active.rise: 0 is out of range (use a whole number of at \
         least 1)\n\
         config.toml:1: listeners[0].routes: a listener without routes needs exactly one pool, \
         and there are 2 (add [[listeners.routes]] tables that name a pool)",
    );
}

/// What no message may say: Rust's types and serde's terms.
fn leak(message: &str) -> Option<&'static str> {
    const PHRASES: &[&str] = &[
        "Raw",
        "struct",
        "Spanned",
        "serde",
        "sequence",
        "a map",
        "elements",
        "invalid type",
        "invalid value",
        "invalid length",
        "wanted ",
        "`",
    ];
    const WORDS: &[&str] = &[
        "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "usize", "f32", "f64", "enum",
        "variant", "Option", "Vec", "None", "Some", "map",
    ];
    PHRASES
        .iter()
        .find(|phrase| message.contains(*phrase))
        .or_else(|| {
            message
                .split(|c: char| !c.is_ascii_alphanumeric())
                .find_map(|word| WORDS.iter().find(|w| **w == word))
        })
        .copied()
}

/// Every table of the configuration: the text written after [`MINIMAL`](super::MINIMAL) (before
/// it, for the top level), with `KV` where the key goes, and the table's key path. A part in
/// `<...>` is what the table needs besides (an address, a url), left out when it is the key
/// being tried. Inline tables, list elements and dotted keys are among them.
const TABLES: &[(&str, &str)] = &[
    ("KV\n", ""),
    ("[log]\nKV\n", "log"),
    ("[admin]\nKV\n", "admin"),
    ("[server]\nKV\n", "server"),
    (
        "[[listeners]]\nKV\n<address = \"127.0.0.1:8081\">\n",
        "listeners[1]",
    ),
    ("[listeners.http2]\nKV\n", "listeners[0].http2"),
    (
        "[listeners.proxy_protocol]\nKV\n<trusted = [\"127.0.0.1\"]>\n",
        "listeners[0].proxy_protocol",
    ),
    (
        "[[listeners.routes]]\nKV\n<pool = \"web\">\n",
        "listeners[0].routes[0]",
    ),
    (
        "[listeners.tls]\nKV\n<certificates = [{ cert = \"a.pem\", key = \"a.key\" }]>\n",
        "listeners[0].tls",
    ),
    (
        "[[listeners.tls.certificates]]\nKV\n<cert = \"a.pem\">\n<key = \"a.key\">\n",
        "listeners[0].tls.certificates[0]",
    ),
    (
        "[listeners.tls.acme]\nKV\n<directory = \"https://acme.test/directory\">\n\
         <domains = [\"example.com\"]>\n<email = \"ops@example.com\">\n\
         <storage = \"/var/lib/capataz\">\n",
        "listeners[0].tls.acme",
    ),
    (
        "[listeners.tls]\ncertificates = [{ cert = \"a.pem\", key = \"a.key\" }]\n\
         [listeners.tls.http3]\nKV\n",
        "listeners[0].tls.http3",
    ),
    (
        "[listeners.access_log]\nKV\n<path = \"access.log\">\n",
        "listeners[0].access_log",
    ),
    (
        "[pools.api]\nKV\n<backends = [{ address = \"127.0.0.1:9002\" }]>\n",
        "pools.api",
    ),
    (
        "[[pools.api.backends]]\nKV\n<address = \"127.0.0.1:9002\">\n",
        "pools.api.backends[0]",
    ),
    (
        "[pools.api]\nbackends = [{ address = \"127.0.0.1:9001\" }, { KV<, address = \
         \"127.0.0.1:9002\"> }]\n",
        "pools.api.backends[1]",
    ),
    ("[pools.web.active]\nKV\n", "pools.web.active"),
    (
        "[pools.api]\nbackends = [{ address = \"127.0.0.1:9002\" }]\nactive = { KV }\n",
        "pools.api.active",
    ),
    (
        "[pools.api]\nbackends = [{ address = \"127.0.0.1:9002\" }]\nactive.KV\n",
        "pools.api.active",
    ),
    (
        "[pools.web.active.headers]\nKV\n",
        "pools.web.active.headers",
    ),
    ("[pools.web.passive]\nKV\n", "pools.web.passive"),
    (
        "[pools.web.passive.latency_outliers]\nKV\n",
        "pools.web.passive.latency_outliers",
    ),
    (
        "[pools.web.passive.load_shedding]\nKV\n",
        "pools.web.passive.load_shedding",
    ),
    (
        "[pools.web.passive.success_rate]\nKV\n",
        "pools.web.passive.success_rate",
    ),
    ("[pools.web.retries]\nKV\n", "pools.web.retries"),
    ("[pools.web.timeouts]\nKV\n", "pools.web.timeouts"),
    ("[pools.web.tls]\nKV\n", "pools.web.tls"),
    (
        "[pools.web.agent]\nKV\n<port = 9100>\n<interval = \"5s\">\n<timeout = \"1s\">\n",
        "pools.web.agent",
    ),
    (
        "[pools.dyn.source]\nKV\n<kind = \"dns\">\n<name = \"web.internal\">\n<port = 80>\n",
        "pools.dyn.source",
    ),
    (
        "[pools.dyn.source]\nkind = \"etcd\"\nendpoints = [\"https://127.0.0.1:2379\"]\n\
         prefix = \"/web/\"\n[pools.dyn.source.tls]\nKV\n<ca_file = \"ca.pem\">\n",
        "pools.dyn.source.tls",
    ),
    ("[alerts]\nKV\n", "alerts"),
    (
        "[[alerts.webhooks]]\nKV\n<url = \"http://127.0.0.1:9000/\">\n",
        "alerts.webhooks[0]",
    ),
    (
        "[[alerts.commands]]\nKV\n<command = [\"true\"]>\n",
        "alerts.commands[0]",
    ),
    (
        "[fleet]\nKV\n<endpoints = [\"http://127.0.0.1:2379\"]>\n<group = \"edge\">\n",
        "fleet",
    ),
    (
        "[fleet]\nendpoints = [\"https://127.0.0.1:2379\"]\ngroup = \"edge\"\n[fleet.tls]\nKV\n\
         <ca_file = \"ca.pem\">\n",
        "fleet.tls",
    ),
];

/// Values of every TOML kind: each key refuses at least one of them.
const VALUES: &[&str] = &[
    "5",
    "-1",
    "1.5",
    "\"x\"",
    "true",
    "[]",
    "[5]",
    "{}",
    "{ zz = 1 }",
    "2024-01-01",
];

/// The config with `key = value` written in `table` (an entry of [`TABLES`]), and the line it
/// is on.
fn written(table: &str, key: &str, value: &str) -> (String, usize) {
    let entry = format!("{key} = {value}");
    // The parts in <...>: kept unless they are `key`'s own.
    let mut filled = String::new();
    let mut rest = table;
    while let Some((before, after)) = rest.split_once('<') {
        filled.push_str(before);
        let (part, after) = after.split_once('>').expect("closed");
        if !part
            .trim_start_matches(", ")
            .starts_with(&format!("{key} ="))
        {
            filled.push_str(part);
        }
        rest = after;
    }
    filled.push_str(rest);
    let filled = filled.replace("KV", &entry);
    let text = if !table.starts_with("KV") {
        format!("{}{filled}", super::MINIMAL)
    } else if ["listeners", "pools"].contains(&key) {
        // Both are in MINIMAL already: alone, then.
        filled
    } else {
        format!("{filled}{}", super::MINIMAL)
    };
    let at = text.find(&entry).expect("written");
    let line = text[..at].matches('\n').count() + 1;
    (text, line)
}

/// Whether `key` is `path` or a key inside it (`path.x`, `path[0]`).
fn names(key: &str, path: &str) -> bool {
    key.strip_prefix(path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_owned()
    } else {
        format!("{table}.{key}")
    }
}

/// Every error of `text` is one line without Rust's words, and those about `path` are on
/// `line`; returns how many are about `path`.
fn assert_worded(text: &str, path: &str, line: usize) -> usize {
    let Some(errors) = errors(text) else {
        return 0;
    };
    let mut about = 0;
    for error in errors.iter() {
        let shown = error.to_string();
        assert!(!shown.contains('\n'), "{shown:?}\n---\n{text}");
        if let Some(leak) = leak(&shown) {
            panic!("{shown:?} says {leak:?}\n---\n{text}");
        }
        // A key written twice is a syntax error, placed where TOML finds the second one.
        if text.parse::<toml::Table>().is_err() {
            continue;
        }
        // The entry is the only thing the reader of the file can get wrong.
        if matches!(error, ConfigError::Parse { .. }) {
            assert!(
                names(error.key(), path),
                "{shown} is not about {path}\n---\n{text}"
            );
        }
        if names(error.key(), path) {
            assert_eq!(error.line(), Some(line), "{shown}\n---\n{text}");
            about += 1;
        }
    }
    about
}

/// The keys `table` takes, as its unknown-key error lists them; `None` for a table of any keys
/// (`headers`).
fn keys_of(table: &str, path: &str) -> Option<Vec<String>> {
    let (text, line) = written(table, "zz_unknown", "1");
    let errors = errors(&text).unwrap_or_else(|| panic!("an unknown key passed:\n{text}"));
    let error = errors.first();
    assert_eq!(
        error.key(),
        join(path, "zz_unknown"),
        "{error}\n---\n{text}"
    );
    assert_eq!(error.line(), Some(line), "{error}\n---\n{text}");
    let shown = error.to_string();
    let list = shown
        .split_once("unknown key \"zz_unknown\" (the keys here are ")?
        .1;
    let list = list.strip_suffix(')').expect("the list closes the message");
    Some(list.split(", ").map(str::to_owned).collect())
}

/// For every table: an unknown key is placed and lists the keys allowed; then for each of
/// those keys, every kind of value is tried, and each key refuses at least one, on its own
/// line and under its full path; no message says a Rust type or a serde term.
#[test]
fn every_key_of_every_table_refuses_a_wrong_type_in_the_operators_words() {
    let mut tried = 0;
    for &(table, path) in TABLES {
        let Some(keys) = keys_of(table, path) else {
            for value in VALUES {
                let (text, line) = written(table, "X-Any", value);
                assert_worded(&text, &join(path, "X-Any"), line);
            }
            continue;
        };
        assert!(!keys.is_empty(), "{path}");
        for key in &keys {
            let at = join(path, key);
            let mut refused = false;
            for value in VALUES {
                let (text, line) = written(table, key, value);
                refused |= assert_worded(&text, &at, line) > 0;
                tried += 1;
            }
            if !refused {
                let (text, _) = written(table, key, VALUES[0]);
                let said = errors(&text).map(|errors| errors.to_string());
                panic!(
                    "{at} took every kind of value; with {}: {said:?}",
                    VALUES[0]
                );
            }
        }
    }
    assert!(tried > 1500, "only {tried} combinations");
}

/// A TOML value of any kind, nested a little: numbers, strings (with quotes, backslashes and
/// control characters escaped), booleans, dates, lists and inline tables.
fn toml_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (-1e9f64..1e9).prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        "\\PC{0,12}".prop_map(|s| toml::Value::String(s).to_string()),
        Just("1979-05-27T07:32:00Z".to_owned()),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|values| format!("[{}]", values.join(", "))),
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..3).prop_map(|entries| {
                let mut seen = std::collections::HashSet::new();
                let entries: Vec<String> = entries
                    .into_iter()
                    .filter(|(key, _)| seen.insert(key.clone()))
                    .map(|(key, value)| format!("{key} = {value}"))
                    .collect();
                format!("{{ {} }}", entries.join(", "))
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any value at any key of any table: every message is one line in the operator's words,
    /// and an error about that key is on its line.
    #[test]
    fn any_value_anywhere_is_refused_in_the_operators_words(
        table in 0..TABLES.len(),
        key in prop_oneof![
            "[a-z_]{1,10}",
            Just("weight".to_owned()),
            Just("backends".to_owned()),
            Just("address".to_owned()),
            Just("tls".to_owned()),
            Just("kind".to_owned()),
            Just("active".to_owned()),
        ],
        value in toml_value(),
    ) {
        let (table, path) = TABLES[table];
        let (text, line) = written(table, &key, &value);
        assert_worded(&text, &join(path, &key), line);
    }
}

//! `${VAR}`, `${VAR:-default}`, `$${` and `admin.token_file`.

use capataz::config::{self, Environment};

use super::{capataz, shown, TempDir};

const BASE: &str = r#"
[admin]
address = "127.0.0.1:0"
token = "${ADMIN_TOKEN}"

[[listeners]]
address = "${LISTEN:-127.0.0.1:0}"

[pools.web]
backends = [{ name = "a", address = "${BACKEND}" }]
"#;

/// An error, as the tests look at it.
#[derive(Debug)]
struct Placed {
    line: Option<usize>,
    key: String,
    text: String,
}

fn parse(text: &str, env: &[(&str, &str)]) -> Result<config::Config, Vec<Placed>> {
    config::parse_all_errors(
        text,
        "app.toml",
        &Environment::from_pairs(env.iter().copied()),
    )
    .map(|unresolved| unresolved.config().clone())
    .map_err(|errors| {
        errors
            .iter()
            .map(|e| Placed {
                line: e.line(),
                key: e.key().to_owned(),
                text: e.to_string(),
            })
            .collect()
    })
}

#[test]
fn variables_and_defaults_fill_string_values() {
    let env = [("ADMIN_TOKEN", "s3cret"), ("BACKEND", "127.0.0.1:9001")];
    let config = parse(BASE, &env).expect("valid");
    let admin = config.admin.as_ref().expect("admin");
    assert_eq!(admin.token.as_deref(), Some("s3cret"));
    assert_eq!(config.listeners[0].address.to_string(), "127.0.0.1:0");
    assert_eq!(config.pools[0].backends[0].address, "127.0.0.1:9001");

    // A set variable wins over the default; an empty one takes it.
    let set = [("LISTEN", "127.0.0.1:8181"), env[0], env[1]];
    let config = parse(BASE, &set).expect("valid");
    assert_eq!(config.listeners[0].address.to_string(), "127.0.0.1:8181");
    let empty = [("LISTEN", ""), env[0], env[1]];
    let config = parse(BASE, &empty).expect("valid");
    assert_eq!(config.listeners[0].address.to_string(), "127.0.0.1:0");
}

#[test]
fn every_undefined_variable_is_an_error_naming_its_line_and_key() {
    let errors = parse(BASE, &[]).unwrap_err();
    let placed: Vec<(Option<usize>, &str)> =
        errors.iter().map(|e| (e.line, e.key.as_str())).collect();
    assert_eq!(
        placed,
        [
            (Some(4), "admin.token"),
            (Some(10), "pools.web.backends[0].address")
        ]
    );
    let message = &errors[0].text;
    assert!(
        message.starts_with("app.toml:4: admin.token: environment variable ADMIN_TOKEN is not set"),
        "{message}"
    );
    // The single-error API gives the first.
    let first = config::parse_unresolved(
        &BASE.replace("ADMIN_TOKEN", "CAPATAZ_TEST_SURELY_UNSET_VARIABLE"),
        "app.toml",
    )
    .unwrap_err();
    assert_eq!((first.line(), first.key()), (Some(4), "admin.token"));
}

#[test]
fn a_doubled_dollar_keeps_a_literal_reference_and_values_are_not_expanded_again() {
    let text = BASE.replace("${ADMIN_TOKEN}", "$${ADMIN_TOKEN}");
    let env = [("BACKEND", "127.0.0.1:9001"), ("ADMIN_TOKEN", "unused")];
    let config = parse(&text, &env).expect("valid");
    assert_eq!(
        config.admin.as_ref().and_then(|a| a.token.as_deref()),
        Some("${ADMIN_TOKEN}")
    );
    // A value holding `${...}` is taken as it is.
    let env = [("BACKEND", "127.0.0.1:9001"), ("ADMIN_TOKEN", "${BACKEND}")];
    let config = parse(BASE, &env).expect("valid");
    assert_eq!(
        config.admin.as_ref().and_then(|a| a.token.as_deref()),
        Some("${BACKEND}")
    );
}

#[test]
fn an_expanded_value_is_validated_like_a_written_one_on_its_line() {
    let env = [("ADMIN_TOKEN", "t"), ("BACKEND", "no port here")];
    let errors = parse(BASE, &env).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].line, errors[0].key.as_str()),
        (Some(10), "pools.web.backends[0].address")
    );
    assert!(errors[0].text.contains("\"no port here\""));
}

#[test]
fn the_binary_expands_variables_from_its_environment() {
    let dir = TempDir::new("env");
    let file = dir.write("app.toml", BASE);
    let path = shown(&file);
    let env = [("ADMIN_TOKEN", "s3cret"), ("BACKEND", "127.0.0.1:9001")];
    let out = capataz(&["check", &path], &env);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(": valid (1 listeners"),
        "{}",
        out.stdout
    );

    let out = capataz(&["check", &path], &env[1..]);
    assert_eq!(out.code, Some(2), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.starts_with(&format!(
            "{path}:4: admin.token: environment variable ADMIN_TOKEN is not set"
        )),
        "{}",
        out.stderr
    );
}

const WITH_TOKEN_FILE: &str = r#"
[admin]
address = "127.0.0.1:0"
token_file = "admin.token"

[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]
"#;

#[test]
fn a_token_file_is_read_relative_to_the_config_without_its_line_break() {
    let dir = TempDir::new("token");
    dir.write("admin.token", "from-a-file\r\n");
    let file = dir.write("app.toml", WITH_TOKEN_FILE);
    let config = config::load(&file).expect("valid");
    assert_eq!(
        config.admin.as_ref().and_then(|a| a.token.as_deref()),
        Some("from-a-file")
    );
    // Before resolution nothing is read, and the token is not known yet.
    let unresolved = config::parse_unresolved(WITH_TOKEN_FILE, &shown(&file)).expect("valid");
    assert_eq!(unresolved.config().admin.as_ref().unwrap().token, None);
    let files: Vec<_> = unresolved.files().collect();
    assert_eq!(files, [dir.path.join("admin.token").as_path()]);
}

#[test]
fn a_token_file_that_cannot_be_used_is_an_error_naming_the_file_and_line() {
    let dir = TempDir::new("token-bad");
    let file = dir.write("app.toml", WITH_TOKEN_FILE);
    let token = shown(&dir.path.join("admin.token"));
    let message = config::load(&file).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!(
            "{}:4: admin.token_file: {token}: cannot read the secret",
            shown(&file)
        )),
        "{message}"
    );
    for (contents, says) in [
        ("two words\n", "printable ASCII without spaces"),
        ("\n", "printable ASCII without spaces"),
        (&"x".repeat(5000)[..], "larger than 4 KiB"),
    ] {
        dir.write("admin.token", contents);
        let error = config::load(&file).unwrap_err();
        assert_eq!((error.line(), error.key()), (Some(4), "admin.token_file"));
        assert!(error.to_string().contains(says), "{error}");
        assert!(!error.to_string().contains("two words"), "{error}");
    }
    let both = WITH_TOKEN_FILE.replace("token_file", "token = \"t\"\ntoken_file");
    let error = config::parse_unresolved(&both, "app.toml").unwrap_err();
    assert_eq!((error.line(), error.key()), (Some(5), "admin.token_file"));
}

/// A non-loopback admin address needs a token: a token file counts.
#[test]
fn a_token_file_satisfies_the_token_rule_of_a_public_admin_address() {
    let text = WITH_TOKEN_FILE.replace(
        "address = \"127.0.0.1:0\"\ntoken_file",
        "address = \"0.0.0.0:0\"\ntoken_file",
    );
    assert!(config::parse_unresolved(&text, "app.toml").is_ok());
    let without = text.replace("token_file = \"admin.token\"", "");
    assert_eq!(
        config::parse_unresolved(&without, "app.toml")
            .unwrap_err()
            .key(),
        "admin.address"
    );
}

#[tokio::test]
async fn a_reload_reads_the_token_file_again() {
    let dir = TempDir::new("token-reload");
    let backend = capataz::sim::SimBackend::start("a", crate::support::any())
        .await
        .expect("backend");
    dir.write("admin.token", "first\n");
    let text = WITH_TOKEN_FILE.replace("127.0.0.1:9001", &backend.addr().to_string());
    let file = dir.write("app.toml", &text);
    let config = tokio::task::spawn_blocking({
        let file = file.clone();
        move || config::load(&file)
    })
    .await
    .unwrap()
    .expect("valid");
    let (events, _rx) = tokio::sync::broadcast::channel(64);
    let balancer = capataz::server::Balancer::start_with_path(&config, events, Some(file))
        .await
        .expect("starts");
    let token = |b: &capataz::server::Balancer| {
        b.supervisor()
            .config()
            .admin
            .as_ref()
            .and_then(|a| a.token.clone())
    };
    assert_eq!(token(&balancer).as_deref(), Some("first"));
    dir.write("admin.token", "second\n");
    balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect("reload");
    assert_eq!(token(&balancer).as_deref(), Some("second"));
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

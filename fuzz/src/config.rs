//! The `config` target: any UTF-8 text through `capataz::config::parse_unresolved`.
//!
//! The loader must never panic, whatever the text. When it accepts the text, the config has at
//! least one listener and one pool, and `config::check` (the warnings) runs on it too. When it
//! refuses, the message is the promised single line for the user: it starts with the source
//! name, holds no line break, and the line it names lies within the text.
//!
//! The target goes through `config::parse_unresolved`, which checks host names without looking
//! them up, so no input sends a DNS query (a fuzzer would otherwise send a stream of them for
//! made-up names to the machine's resolver). An IP literal is still turned into its address, and
//! `Unresolved::resolve` of a config without names must then give the same config. A config
//! with TLS certificate files is not resolved (no input makes the target read a file).

/// The source name the target gives the loader.
pub const SOURCE: &str = "<fuzz>";

/// Checks one input; panics on the first violation.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match capataz::config::parse_unresolved(text, SOURCE) {
        Ok(unresolved) => {
            let config = unresolved.config().clone();
            // A config naming TLS files is not resolved here: that would read files.
            if unresolved.names().next().is_none() && unresolved.files().next().is_none() {
                let resolved = unresolved.resolve().expect("nothing to resolve");
                assert_eq!(resolved, config, "resolving no names changed the config");
            }
            assert_eq!(config.source, SOURCE);
            assert!(!config.listeners.is_empty(), "a config without listeners");
            assert!(!config.pools.is_empty(), "a config without pools");
            for warning in capataz::config::check(&config) {
                assert!(!warning.to_string().is_empty());
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.starts_with(SOURCE),
                "the message does not name the source: {message:?}"
            );
            assert!(
                !message.contains(['\n', '\r']),
                "the message is not one line: {message:?}"
            );
            if let Some(line) = error.line() {
                let lines = text.matches('\n').count() + 1;
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of a text of {lines} lines: {message:?}"
                );
            }
        }
    }
}

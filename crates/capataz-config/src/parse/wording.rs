//! The TOML parser's and serde's messages in the operator's words.
//!
//! serde says what it expected in Rust's terms ("invalid type: floating point `1.5`, expected
//! i64", "a sequence", "a map"). The raw model already expects "a table" and `one of "a", "b"`
//! (see `raw::shapes`); this turns every message into `WHAT is not WHAT-IS-ALLOWED (how to
//! write it)` or `unknown key "x" (the keys here are ...)`, so that no Rust type, serde term or
//! field count reaches the operator.

use std::fmt::Write as _;

/// A deserialization error's message (the text parsed as TOML, but a value has the wrong type
/// or a key is unknown). `found` is what is written there, as `place::Place::found` shows it;
/// `key` is its full path.
pub(super) fn shape_message(message: &str, found: &str, key: &str) -> String {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, allowed) = split_unknown(rest);
        return unknown_key(name, &allowed);
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (name, allowed) = split_unknown(rest);
        let words: Vec<String> = allowed.iter().map(|word| format!("{word:?}")).collect();
        return wrong_kind(
            &format!("{name:?}"),
            &format!("one of {}", words.join(", ")),
            key,
        );
    }
    for prefix in ["invalid type: ", "invalid value: ", "invalid length "] {
        if let Some((_, expected)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.rsplit_once(", expected "))
        {
            return wrong_kind(found, expected, key);
        }
    }
    format!(
        "{} (docs/config.md gives each key's type)",
        one_line(message)
    )
}

/// A syntax error's message (the text is not TOML), on one line, with a hint, and quoting
/// like the other messages (`duplicate key "address"`, not `` `address` ``).
pub(super) fn syntax_message(message: &str) -> String {
    let message = one_line(message.trim()).replace('`', "\"");
    // The integer parser's own words (Rust's `ParseIntError`).
    if message.contains("number too large to fit in target type") {
        return format!(
            "the number is too large (a whole number is at most {})",
            i64::MAX
        );
    }
    if message.contains("number too small to fit in target type") {
        return format!(
            "the number is too small (a whole number is at least {})",
            i64::MIN
        );
    }
    format!("{message} (this is not valid TOML here)")
}

/// `found` where `expected` (serde's words, or the raw model's) belongs.
fn wrong_kind(found: &str, expected: &str, key: &str) -> String {
    let (allowed, how) = match expected {
        "a table" | "a map" => ("a table".to_owned(), table_hint(key)),
        "a sequence" => (
            "a list".to_owned(),
            r#"write the values in brackets, e.g. ["a", "b"]"#.to_owned(),
        ),
        "i64" | "u64" | "i32" | "u32" | "u16" | "u8" | "an integer" => (
            "a whole number".to_owned(),
            "write digits without quotes or a decimal point, e.g. 3".to_owned(),
        ),
        "a boolean" => (
            "true or false".to_owned(),
            "write true or false, without quotes".to_owned(),
        ),
        "a string" | "a borrowed string" => (
            "a string".to_owned(),
            "write it in double quotes".to_owned(),
        ),
        _ if expected.starts_with("one of ") => {
            let words = quoted_words(expected);
            let how = match found.strip_prefix('"').and_then(|f| f.strip_suffix('"')) {
                Some(word) => match suggestion(word, &words) {
                    Some(close) => format!("did you mean {close:?}?"),
                    None => String::new(),
                },
                None => "write the word in double quotes".to_owned(),
            };
            (expected.to_owned(), how)
        }
        _ => (expected.to_owned(), String::new()),
    };
    let mut message = format!("{found} is not {allowed}");
    if !how.is_empty() {
        let _ = write!(message, " ({how})");
    }
    message
}

/// How to write a table at `key`: a section, or an inline table.
fn table_hint(key: &str) -> String {
    // `listeners[0].tls` is written in the section `[listeners.tls]`.
    let mut header = String::with_capacity(key.len());
    let mut in_index = false;
    for c in key.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            _ if !in_index => header.push(c),
            _ => {}
        }
    }
    if key.ends_with(']') {
        return format!("write each one as {{ key = value, ... }}, or as a [[{header}]] section");
    }
    let last = header.rsplit('.').next().unwrap_or(&header);
    format!(
        "write a [{header}] section with its keys on the lines below it, or \
         {last} = {{ key = value, ... }}"
    )
}

/// `unknown key "x"`, a close match if there is one, and the keys that are allowed.
fn unknown_key(name: &str, allowed: &[&str]) -> String {
    let mut message = format!("unknown key {:?}", name);
    if let Some(close) = suggestion(name, allowed) {
        let _ = write!(message, ": did you mean {close:?}?");
    }
    if allowed.is_empty() {
        message.push_str(" (this table takes no keys)");
    } else {
        let _ = write!(message, " (the keys here are {})", allowed.join(", "));
    }
    message
}

/// The name and the allowed words of serde's "unknown field `x`, expected one of `a`, `b`"
/// (`rest` starts after the first backtick); the name may itself hold backticks.
fn split_unknown(rest: &str) -> (&str, Vec<&str>) {
    let end = rest
        .rfind("`, expected ")
        .or_else(|| rest.rfind("`, there are no"))
        .unwrap_or(rest.len());
    let name = &rest[..end];
    let list = rest.get(end + 1..).unwrap_or_default();
    // serde writes the words in backticks: `a`, `a` or `b`, one of `a`, `b`, `c`.
    let words = list.split('`').skip(1).step_by(2).collect();
    (name, words)
}

/// The words in double quotes in `text` (`one of "a", "b"`).
fn quoted_words(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

/// The allowed word closest to `word`, if it is close enough to be a typo: the same but for
/// case, or one edit away (two for longer words), a swap of neighbours counting as one.
fn suggestion<'w>(word: &str, allowed: &[&'w str]) -> Option<&'w str> {
    let word = word.to_ascii_lowercase();
    let most = if word.chars().count() > 4 { 2 } else { 1 };
    allowed
        .iter()
        .map(|&candidate| {
            (
                edit_distance(&word, &candidate.to_ascii_lowercase()),
                candidate,
            )
        })
        .filter(|&(distance, _)| distance <= most)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// neighbours. Words longer than 64 characters are never close (and cost nothing).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            d[i * width + j] = if i == 0 || j == 0 {
                i + j
            } else {
                let cost = usize::from(a[i - 1] != b[j - 1]);
                let mut best = (d[(i - 1) * width + j] + 1)
                    .min(d[i * width + j - 1] + 1)
                    .min(d[(i - 1) * width + j - 1] + cost);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    best = best.min(d[(i - 2) * width + j - 2] + 1);
                }
                best
            };
        }
    }
    d[a.len() * width + b.len()]
}

fn one_line(text: &str) -> String {
    super::one_line(&text.replace('\n', "; ")).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_become_the_operators_words() {
        let key = "pools.web.backends[1]";
        for (message, found, expected) in [
            (
                "invalid type: floating point `1.5`, expected i64",
                "1.5",
                "1.5 is not a whole number (write digits without quotes or a decimal point, e.g. 3)",
            ),
            (
                "invalid type: string \"yes\", expected a boolean",
                "\"yes\"",
                "\"yes\" is not true or false (write true or false, without quotes)",
            ),
            (
                "invalid length 0, expected a table",
                "a list",
                "a list is not a table (write each one as { key = value, ... }, or as a \
                 [[pools.web.backends]] section)",
            ),
            (
                "invalid value: string \"round-robin\", expected one of \"round_robin\", \
                 \"least_request\"",
                "\"round-robin\"",
                "\"round-robin\" is not one of \"round_robin\", \"least_request\" (did you mean \
                 \"round_robin\"?)",
            ),
            (
                "invalid type: integer `5`, expected one of \"up\", \"down\"",
                "5",
                "5 is not one of \"up\", \"down\" (write the word in double quotes)",
            ),
            (
                "unknown field `wieght`, expected one of `name`, `address`, `weight`",
                "2",
                "unknown key \"wieght\": did you mean \"weight\"? (the keys here are name, \
                 address, weight)",
            ),
            (
                "unknown field `a`b`, expected `name` or `address`",
                "2",
                "unknown key \"a`b\" (the keys here are name, address)",
            ),
            (
                "unknown field `x`, there are no fields",
                "2",
                "unknown key \"x\" (this table takes no keys)",
            ),
            (
                "something new\nfrom serde",
                "2",
                "something new; from serde (docs/config.md gives each key's type)",
            ),
        ] {
            assert_eq!(shape_message(message, found, key), expected, "{message}");
        }
        assert_eq!(
            shape_message(
                "invalid type: sequence, expected a table",
                "a list",
                "listeners[0].tls"
            ),
            "a list is not a table (write a [listeners.tls] section with its keys on the lines \
             below it, or tls = { key = value, ... })"
        );
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let keys = ["name", "address", "weight", "backup", "agent_port", "track"];
        assert_eq!(suggestion("wieght", &keys), Some("weight"));
        assert_eq!(suggestion("Weight", &keys), Some("weight"));
        assert_eq!(suggestion("adress", &keys), Some("address"));
        assert_eq!(suggestion("nam", &keys), Some("name"));
        assert_eq!(suggestion("colour", &keys), None);
        assert_eq!(suggestion("x", &keys), None);
        assert_eq!(suggestion(&"a".repeat(1000), &keys), None);
        assert_eq!(edit_distance("ab", "ba"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn integer_overflow_is_said_plainly() {
        assert_eq!(
            syntax_message("number too large to fit in target type"),
            "the number is too large (a whole number is at most 9223372036854775807)"
        );
        assert_eq!(
            syntax_message("invalid table header\nduplicate key `backends`"),
            "invalid table header; duplicate key \"backends\" (this is not valid TOML here)"
        );
    }
}

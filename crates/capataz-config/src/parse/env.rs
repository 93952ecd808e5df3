//! Environment substitution in string values: `${VAR}` and `${VAR:-default}`.
//!
//! The rules (docs/config.md, "Environment variables"):
//! - Only string values are expanded, never keys, numbers or booleans; basic and literal
//!   strings alike.
//! - A name is `[A-Za-z_][A-Za-z0-9_]*`. `${VAR}` is the variable's value (empty if set and
//!   empty); an unset one is an error naming the line and key. `${VAR:-default}` is the default
//!   when the variable is unset or empty; the default is taken literally up to the first `}`
//!   and may not hold a `${` (no nesting).
//! - `$${` is a literal `${`; any other `$` is itself.
//! - A value is expanded once: a `${` inside a variable's value or a default stays as it is.
//! - An expanded string is at most [`MAX_EXPANDED`] bytes, and a file grows by at most
//!   [`MAX_GROWTH`] in all, so a variable cannot blow a small file up.
//!
//! It works on the parsed values, with their spans: each string that needs it is found by
//! walking the file's values (keeping the exact key path), expanded, and written back over its
//! span as a TOML string of the same number of lines, so every later error still names the
//! line the operator wrote. The file is then parsed as usual.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize as _;
use toml::{Spanned, Value};

use super::locate::line_of;
use super::ConfigError;

/// The longest string an expansion may give: 64 KiB.
pub(super) const MAX_EXPANDED: usize = 64 << 10;

/// How much expansions may add to a file in all: 16 MiB.
pub(super) const MAX_GROWTH: usize = 16 << 20;

/// Where `${VAR}` looks variables up: the process's environment, or a fixed set (for tests and
/// embedding).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    fixed: Option<HashMap<String, String>>,
}

impl Environment {
    /// The process's environment, read when a variable is needed.
    pub fn process() -> Environment {
        Environment { fixed: None }
    }

    /// Exactly these variables, and no others.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Environment {
        Environment {
            fixed: Some(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ),
        }
    }

    /// The variable's value, `None` if unset; an error if it is not UTF-8.
    fn var(&self, name: &str) -> Result<Option<String>, ExpandError> {
        match &self.fixed {
            Some(vars) => Ok(vars.get(name).cloned()),
            None => match std::env::var(name) {
                Ok(value) => Ok(Some(value)),
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => Err(ExpandError::NotUnicode {
                    name: name.to_owned(),
                }),
            },
        }
    }
}

/// `text` with every string value expanded, or the errors of every string that could not be.
/// Text that does not parse is returned as it is: the parser proper reports it.
pub(super) fn substitute<'t>(
    text: &'t str,
    file: &str,
    env: &Environment,
) -> Result<std::borrow::Cow<'t, str>, Vec<ConfigError>> {
    // A `$` can only reach a value through itself or a unicode escape.
    if !text.contains('$') && !text.contains("\\u") && !text.contains("\\U") {
        return Ok(text.into());
    }
    let Ok(shape) = toml::from_str::<toml::Table>(text) else {
        return Ok(text.into());
    };
    let found = std::cell::RefCell::new(Vec::new());
    let walk = Walk {
        shape: Shape::Table(&shape),
        path: String::new(),
        found: &found,
    };
    if walk.deserialize(toml::Deserializer::new(text)).is_err() {
        // The same text parsed a moment ago; leave any surprise to the parser proper.
        return Ok(text.into());
    }
    let mut edits = Vec::new();
    let mut errors = Vec::new();
    let mut growth = 0usize;
    for (key, span, value) in found.into_inner() {
        let error = |message: String| ConfigError::Invalid {
            file: file.to_owned(),
            line: Some(line_of(text, span.start)),
            key: key.clone(),
            message,
        };
        match expand(&value, env) {
            Ok(None) => {}
            Ok(Some(expanded)) => {
                let newlines = text[span.clone()].matches('\n').count();
                let literal = toml_literal(&expanded, newlines);
                growth = growth.saturating_add(literal.len().saturating_sub(span.len()));
                if growth > MAX_GROWTH {
                    errors.push(error(format!(
                        "environment substitution makes the file more than {} MiB larger \
                         (keep large values out of variables)",
                        MAX_GROWTH >> 20
                    )));
                    break;
                }
                edits.push((span, literal));
            }
            Err(why) => errors.push(error(why.to_string())),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    if edits.is_empty() {
        return Ok(text.into());
    }
    edits.sort_by_key(|(span, _)| span.start);
    let mut out = String::with_capacity(text.len() + growth);
    let mut at = 0;
    for (span, literal) in edits {
        // Spans of distinct string values never overlap; skip one that would.
        if span.start < at || span.end > text.len() {
            continue;
        }
        out.push_str(&text[at..span.start]);
        out.push_str(&literal);
        at = span.end;
    }
    out.push_str(&text[at..]);
    Ok(out.into())
}

/// How to write a reference, for the errors about one.
const HINT: &str = "write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_' not \
                    starting with a digit; $${ is a literal ${";

/// Why a string value cannot be expanded: the rest of a config error at its key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum ExpandError {
    #[error("environment variable {name} is not valid UTF-8 (set it to text)")]
    NotUnicode { name: String },
    #[error(
        "environment variable {name} is not set (set it, give a default with \
         ${{{name}:-default}}, or write $${{ for a literal ${{)"
    )]
    NotSet { name: String },
    #[error("\"${{\" is not followed by a variable name ({HINT})")]
    NoName,
    #[error("${{{name}:- has no closing \"}}\" ({HINT})")]
    Unclosed { name: String },
    #[error(
        "the default of ${{{name}}} holds a \"${{\": substitution does not nest (write the \
         default literally, or $${{ for a literal ${{)"
    )]
    Nested { name: String },
    /// Not a reference (its first 40 characters after `${`).
    #[error("\"${{{shown}\" is not a variable reference ({HINT})")]
    NotAReference { shown: String },
    #[error(
        "the value is longer than {} KiB once expanded (keep large values out of variables)",
        MAX_EXPANDED >> 10
    )]
    TooLong,
}

/// Expands `value`: `None` when it holds nothing to expand (not even a `$${`).
pub(super) fn expand(value: &str, env: &Environment) -> Result<Option<String>, ExpandError> {
    if !value.contains("${") {
        return Ok(None);
    }
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let (text, tail) = variable(inner, env)?;
            out.push_str(&text);
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
        if out.len() > MAX_EXPANDED {
            return Err(ExpandError::TooLong);
        }
    }
    out.push_str(rest);
    if out.len() > MAX_EXPANDED {
        return Err(ExpandError::TooLong);
    }
    Ok(Some(out))
}

/// Reads `NAME}` or `NAME:-default}` from `inner` (just after `${`): the text it stands for and
/// what follows the `}`.
fn variable<'a>(inner: &'a str, env: &Environment) -> Result<(String, &'a str), ExpandError> {
    let name_len = inner
        .char_indices()
        .find(|&(i, c)| !(c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())))
        .map_or(inner.len(), |(i, _)| i);
    let name = &inner[..name_len];
    let after = &inner[name_len..];
    if name.is_empty() {
        return Err(ExpandError::NoName);
    }
    let (default, tail) = if let Some(tail) = after.strip_prefix('}') {
        (None, tail)
    } else if let Some(rest) = after.strip_prefix(":-") {
        let Some(end) = rest.find('}') else {
            return Err(ExpandError::Unclosed {
                name: name.to_owned(),
            });
        };
        let default = &rest[..end];
        if default.contains("${") {
            return Err(ExpandError::Nested {
                name: name.to_owned(),
            });
        }
        (Some(default), &rest[end + 1..])
    } else {
        let shown: String = inner.chars().take(40).collect();
        return Err(ExpandError::NotAReference { shown });
    };
    let value = env.var(name)?;
    let text = match (value, default) {
        (Some(value), None) => value,
        (Some(value), Some(_)) if !value.is_empty() => value,
        (_, Some(default)) => default.to_owned(),
        (None, None) => {
            return Err(ExpandError::NotSet {
                name: name.to_owned(),
            })
        }
    };
    if text.len() > MAX_EXPANDED {
        return Err(ExpandError::TooLong);
    }
    Ok((text, tail))
}

/// `value` as a TOML basic string spanning `newlines` more lines (so that the lines after it
/// keep their numbers): a multi-line string whose line breaks are trimmed by `\`.
fn toml_literal(value: &str, newlines: usize) -> String {
    let mut out = String::with_capacity(value.len() + 8 + newlines);
    out.push_str(if newlines == 0 { "\"" } else { "\"\"\"" });
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    if newlines == 0 {
        out.push('"');
    } else {
        out.push('\\');
        out.extend(std::iter::repeat_n('\n', newlines));
        out.push_str("\"\"\"");
    }
    out
}

/// What a value is, from a first parse without spans: it tells the second walk where asking
/// for a span is safe (a table implied by a dotted key has none, and asking fails).
#[derive(Clone, Copy)]
enum Shape<'a> {
    Table(&'a toml::Table),
    Array(&'a [Value]),
    String(&'a str),
    Other,
}

impl<'a> Shape<'a> {
    fn of(value: &'a Value) -> Shape<'a> {
        match value {
            Value::Table(table) => Shape::Table(table),
            Value::Array(items) => Shape::Array(items),
            Value::String(text) => Shape::String(text),
            _ => Shape::Other,
        }
    }

    /// Whether a string below holds a `${` (nothing to do otherwise).
    fn wanted(&self) -> bool {
        match self {
            Shape::Table(table) => table.values().any(|v| Shape::of(v).wanted()),
            Shape::Array(items) => items.iter().any(|v| Shape::of(v).wanted()),
            Shape::String(text) => text.contains("${"),
            Shape::Other => false,
        }
    }
}

/// The strings holding `${` found so far: key path, span, value.
type Found = std::cell::RefCell<Vec<(String, Range<usize>, String)>>;

/// Walks one value with its shape, recording the strings that need expanding.
struct Walk<'s, 'f> {
    shape: Shape<'s>,
    path: String,
    found: &'f Found,
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if !self.shape.wanted() {
            return IgnoredAny::deserialize(deserializer).map(drop);
        }
        match self.shape {
            Shape::String(_) => {
                let value = Spanned::<String>::deserialize(deserializer)?;
                let span = value.span();
                self.found
                    .borrow_mut()
                    .push((self.path, span, value.into_inner()));
                Ok(())
            }
            Shape::Table(_) => deserializer.deserialize_map(self),
            Shape::Array(_) => deserializer.deserialize_seq(self),
            Shape::Other => IgnoredAny::deserialize(deserializer).map(drop),
        }
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table or an array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Shape::Table(table) = self.shape else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        while let Some(key) = map.next_key::<String>()? {
            match table.get(&key) {
                Some(value) => map.next_value_seed(Walk {
                    shape: Shape::of(value),
                    path: if self.path.is_empty() {
                        key
                    } else {
                        format!("{}.{key}", self.path)
                    },
                    found: self.found,
                })?,
                None => map.next_value::<IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let items = match self.shape {
            Shape::Array(items) => items,
            _ => &[],
        };
        let mut index = 0;
        loop {
            let walk = Walk {
                shape: items.get(index).map_or(Shape::Other, Shape::of),
                path: format!("{}[{index}]", self.path),
                found: self.found,
            };
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Environment {
        Environment::from_pairs([("HOST", "10.0.0.5"), ("EMPTY", ""), ("ODD", "a\"b\\c${X}")])
    }

    #[test]
    fn variables_defaults_and_escapes_expand_once() {
        let env = env();
        let x = |v: &str| expand(v, &env);
        assert_eq!(x("plain $ text"), Ok(None));
        assert_eq!(x("${HOST}:80"), Ok(Some("10.0.0.5:80".into())));
        assert_eq!(
            x("${MISSING:-127.0.0.1}:80"),
            Ok(Some("127.0.0.1:80".into()))
        );
        assert_eq!(x("${EMPTY:-d}"), Ok(Some("d".into())));
        assert_eq!(x("[${EMPTY}]"), Ok(Some("[]".into())));
        assert_eq!(x("$${HOST}"), Ok(Some("${HOST}".into())));
        assert_eq!(x("$$${HOST}"), Ok(Some("$${HOST}".into())));
        // Values are not expanded again.
        assert_eq!(x("${ODD}"), Ok(Some("a\"b\\c${X}".into())));
        assert_eq!(x("${MISSING:-}"), Ok(Some(String::new())));
    }

    #[test]
    fn bad_references_are_errors_that_say_what_to_write() {
        let env = env();
        for (value, says) in [
            ("${MISSING}", "environment variable MISSING is not set"),
            ("${}", "is not followed by a variable name"),
            ("${1A}", "is not followed by a variable name"),
            ("${HOST", "is not a variable reference"),
            ("${HO-ST}", "is not a variable reference"),
            ("${A:-x", "has no closing"),
            ("${A:-${B}}", "does not nest"),
        ] {
            let error = expand(value, &env).unwrap_err().to_string();
            assert!(error.contains(says), "{value}: {error}");
        }
    }

    #[test]
    fn an_expansion_is_bounded() {
        let big = "x".repeat(MAX_EXPANDED + 1);
        let env = Environment::from_pairs([("BIG", big.as_str()), ("HALF", &big[..40_000])]);
        assert!(expand("${BIG}", &env)
            .unwrap_err()
            .to_string()
            .contains("longer than 64 KiB"));
        assert!(expand("${HALF}${HALF}", &env)
            .unwrap_err()
            .to_string()
            .contains("longer than 64 KiB"));
    }

    #[test]
    fn substitution_keeps_lines_and_leaves_keys_alone() {
        let text =
            "a = \"\"\"\n${HOST}\n\"\"\"\n\"${HOST}\" = '${EMPTY:-x}'\nn = 1\nt.u = [\"${ODD}\"]\n";
        let out = substitute(text, "<t>", &env()).unwrap();
        let table: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(table["a"].as_str(), Some("10.0.0.5\n"));
        assert_eq!(table["${HOST}"].as_str(), Some("x"));
        assert_eq!(table["t"]["u"][0].as_str(), Some("a\"b\\c${X}"));
        assert_eq!(out.lines().count(), text.lines().count());
        assert_eq!(out.lines().nth(4), Some("n = 1"));
    }

    #[test]
    fn every_undefined_variable_is_reported_with_its_line_and_key() {
        let text = "[a]\nx = \"${NOPE}\"\n[[b]]\ny = [\"ok\", \"${ALSO_NOPE}\"]\n";
        let errors = substitute(text, "<t>", &env()).unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            shown[0].starts_with("<t>:2: a.x: environment variable NOPE"),
            "{shown:?}"
        );
        assert!(shown[1].starts_with("<t>:4: b[0].y[1]: environment variable ALSO_NOPE"));
    }

    proptest::proptest! {
        #[test]
        fn expansion_never_panics(value in "\\PC{0,40}") {
            let _ = expand(&value, &env());
        }
    }
}

//! What a route asks of a request beyond its host and path prefix (methods, exact path, path
//! regex, header and query matchers), validated. All of them must match (AND); a route that
//! has none carries no [`RouteMatch`] at all, so routing it costs what host and prefix cost.
//!
//! Regexes are the `regex` crate's: matching is linear in the text's length whatever the
//! pattern (no backtracking), and each compiled program is held under [`REGEX_SIZE_LIMIT`].
//! Every regex must match the whole text: it is compiled as `^(?:PATTERN)$`.

use http::{HeaderName, Method};

/// The most memory one compiled regex may take (the `regex` crate's `size_limit`, and the
/// same for its lazy DFA's cache): a pattern needing more is a config error.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The longest pattern accepted, in bytes.
pub const MAX_REGEX_LEN: usize = 1024;

/// A regex that must match the whole text (compiled as `^(?:PATTERN)$`); two are equal when
/// written the same.
#[derive(Clone, Debug)]
pub struct RouteRegex {
    /// The pattern as written.
    written: String,
    program: regex::Regex,
}

impl RouteRegex {
    /// `pattern`, compiled anchored at both ends within [`REGEX_SIZE_LIMIT`]; the error is the
    /// `regex` crate's about the pattern as written.
    pub fn new(pattern: &str) -> Result<RouteRegex, String> {
        RouteRegex::build(pattern, true)
    }

    /// `pattern`, compiled as written (matching anywhere), for `regex_rewrite`: every
    /// non-overlapping match is replaced.
    pub fn unanchored(pattern: &str) -> Result<RouteRegex, String> {
        RouteRegex::build(pattern, false)
    }

    fn build(pattern: &str, anchor: bool) -> Result<RouteRegex, String> {
        if pattern.len() > MAX_REGEX_LEN {
            return Err(format!(
                "the pattern is {} bytes long, more than {MAX_REGEX_LEN}",
                pattern.len()
            ));
        }
        let build = |text: &str| {
            regex::RegexBuilder::new(text)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_SIZE_LIMIT)
                .build()
        };
        // The pattern alone first: its error is about what the operator wrote.
        let written = build(pattern).map_err(one_line)?;
        let program = if anchor {
            build(&format!("^(?:{pattern})$")).map_err(one_line)?
        } else {
            written
        };
        Ok(RouteRegex {
            written: pattern.to_owned(),
            program,
        })
    }

    /// Whether the pattern matches all of `text` (linear time in its length).
    pub fn is_match(&self, text: &str) -> bool {
        self.program.is_match(text)
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.written
    }

    /// The compiled program (for substitutions: `regex_rewrite`).
    pub fn regex(&self) -> &regex::Regex {
        &self.program
    }
}

/// The `regex` crate's error on one line: a syntax error's own line (`error: unclosed
/// group`), without the pattern drawn above it with a caret.
fn one_line(error: regex::Error) -> String {
    let text = error.to_string();
    let own = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("error: "))
        .map(str::to_owned);
    own.unwrap_or_else(|| text.split_whitespace().collect::<Vec<_>>().join(" "))
}

impl PartialEq for RouteRegex {
    fn eq(&self, other: &RouteRegex) -> bool {
        self.written == other.written
    }
}

impl Eq for RouteRegex {}

/// The matchers of a route beyond `host` and `path_prefix`; each one given must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// `methods`: the request's method must be one of them (case-sensitive); empty: any.
    pub methods: Vec<Method>,
    /// `path`: the path must be exactly this (as sent, without the query).
    pub path: Option<String>,
    /// `path_regex`: the path (as sent, without the query) must match it whole.
    pub path_regex: Option<RouteRegex>,
    /// `headers`: each must match a field of the request.
    pub headers: Vec<HeaderMatch>,
    /// `query`: each must match a parameter of the query string.
    pub query: Vec<QueryMatch>,
}

/// One `headers` entry: a field the request must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderMatch {
    /// The field's name (compared without case).
    pub name: HeaderName,
    /// What one of the fields so named must hold.
    pub value: ValueMatch,
}

/// One `query` entry: a parameter the query string must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryMatch {
    /// The parameter's name, as sent (not percent-decoded; case-sensitive).
    pub name: String,
    /// What one of the parameters so named must hold.
    pub value: ValueMatch,
}

/// How a route rewrites the path its backends get (`strip_prefix`, `replace_prefix`,
/// `regex_rewrite`: one at most). The query is kept as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathRewrite {
    /// The route's `path_prefix` taken off (`/` put in front of what is left, if need be).
    StripPrefix,
    /// The route's `path_prefix` replaced by this.
    ReplacePrefix(String),
    /// Every match of the pattern in the path replaced by the substitution (`$1`, `${name}`).
    Regex {
        /// The pattern, matching anywhere.
        pattern: RouteRegex,
        /// The replacement, in the `regex` crate's syntax.
        substitution: String,
    },
}

/// What serves a route: a pool, or capataz itself with a redirect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteTarget {
    /// The index of the pool in [`Config::pools`](crate::Config::pools).
    Pool(usize),
    /// A redirect answered by capataz (`redirect`).
    Redirect(Box<Redirect>),
}

/// A route's `redirect`: the `Location` is the request's URL with what is given replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// 301, 302 (the default), 303, 307 or 308.
    pub status: u16,
    /// `http` or `https`; `None`: the request's.
    pub scheme: Option<String>,
    /// The host; `None`: the request's (without its port).
    pub host: Option<String>,
    /// The port; `None`: the request's when neither scheme nor host is given, else the
    /// scheme's default. Left out of the URL when it is the scheme's default.
    pub port: Option<u16>,
    /// How the path changes.
    pub path: RedirectPath,
    /// Whether the query is left out (default: kept).
    pub strip_query: bool,
}

/// How a redirect's path is made from the request's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedirectPath {
    /// The request's path (the default).
    Same,
    /// This path (`path`).
    Replace(String),
    /// The route's `path_prefix` replaced by this (`prefix`).
    Prefix(String),
}

/// What a header field's or query parameter's value must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueMatch {
    /// Anything, even empty: it must only be there (`present = true`).
    Present,
    /// Exactly this (`value`), byte for byte.
    Exact(String),
    /// A whole match of this (`value_regex`).
    Regex(RouteRegex),
}

impl ValueMatch {
    /// Whether `value` (the bytes as sent) satisfies it; a regex never matches bytes that
    /// are not UTF-8.
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Present => true,
            ValueMatch::Exact(want) => want.as_bytes() == value,
            ValueMatch::Regex(regex) => std::str::from_utf8(value).is_ok_and(|v| regex.is_match(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexes_match_the_whole_text_only() {
        let regex = RouteRegex::new("/api/v[0-9]+").unwrap();
        assert!(regex.is_match("/api/v2"));
        assert!(!regex.is_match("/api/v2/users"));
        assert!(!regex.is_match("/x/api/v2"));
        // An alternation is anchored as a whole, not only its first and last branches.
        let either = RouteRegex::new("/a|/b").unwrap();
        assert!(either.is_match("/b"));
        assert!(!either.is_match("/b/c"));
        assert!(!either.is_match("/x/a"));
    }

    #[test]
    fn a_bad_or_oversized_pattern_is_an_error_naming_why() {
        let error = RouteRegex::new("/api/(").unwrap_err();
        assert!(error.contains("unclosed group"), "{error}");
        let error = RouteRegex::new(r"\w{1000}\w{1000}").unwrap_err();
        assert!(error.contains("size limit"), "{error}");
        let error = RouteRegex::new(&"a".repeat(MAX_REGEX_LEN + 1)).unwrap_err();
        assert!(error.contains("more than 1024"), "{error}");
    }

    #[test]
    fn value_matches() {
        assert!(ValueMatch::Present.matches(b""));
        assert!(ValueMatch::Exact("a".into()).matches(b"a"));
        assert!(!ValueMatch::Exact("a".into()).matches(b"A"));
        let regex = ValueMatch::Regex(RouteRegex::new("[a-z]+").unwrap());
        assert!(regex.matches(b"abc"));
        assert!(!regex.matches(b"abc1"));
        assert!(!regex.matches(b"\xff"));
    }
}

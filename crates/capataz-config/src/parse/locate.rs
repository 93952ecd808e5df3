//! Placing an error in the text: its line, and the dotted key path around it.
//!
//! Validation builds exact key paths itself; these are for the errors the TOML parser reports
//! with only a byte span (syntax, unknown keys, wrong types).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

/// The line each dotted key path (and table) was first written on, for messages about a
/// validated config, such as warnings. Two of them always compare equal: where a key was
/// written is not a setting, and a reload that only moves lines changes nothing.
#[derive(Clone, Debug, Default)]
pub struct KeyLines(Arc<HashMap<String, usize>>);

impl KeyLines {
    /// The keys of `text`, as [`key_at`] names them.
    pub(crate) fn of(text: &str) -> KeyLines {
        let mut lines = HashMap::new();
        let _ = scan(text, |line| {
            if let Some(key) = line.here {
                lines.entry(key.to_owned()).or_insert(line.number);
            }
            ControlFlow::<()>::Continue(())
        });
        KeyLines(Arc::new(lines))
    }

    /// The line `key` was written on, if it was.
    pub fn line(&self, key: &str) -> Option<usize> {
        self.0.get(key).copied()
    }

    /// Whether `key` was written in the file (rather than left to its default).
    pub fn written(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The line of `key`, or of the nearest table around it that was written.
    pub fn nearest(&self, key: &str) -> Option<usize> {
        let mut key = key;
        loop {
            if let Some(line) = self.line(key) {
                return Some(line);
            }
            key = &key[..key.rfind(['.', '['])?];
        }
    }
}

impl PartialEq for KeyLines {
    fn eq(&self, _: &KeyLines) -> bool {
        true
    }
}

/// Where each line of a text starts, to find the line of many offsets in a large file: each
/// look-up is a binary search, where [`line_of`] counts the newlines before the offset.
pub(super) struct LineStarts(Vec<usize>);

impl LineStarts {
    pub(super) fn of(text: &str) -> LineStarts {
        let newlines = text.bytes().enumerate().filter(|&(_, b)| b == b'\n');
        LineStarts(newlines.map(|(at, _)| at).collect())
    }

    /// The 1-based line holding byte `offset`, as [`line_of`] gives it.
    pub(super) fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&newline| newline < offset) + 1
    }
}

/// The 1-based line holding byte `offset`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The dotted key path written around byte `offset`, best effort, for errors the TOML parser
/// reports with only a span. It follows table headers (`[pools.web.active]`), numbers arrays of
/// tables (`[[listeners]]` gives `listeners[0]`, `listeners[1]`, ...) and reads the key at the
/// start of the offending line; inside a multi-line value it names the value's key.
pub(super) fn key_at(text: &str, offset: usize) -> String {
    let found = scan(text, |line| {
        if offset < line.end || line.end == text.len() {
            ControlFlow::Break(line.here.or(line.last_key).unwrap_or(line.table).to_owned())
        } else {
            ControlFlow::Continue(())
        }
    });
    found.unwrap_or_default()
}

/// One line as [`scan`] sees it.
struct Line<'a> {
    /// Its 1-based number.
    number: usize,
    /// The byte offset just past it.
    end: usize,
    /// The key or table written on it, if any.
    here: Option<&'a str>,
    /// The last key written at or before it in its table.
    last_key: Option<&'a str>,
    /// The current table.
    table: &'a str,
}

/// Walks the lines of `text` until `visit` breaks, following tables and arrays of tables;
/// returns what it broke with. With no line at all, `visit` sees one empty line.
fn scan<B>(text: &str, mut visit: impl FnMut(Line<'_>) -> ControlFlow<B>) -> Option<B> {
    let mut table = String::new();
    let mut last_key: Option<String> = None;
    // For each array of tables (by its written segments), the index of its current element.
    let mut current_index: HashMap<Vec<String>, usize> = HashMap::new();
    // For each resolved array path (`listeners[0].routes`), how many elements it has so far.
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut line_start = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let line_end = line_start + line.len();
        let trimmed = line.trim_start();
        let mut here = None;
        if let Some(rest) = trimmed.strip_prefix("[[") {
            if let Some((segments, _)) = parse_key(rest) {
                let parent = resolve(&segments[..segments.len() - 1], &current_index);
                let last = &segments[segments.len() - 1];
                let array = join_key(&parent, last);
                let count = counts.entry(array.clone()).or_insert(0);
                current_index.insert(segments.clone(), *count);
                table = format!("{array}[{count}]");
                *count += 1;
                last_key = None;
                here = Some(table.clone());
            }
        } else if let Some(rest) = trimmed.strip_prefix('[') {
            if let Some((segments, _)) = parse_key(rest) {
                table = resolve(&segments, &current_index);
                last_key = None;
                here = Some(table.clone());
            }
        } else if let Some((segments, rest)) = parse_key(trimmed) {
            if rest.trim_start().starts_with('=') {
                let key = join_key(&table, &segments.join("."));
                last_key = Some(key.clone());
                here = Some(key);
            }
        }
        let line = Line {
            number: index + 1,
            end: line_end,
            here: here.as_deref(),
            last_key: last_key.as_deref(),
            table: &table,
        };
        if let ControlFlow::Break(found) = visit(line) {
            return Some(found);
        }
        line_start = line_end;
    }
    if text.is_empty() {
        let line = Line {
            number: 1,
            end: 0,
            here: None,
            last_key: None,
            table: "",
        };
        if let ControlFlow::Break(found) = visit(line) {
            return Some(found);
        }
    }
    None
}

/// Joins written segments into a path, adding the current index after each array of tables.
fn resolve(segments: &[String], current_index: &HashMap<Vec<String>, usize>) -> String {
    let mut path = String::new();
    for end in 1..=segments.len() {
        path = join_key(&path, &segments[end - 1]);
        if let Some(index) = current_index.get(&segments[..end]) {
            path.push_str(&format!("[{index}]"));
        }
    }
    path
}

fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Reads a dotted TOML key (bare or quoted segments) from the start of `text`; returns the
/// segments and the rest of the text.
fn parse_key(text: &str) -> Option<(Vec<String>, &str)> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        let (segment, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"')?;
            (quoted[..end].to_owned(), &quoted[end + 1..])
        } else if let Some(quoted) = rest.strip_prefix('\'') {
            let end = quoted.find('\'')?;
            (quoted[..end].to_owned(), &quoted[end + 1..])
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            (rest[..end].to_owned(), &rest[end..])
        };
        segments.push(segment);
        rest = after.trim_start_matches([' ', '\t']);
        match rest.strip_prefix('.') {
            Some(after_dot) => rest = after_dot,
            None => return Some((segments, rest)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_follow_headers_and_arrays() {
        let text = "\
[log]
level = \"info\"
[[listeners]]
address = \"a\"
[[listeners.routes]]
pool = \"x\"
[[listeners.routes]]
pool = \"y\"
[[listeners]]
address = \"b\"
[[listeners.routes]]
pool = \"z\"
[pools.\"we b\".active]
rise = 2
backends = [
  { name = \"a\" },
]
";
        let at = |needle: &str| key_at(text, text.find(needle).unwrap());
        assert_eq!(at("level"), "log.level");
        assert_eq!(at("address = \"a\""), "listeners[0].address");
        assert_eq!(at("pool = \"y\""), "listeners[0].routes[1].pool");
        assert_eq!(at("address = \"b\""), "listeners[1].address");
        assert_eq!(at("pool = \"z\""), "listeners[1].routes[0].pool");
        assert_eq!(at("rise"), "pools.we b.active.rise");
        assert_eq!(at("{ name"), "pools.we b.active.backends");
        assert_eq!(at("[pools"), "pools.we b.active");
        assert_eq!(key_at("", 0), "");
    }

    #[test]
    fn lines_are_one_based() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
        for text in ["a\nb\nc", "", "\n\n", "ab\n"] {
            let starts = LineStarts::of(text);
            for offset in 0..text.len() + 3 {
                assert_eq!(
                    starts.line(offset),
                    line_of(text, offset),
                    "{text:?} {offset}"
                );
            }
        }
    }
}

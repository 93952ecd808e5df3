//! Placing an error in the parsed document: the full key path (with array indexes) and the line
//! at a byte offset, and where a key path was written.
//!
//! serde reports a wrong type or an unknown key with a byte span only, and the line scanner of
//! `locate` cannot see into inline tables and lists (`backends = [{ ..., weight = 1.5 }]`).
//! This reads the same text with toml_edit (the parser toml itself uses), which keeps the span
//! of every key and value, and walks it. It is built only on the way to an error, so a valid
//! file is parsed once.

use std::ops::Range;

use toml_edit::{ArrayOfTables, ImDocument, Item, Key, Table, Value};

use super::locate::LineStarts;

/// A parsed text, for placing errors.
pub(super) struct Document<'a> {
    text: &'a str,
    document: ImDocument<&'a str>,
    lines: LineStarts,
}

/// Where a byte offset is, in the file's terms.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Place {
    /// The full key path, arrays counted from 0: `pools.web.backends[1].weight`.
    pub(super) key: String,
    /// The 1-based line of that key (of the element, for a list element without a key).
    pub(super) line: usize,
    /// What is written there, as a message shows it: `1.5`, `"yes"`, `a list`, `a table`.
    pub(super) found: String,
}

/// Where a key path was written.
pub(super) struct Written {
    /// The 1-based line of its key (of the element, for a list element).
    pub(super) line: usize,
    /// The bytes of what was written for it: a value, or a section from its header to its last
    /// key; unknown for a table implied by a dotted key.
    extent: Option<Range<usize>>,
}

impl Written {
    /// Whether `offset` is within what was written for the key.
    pub(super) fn covers(&self, offset: usize) -> bool {
        self.extent
            .as_ref()
            .is_some_and(|extent| extent.contains(&offset))
    }
}

impl<'a> Document<'a> {
    /// `text` parsed; `None` for text that is not TOML (a syntax error, placed by `locate`).
    pub(super) fn parse(text: &'a str) -> Option<Document<'a>> {
        let document = ImDocument::parse(text).ok()?;
        Some(Document {
            text,
            document,
            lines: LineStarts::of(text),
        })
    }

    /// The innermost key or list element written at byte `offset`.
    pub(super) fn place(&self, offset: usize) -> Option<Place> {
        self.find(Node::of(self.document.as_item()), "", offset)
    }

    /// Where `key` (a path as [`Place::key`] spells it) was written, if it was.
    pub(super) fn written(&self, key: &str) -> Option<Written> {
        self.follow(Node::of(self.document.as_item()), key, None)
    }

    /// Where `key` was written, or else the nearest table around it that was (the one that
    /// lacks it); `None` when not even its first segment was.
    pub(super) fn nearest(&self, key: &str) -> Option<Written> {
        let mut key = key;
        loop {
            if let Some(written) = self.written(key) {
                return Some(written);
            }
            key = &key[..key.rfind(['.', '['])?];
        }
    }

    fn line(&self, offset: usize) -> usize {
        self.lines.line(offset)
    }

    /// The place inside `node` (a table's key or value, a list's element) that holds `offset`.
    fn find(&self, node: Node<'_>, at: &str, offset: usize) -> Option<Place> {
        for (key, child) in node.entries() {
            let path = join(at, key.get());
            if contains(key.span(), offset) {
                return Some(self.here(path, key.span(), child));
            }
            // Sections (`[pools.web]`) and dotted keys (`active.rise = 2`) have no span of
            // their own that covers their keys: look inside them in any case.
            let section = matches!(child, Node::Table(_) | Node::Tables(_));
            if section || contains(child.span(), offset) {
                if let Some(place) = self.find(child, &path, offset) {
                    return Some(place);
                }
                if !section {
                    return Some(self.here(path, key.span(), child));
                }
                if contains(child.span(), offset) {
                    return Some(self.here(path, child.span(), child));
                }
            }
        }
        node.elements().enumerate().find_map(|(index, element)| {
            let path = format!("{at}[{index}]");
            let inside = self.find(element, &path, offset);
            inside.or_else(|| {
                contains(element.span(), offset).then(|| self.here(path, element.span(), element))
            })
        })
    }

    fn here(&self, key: String, span: Option<Range<usize>>, node: Node<'_>) -> Place {
        Place {
            key,
            line: span.map_or(1, |span| self.line(span.start)),
            found: self.describe(node),
        }
    }

    /// A value as a message quotes it: short ones as written, lists and tables by their kind.
    fn describe(&self, node: Node<'_>) -> String {
        match node {
            Node::Value(Value::String(text)) => {
                let shown: String = text.value().chars().take(MAX_SHOWN).collect();
                let cut = if shown.len() < text.value().len() {
                    "..."
                } else {
                    ""
                };
                format!("{shown:?}{cut}")
            }
            Node::Value(Value::Array(_)) => "a list".to_owned(),
            Node::Value(Value::InlineTable(_)) | Node::Table(_) => "a table".to_owned(),
            Node::Tables(_) => "a list of tables".to_owned(),
            Node::Value(value) => match value.span() {
                Some(span) => {
                    let written = self.text.get(span).unwrap_or_default().trim();
                    super::one_line(&written.chars().take(MAX_SHOWN).collect::<String>())
                        .into_owned()
                }
                None => "this value".to_owned(),
            },
            Node::None => "nothing".to_owned(),
        }
    }

    /// Follows `rest` (`backends[1].weight`) down from `node`; `key` is the span of the last
    /// key met on the way.
    fn follow(&self, node: Node<'_>, rest: &str, key: Option<Range<usize>>) -> Option<Written> {
        if rest.is_empty() {
            let line_at = key.or_else(|| node.span())?.start;
            return Some(Written {
                line: self.line(line_at),
                extent: node.span(),
            });
        }
        if let Some(after) = rest.strip_prefix('[') {
            let (index, after) = after.split_once(']')?;
            let index: usize = index.parse().ok()?;
            let after = after.strip_prefix('.').unwrap_or(after);
            let element = node.element(index)?;
            return self.follow(element, after, element.span());
        }
        // A name may hold a dot (`[pools."a.b"]`): try each place `rest` can be cut at. Each
        // try is a lookup, so that a file with thousands of errors is placed in linear time.
        let cuts = rest.match_indices(['.', '[']).map(|(at, _)| at);
        cuts.chain([rest.len()]).find_map(|cut| {
            let (key, child) = node.get(&rest[..cut])?;
            let after = &rest[cut..];
            let after = after.strip_prefix('.').unwrap_or(after);
            self.follow(child, after, key.span())
        })
    }
}

/// The longest value a message quotes, in characters.
const MAX_SHOWN: usize = 60;

/// One item of the document, borrowed (toml_edit keeps a list of tables' elements as `Table`s
/// and an inline table's or array's as `Value`s, not as `Item`s).
#[derive(Clone, Copy)]
enum Node<'d> {
    /// A `[section]` (or a table implied by a dotted key).
    Table(&'d Table),
    /// A `[[list of tables]]`.
    Tables(&'d ArrayOfTables),
    /// A value, inline tables and lists included.
    Value(&'d Value),
    /// Nothing (a removed item; never in a parsed document).
    None,
}

impl<'d> Node<'d> {
    fn of(item: &'d Item) -> Node<'d> {
        match item {
            Item::Table(table) => Node::Table(table),
            Item::ArrayOfTables(tables) => Node::Tables(tables),
            Item::Value(value) => Node::Value(value),
            Item::None => Node::None,
        }
    }

    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Table(table) => table.span(),
            Node::Tables(tables) => tables.span(),
            Node::Value(value) => value.span(),
            Node::None => None,
        }
    }

    /// A table's keys and their items, in the order written; none for anything else.
    fn entries(self) -> Vec<(&'d Key, Node<'d>)> {
        let pair = |(key, item): (&'d Key, &'d Item)| (key, Node::of(item));
        match self {
            Node::Table(table) => table
                .iter()
                .filter_map(|(name, _)| table.get_key_value(name).map(pair))
                .collect(),
            Node::Value(Value::InlineTable(table)) => table
                .iter()
                .filter_map(|(name, _)| table.get_key_value(name).map(pair))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A table's key `name` and its item.
    fn get(self, name: &str) -> Option<(&'d Key, Node<'d>)> {
        let (key, item) = match self {
            Node::Table(table) => table.get_key_value(name)?,
            Node::Value(Value::InlineTable(table)) => table.get_key_value(name)?,
            _ => return None,
        };
        Some((key, Node::of(item)))
    }

    /// A list's element `index`.
    fn element(self, index: usize) -> Option<Node<'d>> {
        match self {
            Node::Tables(tables) => tables.get(index).map(Node::Table),
            Node::Value(Value::Array(values)) => values.get(index).map(Node::Value),
            _ => None,
        }
    }

    /// A list's elements; none for anything else.
    fn elements(self) -> Box<dyn Iterator<Item = Node<'d>> + 'd> {
        match self {
            Node::Tables(tables) => Box::new(tables.iter().map(Node::Table)),
            Node::Value(Value::Array(values)) => Box::new(values.iter().map(Node::Value)),
            _ => Box::new(std::iter::empty()),
        }
    }
}

fn contains(span: Option<Range<usize>>, offset: usize) -> bool {
    span.is_some_and(|span| span.contains(&offset))
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"[log]
level = "info"
[[listeners]]
address = "a"
[[listeners.routes]]
pool = "x"
[[listeners]]
address = "b"
[listeners.tls]
certificates = [
  { cert = "c", key = "k" },
  { cert = "d", key = 5 },
]
[pools."a.b"]
active.rise = 2
backends = [
  { address = "x" },
  { address = "y", weight = 1.5 },
]
[[pools."a.b".backends2]]
weight = 2024-01-01
"#;

    fn place(needle: &str) -> (String, usize, String) {
        let document = Document::parse(TEXT).expect("valid TOML");
        let place = document
            .place(TEXT.find(needle).expect("needle"))
            .expect("placed");
        (place.key, place.line, place.found)
    }

    #[test]
    fn places_follow_sections_lists_and_inline_tables() {
        let at = |key: &str, line, found: &str| (key.to_owned(), line, found.to_owned());
        assert_eq!(place("\"info\""), at("log.level", 2, "\"info\""));
        assert_eq!(place("level"), at("log.level", 2, "\"info\""));
        assert_eq!(place("\"b\""), at("listeners[1].address", 8, "\"b\""));
        assert_eq!(
            place("\"x\"\n"),
            at("listeners[0].routes[0].pool", 6, "\"x\"")
        );
        assert_eq!(
            place("5 }"),
            at("listeners[1].tls.certificates[1].key", 12, "5")
        );
        assert_eq!(place("rise"), at("pools.a.b.active.rise", 15, "2"));
        assert_eq!(place("1.5"), at("pools.a.b.backends[1].weight", 18, "1.5"));
        assert_eq!(
            place("{ address = \"x\""),
            at("pools.a.b.backends[0]", 17, "a table")
        );
        assert_eq!(
            place("2024"),
            at("pools.a.b.backends2[0].weight", 21, "2024-01-01")
        );
        assert_eq!(
            place("[\n  { cert"),
            at("listeners[1].tls.certificates", 10, "a list")
        );
    }

    #[test]
    fn written_keys_have_the_line_of_their_key() {
        let document = Document::parse(TEXT).expect("valid TOML");
        let line = |key: &str| document.written(key).map(|written| written.line);
        assert_eq!(line("log.level"), Some(2));
        assert_eq!(line("listeners[1].address"), Some(8));
        assert_eq!(line("listeners[1].tls.certificates"), Some(10));
        assert_eq!(line("listeners[1].tls.certificates[1].key"), Some(12));
        assert_eq!(line("pools.a.b.backends"), Some(16));
        assert_eq!(line("pools.a.b.backends[1].weight"), Some(18));
        assert_eq!(line("pools.a.b.active.rise"), Some(15));
        assert_eq!(line("pools.a.b.backends2[0].weight"), Some(21));
        assert_eq!(line("pools.a.b.backends[2]"), None);
        assert_eq!(line("pools.a.b.agent"), None);
        assert_eq!(line("pools.a.b.backends[x]"), None);
        let written = document.written("pools.a.b.backends").expect("written");
        assert!(written.covers(TEXT.find("weight").unwrap()));
        assert!(!written.covers(TEXT.find("active").unwrap()));
        let section = document.written("listeners[1].tls").expect("written");
        assert_eq!(section.line, 9);
        assert!(section.covers(TEXT.find("key = 5").unwrap()));
        let nearest = |key: &str| document.nearest(key).map(|written| written.line);
        assert_eq!(nearest("pools.a.b.backends[1].name"), Some(18));
        assert_eq!(nearest("listeners[1].tls.acme.email"), Some(9));
        assert_eq!(nearest("listeners[2].address"), Some(3));
        assert_eq!(nearest("alerts.debounce"), None);
    }

    #[test]
    fn text_that_is_not_toml_is_not_placed() {
        assert!(Document::parse("[pools.web\n").is_none());
    }
}

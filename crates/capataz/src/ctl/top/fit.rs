//! Text that fits a terminal's width: how many columns a string takes, and lines of (possibly
//! coloured) pieces cut to a width with a `…` where something was left out.
//!
//! Widths are counted as terminals draw them: East Asian wide and fullwidth characters and
//! most emoji take two columns, combining marks and zero-width characters none, the rest one.
//! Control characters never get here (names and sentences go through `printable` first).

/// The columns `c` takes on a terminal.
fn char_width(c: char) -> usize {
    match u32::from(c) {
        // Combining marks, zero-width spaces and joiners, variation selectors.
        0x0300..=0x036F
        | 0x0483..=0x0489
        | 0x0591..=0x05BD
        | 0x200B..=0x200F
        | 0x2060..=0x2064
        | 0x20D0..=0x20FF
        | 0xFE00..=0xFE0F
        | 0xFE20..=0xFE2F
        | 0xFEFF
        | 0xE0100..=0xE01EF => 0,
        // East Asian wide and fullwidth, and the emoji blocks terminals draw wide.
        0x1100..=0x115F
        | 0x231A..=0x231B
        | 0x2329..=0x232A
        | 0x23E9..=0x23EC
        | 0x2600..=0x27BF
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xA960..=0xA97F
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE10..=0xFE19
        | 0xFE30..=0xFE6F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F000..=0x1FAFF
        | 0x20000..=0x3FFFD => 2,
        _ => 1,
    }
}

/// The columns `text` takes on a terminal.
pub(super) fn width(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

/// `text` in at most `max` columns: as it is if it fits, else its start and a `…`.
pub(super) fn cut(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    cut_short(text, max)
}

/// The start of `text` and a `…`, in at most `max` columns: for text that goes on past them.
fn cut_short(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = char_width(c);
        if used + w + 1 > max {
            break;
        }
        out.push(c);
        used += w;
    }
    if max > 0 {
        out.push('…');
    }
    out
}

/// `text` padded with spaces to `columns` (unchanged if it is as wide or wider).
pub(super) fn pad(text: &str, columns: usize) -> String {
    let mut out = text.to_owned();
    out.extend(std::iter::repeat_n(
        ' ',
        columns.saturating_sub(width(text)),
    ));
    out
}

/// One line of a frame: pieces of text, each with an optional ANSI colour code.
#[derive(Clone, Debug, Default)]
pub(super) struct Line {
    pieces: Vec<(String, Option<&'static str>)>,
}

impl Line {
    /// A line of plain text.
    pub(super) fn plain(text: impl Into<String>) -> Line {
        let mut line = Line::default();
        line.push(text, None);
        line
    }

    /// Adds `text`, drawn in `colour` (an SGR code such as `32`) on a terminal.
    pub(super) fn push(&mut self, text: impl Into<String>, colour: Option<&'static str>) {
        self.pieces.push((text.into(), colour));
    }

    /// The line in at most `max` columns (all of it when `None`), its trailing spaces dropped;
    /// with `colour`, its coloured pieces wrapped in ANSI escapes. A line that does not fit
    /// ends in `…`.
    pub(super) fn render(&self, max: Option<usize>, colour: bool) -> String {
        let mut pieces = self.pieces.clone();
        while let Some((text, _)) = pieces.last_mut() {
            let kept = text.trim_end().len();
            text.truncate(kept);
            if !text.is_empty() {
                break;
            }
            pieces.pop();
        }
        let total: usize = pieces.iter().map(|(text, _)| width(text)).sum();
        let mut room = match max {
            Some(max) if total > max => max,
            _ => usize::MAX,
        };
        let mut out = String::new();
        for (text, code) in &pieces {
            let w = width(text);
            let shown = if w < room {
                text.clone()
            } else {
                // This piece reaches the edge and more follows: the `…` takes the last column.
                cut_short(text, room)
            };
            let shown_width = width(&shown);
            match code {
                Some(code) if colour && !shown.is_empty() => {
                    out.push_str(&format!("\x1b[{code}m{shown}\x1b[0m"))
                }
                _ => out.push_str(&shown),
            }
            if shown != *text {
                break;
            }
            room -= shown_width.min(room);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_count_wide_and_zero_width_characters_as_terminals_draw_them() {
        assert_eq!(width("web1"), 4);
        assert_eq!(width("日本"), 4);
        assert_eq!(width("e\u{301}"), 1);
        assert_eq!(width("…"), 1);
    }

    #[test]
    fn a_cut_line_ends_in_an_ellipsis_within_its_width() {
        assert_eq!(cut("abcdef", 6), "abcdef");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("日本語", 4), "日…");
        let mut line = Line::plain("  ");
        line.push("UP", Some("32"));
        line.push("  0.5/1   notes that go on and on", None);
        assert_eq!(
            line.render(None, false),
            "  UP  0.5/1   notes that go on and on"
        );
        let cut_line = line.render(Some(12), false);
        assert_eq!(cut_line, "  UP  0.5/1…");
        assert_eq!(width(&cut_line), 12);
        assert_eq!(
            line.render(Some(3), true),
            "  \x1b[32m…\x1b[0m",
            "the colour stays on what is left of its piece"
        );
        let mut padded = Line::plain("x");
        padded.push("    ", None);
        assert_eq!(
            padded.render(Some(3), false),
            "x",
            "trailing padding is dropped"
        );
    }
}

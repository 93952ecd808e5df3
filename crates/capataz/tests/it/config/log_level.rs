//! `log.level` must name at least one directive: an empty one silenced every log line.

use super::*;

/// Regression: `log.level = ""` (or blanks, or bare commas) was accepted and
/// turned every log line off. Now a config error naming the file, the line and the key.
#[test]
fn an_empty_log_level_is_an_error_naming_file_line_and_key() {
    for level in ["", "   ", "\\t", ",", " , , "] {
        let text = format!("[log]\nformat = \"text\"\nlevel = \"{level}\"\n{MINIMAL}");
        let error = check_err(&text, Some(3), "log.level");
        let shown = error.to_string();
        assert!(
            shown.contains("silence every log line"),
            "{level:?}: {shown}"
        );
    }
    // A level with a directive beside empty ones is still a level.
    assert_eq!(
        parse(&format!("[log]\nlevel = \"info,\"\n{MINIMAL}"))
            .log
            .level,
        "info,"
    );
}

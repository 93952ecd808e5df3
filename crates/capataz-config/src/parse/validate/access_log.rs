//! `[listeners.access_log]`: where a listener's access log goes, its format and its buffer.
//! Syntax only: the file is opened by the log's writer, never here.

use std::path::Path;

use toml::Spanned;

use super::super::raw::RawAccessLog;
use super::{ConfigError, Validator};
use crate::{AccessLogConfig, AccessLogFormat, AccessLogTarget};

/// The default number of lines an access log holds for its writer.
const DEFAULT_BUFFER: i64 = 4096;

impl Validator<'_> {
    pub(super) fn access_log(
        &self,
        at: &str,
        raw: Spanned<RawAccessLog>,
    ) -> Result<AccessLogConfig, ConfigError> {
        let at = format!("{at}.access_log");
        let span = raw.span();
        let raw = raw.into_inner();
        let Some(path) = raw.path else {
            return Err(self.error(
                Some(span),
                &format!("{at}.path"),
                r#"an access log needs a path (a file, or "stdout" or "stderr")"#.into(),
            ));
        };
        let target = match path.get_ref().as_str() {
            "stdout" => AccessLogTarget::Stdout,
            "stderr" => AccessLogTarget::Stderr,
            file if file.is_empty() || file.contains('\0') => {
                return Err(self.error(
                    Some(path.span()),
                    &format!("{at}.path"),
                    r#"a file path must be non-empty (or use "stdout" or "stderr")"#.into(),
                ))
            }
            file => {
                let file = Path::new(file);
                AccessLogTarget::File(match Path::new(self.file).parent() {
                    Some(dir) if file.is_relative() => dir.join(file),
                    _ => file.to_owned(),
                })
            }
        };
        let format = match raw.format.as_ref().map(|f| f.get_ref().as_str()) {
            None | Some("text") => AccessLogFormat::Text,
            Some("json") => AccessLogFormat::Json,
            Some(other) => {
                return Err(self.error(
                    raw.format.as_ref().map(|f| f.span()),
                    &format!("{at}.format"),
                    format!(r#"{other:?} is not an access log format (use "text" or "json")"#),
                ))
            }
        };
        let buffer = self.int(
            &raw.buffer,
            &format!("{at}.buffer"),
            DEFAULT_BUFFER,
            1..=1_048_576,
        )? as usize;
        Ok(AccessLogConfig {
            target,
            format,
            buffer,
        })
    }
}

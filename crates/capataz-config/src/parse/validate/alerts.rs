//! `[alerts]`: the debounce window, webhooks and commands.
//!
//! A webhook's URL is taken apart here; its host is resolved once, in stage three, like a
//! backend's address, so the alert path never waits on DNS and a typo stops the config instead
//! of the first alert.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::Duration;

use toml::{Spanned, Value};

use super::super::raw::{RawAlerts, RawCommand, RawWebhook};
use super::super::resolve::{Lookup, Target};
use super::super::values::parse_http_url;
use super::{ConfigError, Validator};
use crate::{AlertsConfig, CommandConfig, WebhookConfig};

/// The bounds of a hook's queue, in events.
const QUEUE: std::ops::RangeInclusive<i64> = 1..=100_000;

impl Validator<'_> {
    pub(super) fn alerts(&self, raw: RawAlerts) -> Result<AlertsConfig, ConfigError> {
        let debounce = self.optional_duration(&raw.debounce, "alerts.debounce")?;
        // Each hook's errors are reported; the others are still checked.
        let webhooks = raw
            .webhooks
            .into_iter()
            .enumerate()
            .filter_map(|(index, webhook)| {
                self.keep(self.webhook(index, &format!("alerts.webhooks[{index}]"), webhook))
            })
            .collect();
        let commands = raw
            .commands
            .into_iter()
            .enumerate()
            .filter_map(|(index, command)| {
                self.keep(self.command(&format!("alerts.commands[{index}]"), command))
            })
            .collect();
        Ok(AlertsConfig {
            debounce,
            webhooks,
            commands,
        })
    }

    fn webhook(
        &self,
        index: usize,
        at: &str,
        raw: Spanned<RawWebhook>,
    ) -> Result<WebhookConfig, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        let key = format!("{at}.url");
        let Some(url) = raw.url else {
            return Err(self.error(
                Some(span),
                &key,
                r#"every webhook needs a url (add url = "http://127.0.0.1:9000/hook")"#.into(),
            ));
        };
        let text = url.get_ref();
        let parts = parse_http_url(text)
            .map_err(|why| self.error(Some(url.span()), &key, format!("{text:?} {why}")))?;
        let socket_addr = self.url_host(index, &parts.host_port, text, url.span(), &key);
        Ok(WebhookConfig {
            host: parts.authority.to_owned(),
            path: parts.path,
            socket_addr,
            timeout: self.duration(
                &raw.timeout,
                &format!("{at}.timeout"),
                Duration::from_secs(2),
            )?,
            retries: self.int(&raw.retries, &format!("{at}.retries"), 3, 0..=10)? as u32,
            backoff: self.duration(
                &raw.backoff,
                &format!("{at}.backoff"),
                Duration::from_millis(500),
            )?,
            queue: self.int(&raw.queue, &format!("{at}.queue"), 1024, QUEUE)? as usize,
            url: url.into_inner(),
        })
    }

    /// A webhook's `host:port`: an IP literal is its address; a name is queued for stage three
    /// (resolution) and gets a placeholder address until then.
    fn url_host(
        &self,
        index: usize,
        host_port: &str,
        url: &str,
        span: Range<usize>,
        key: &str,
    ) -> SocketAddr {
        if let Ok(literal) = host_port.parse::<SocketAddr>() {
            return literal;
        }
        self.lookups.borrow_mut().push(Lookup {
            target: Target::Webhook { index },
            host_port: host_port.to_owned(),
            file: self.file.to_owned(),
            line: Some(self.line_at(span.start)),
            key: key.to_owned(),
            subject: format!("{url:?}: {host_port:?}"),
            advice: r#"use a host that resolves, e.g. "http://127.0.0.1:9000/hook""#,
        });
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    }

    fn command(&self, at: &str, raw: Spanned<RawCommand>) -> Result<CommandConfig, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        let key = format!("{at}.command");
        let Some(command) = raw.command else {
            return Err(self.error(
                Some(span),
                &key,
                r#"every command hook needs a command (add command = ["/path/to/program", "arg"])"#
                    .into(),
            ));
        };
        let argv = self.argv(&command, &key)?;
        Ok(CommandConfig {
            argv,
            timeout: self.duration(
                &raw.timeout,
                &format!("{at}.timeout"),
                Duration::from_secs(10),
            )?,
            queue: self.int(&raw.queue, &format!("{at}.queue"), 256, QUEUE)? as usize,
        })
    }

    /// A program and its arguments: a non-empty array of strings, the program non-empty. No
    /// shell is involved, so a single string is refused rather than split.
    fn argv(&self, command: &Spanned<Value>, key: &str) -> Result<Vec<String>, ConfigError> {
        let fail = |why: String| self.error(Some(command.span()), key, why);
        const SHAPE: &str = r#"e.g. ["/usr/local/bin/page-oncall", "--severity", "high"]"#;
        let items = match command.get_ref() {
            Value::Array(items) => items,
            Value::String(line) => {
                return Err(fail(format!(
                    "{line:?} is a string, and commands run without a shell \
                     (write the program and each argument as an array, {SHAPE})"
                )))
            }
            other => {
                return Err(fail(format!(
                    "{other} is not a command (write an array of strings, {SHAPE})"
                )))
            }
        };
        let mut argv = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let Value::String(arg) = item else {
                return Err(fail(format!(
                    "item {index} ({item}) is not a string (quote every argument, {SHAPE})"
                )));
            };
            if arg.contains('\0') {
                return Err(fail(format!(
                    "item {index} contains a NUL character, which no program can receive \
                     (remove it)"
                )));
            }
            argv.push(arg.clone());
        }
        match argv.first() {
            None => Err(fail(format!(
                "the command is empty (name a program, {SHAPE})"
            ))),
            Some(program) if program.is_empty() => Err(fail(format!(
                "the program (item 0) is empty (name a program, {SHAPE})"
            ))),
            Some(_) => Ok(argv),
        }
    }
}

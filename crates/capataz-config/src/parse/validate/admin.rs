//! `[admin]`: the admin listener's address, token and the hosts it answers to.

use std::net::SocketAddr;
use std::path::Path;

use toml::Spanned;

use super::super::raw::RawAdmin;
use super::super::secrets::{SecretLoad, SecretTarget};
use super::{ConfigError, Validator};
use crate::AdminConfig;

impl Validator<'_> {
    pub(super) fn admin(&self, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
        let address = match &raw.address {
            None => SocketAddr::from(([127, 0, 0, 1], 9901)),
            Some(address) => self.socket_addr(address, "admin.address")?,
        };
        let token = match raw.token {
            None => None,
            Some(token) => {
                if let Err(why) = check_admin_token(token.get_ref()) {
                    return Err(self.error(Some(token.span()), "admin.token", why.into()));
                }
                Some(token.into_inner())
            }
        };
        let token_file = match (raw.token_file, &token) {
            (None, _) => false,
            (Some(file), Some(_)) => {
                return Err(self.error(
                    Some(file.span()),
                    "admin.token_file",
                    "admin.token is set too (keep one of token and token_file)".into(),
                ))
            }
            (Some(file), None) => {
                let path = self.config_path(&file, "admin.token_file")?;
                self.secrets.borrow_mut().push(SecretLoad {
                    target: SecretTarget::AdminToken,
                    path,
                    file: self.file.to_owned(),
                    line: Some(self.line_at(file.span().start)),
                    key: "admin.token_file".into(),
                });
                true
            }
        };
        // The admin API can drain and disable backends: beyond this host it needs a token.
        // (The default address is loopback, so only a written address can fail here.)
        if let (Some(written), None, false) = (&raw.address, &token, token_file) {
            if !address.ip().to_canonical().is_loopback() {
                return Err(self.error(
                    Some(written.span()),
                    "admin.address",
                    format!(
                        "{:?}: a non-loopback admin address needs admin.token (anyone who can \
                         reach it could take backends down; set admin.token, or listen on \
                         \"127.0.0.1:9901\")",
                        written.get_ref()
                    ),
                ));
            }
        }
        let mut allowed_hosts = Vec::new();
        for (index, host) in raw
            .allowed_hosts
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let text = host.get_ref();
            let bracketed_v6 = text.starts_with('[')
                && text.ends_with(']')
                && text[1..text.len() - 1]
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok();
            let name_like = !text.is_empty()
                && text.len() <= 253
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
            if !(bracketed_v6 || name_like) {
                return Err(self.error(
                    Some(host.span()),
                    &format!("admin.allowed_hosts[{index}]"),
                    format!(
                        r#"{text:?} is not a host name (write the name alone, without a scheme or port, e.g. "lb1.internal" or "[fd00::5]")"#
                    ),
                ));
            }
            allowed_hosts.push(text.to_ascii_lowercase());
        }
        Ok(AdminConfig {
            address,
            token,
            open_read_only: raw.open_read_only.unwrap_or(false),
            allowed_hosts,
            metrics_backend_histograms: raw.metrics_backend_histograms.unwrap_or(false),
        })
    }
}

impl Validator<'_> {
    /// A file named in the config, joined to the config file's directory if relative.
    pub(super) fn config_path(
        &self,
        value: &Spanned<String>,
        key: &str,
    ) -> Result<std::path::PathBuf, ConfigError> {
        if value.get_ref().is_empty() || value.get_ref().contains('\0') {
            return Err(self.error(
                Some(value.span()),
                key,
                "a file path must be non-empty (write the path of the file)".into(),
            ));
        }
        let path = Path::new(value.get_ref());
        Ok(match Path::new(self.file).parent() {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        })
    }
}

/// Whether `token` may be the admin token: non-empty printable ASCII without spaces.
pub(in super::super) fn check_admin_token(token: &str) -> Result<(), &'static str> {
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(
            "the token must be non-empty printable ASCII without spaces (leave the key out to \
             disable authentication)",
        )
    }
}

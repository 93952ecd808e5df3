//! `[admin]`: the admin listener's address, token and the hosts it answers to.

use std::net::SocketAddr;

use super::super::raw::RawAdmin;
use super::{ConfigError, Validator};
use crate::config::AdminConfig;

impl Validator<'_> {
    pub(super) fn admin(&self, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
        let address = match &raw.address {
            None => SocketAddr::from(([127, 0, 0, 1], 9901)),
            Some(address) => self.socket_addr(address, "admin.address")?,
        };
        let token = match raw.token {
            None => None,
            Some(token) => {
                let ok = !token.get_ref().is_empty()
                    && token.get_ref().bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    return Err(self.error(
                        Some(token.span()),
                        "admin.token",
                        "the token must be non-empty printable ASCII without spaces \
                         (leave the key out to disable authentication)"
                            .into(),
                    ));
                }
                Some(token.into_inner())
            }
        };
        // The admin API can drain and disable backends: beyond this host it needs a token.
        // (The default address is loopback, so only a written address can fail here.)
        if let (Some(written), None) = (&raw.address, &token) {
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

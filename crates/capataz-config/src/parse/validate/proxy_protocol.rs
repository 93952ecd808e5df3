//! A listener's `proxy_protocol` table: the trusted sources, each an address block.

use toml::Spanned;

use super::super::raw::RawProxyProtocol;
use super::{ConfigError, Validator};
use crate::{Cidr, ProxyProtocolConfig};

/// At most this many blocks: each connection is matched against all of them, linearly.
const MAX_TRUSTED: usize = 256;

impl Validator<'_> {
    pub(super) fn proxy_protocol(
        &self,
        at: &str,
        raw: Spanned<RawProxyProtocol>,
    ) -> Result<ProxyProtocolConfig, ConfigError> {
        let key = format!("{at}.proxy_protocol.trusted");
        let span = raw.span();
        let list = match raw.into_inner().trusted {
            Some(list) if !list.is_empty() => list,
            _ => {
                return Err(self.error(
                    Some(span),
                    &key,
                    "proxy_protocol needs the sources allowed to send the header \
                     (add trusted = [\"10.0.0.0/8\"] naming your proxies)"
                        .into(),
                ))
            }
        };
        if list.len() > MAX_TRUSTED {
            return Err(self.error(
                Some(span),
                &key,
                format!(
                    "{} blocks; at most {MAX_TRUSTED} (use wider blocks)",
                    list.len()
                ),
            ));
        }
        let mut trusted = Vec::with_capacity(list.len());
        for (index, text) in list.into_iter().enumerate() {
            match text.get_ref().parse::<Cidr>() {
                Ok(block) => trusted.push(block),
                Err(why) => {
                    return Err(self.error(
                        Some(text.span()),
                        &format!("{key}[{index}]"),
                        format!("{why} (write an address or a block such as \"10.0.0.0/8\")"),
                    ))
                }
            }
        }
        Ok(ProxyProtocolConfig { trusted })
    }
}

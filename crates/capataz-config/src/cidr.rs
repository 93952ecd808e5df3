//! `Cidr`: an address block such as `10.0.0.0/8`, `2001:db8::/32` or a lone address, for lists
//! of trusted sources.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// An IP address block: a network address and a prefix length (an `ipnet::IpNet`). Built only
/// by [`FromStr`], which refuses host bits set beyond the prefix (`10.1.2.3/8` is a typo for
/// `10.0.0.0/8` or for `10.1.2.3/32`, and guessing either is unsafe in an allow-list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl Cidr {
    /// Whether `ip` is inside the block. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how a
    /// dual-stack socket sees an IPv4 client) is judged as the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }
}

/// Why a text is not an address block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The part before `/` is not an IP address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The prefix length is not a number within the family's bits.
    #[error("the prefix length {0:?} is not a number from 0 to {1}")]
    Prefix(String, u8),
    /// Bits are set past the prefix.
    #[error("{0} has bits set past its prefix length (did you mean {1}?)")]
    HostBits(String, Cidr),
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `address` or `address/prefix`, read in two parts so that an error names the part
    /// (ipnet's own parser says only that the whole is not a network).
    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| CidrError::Address(address.to_string()))?;
        let net = match prefix {
            None => IpNet::from(address),
            Some(prefix) => {
                let bits = if address.is_ipv4() { 32 } else { 128 };
                let bad = || CidrError::Prefix(prefix.to_string(), bits);
                // Digits only, at most three: no sign, no `0128`.
                if prefix.is_empty()
                    || prefix.len() > 3
                    || !prefix.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(bad());
                }
                let length = prefix.parse::<u8>().map_err(|_| bad())?;
                IpNet::new(address, length).map_err(|_| bad())?
            }
        };
        let network = Cidr(net.trunc());
        if net.addr() != net.network() {
            return Err(CidrError::HostBits(text.to_string(), network));
        }
        Ok(network)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("a block")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn blocks_contain_their_addresses_and_only_theirs() {
        let ten = cidr("10.0.0.0/8");
        assert!(ten.contains(ip("10.255.0.1")));
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(ten.contains(ip("::ffff:10.1.2.3")), "mapped IPv4 is IPv4");
        assert!(!ten.contains(ip("2001:db8::1")));
        let lone = cidr("127.0.0.1");
        assert_eq!(lone.to_string(), "127.0.0.1/32");
        assert!(lone.contains(ip("127.0.0.1")) && !lone.contains(ip("127.0.0.2")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        let v6 = cidr("2001:db8::/32");
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(cidr("::1").contains(ip("::1")));
    }

    #[test]
    fn bad_blocks_say_what_is_wrong() {
        assert_eq!(
            "10.1.2.3/8".parse::<Cidr>(),
            Err(CidrError::HostBits("10.1.2.3/8".into(), cidr("10.0.0.0/8")))
        );
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "::/129",
            "::/0128",
        ] {
            assert!(
                matches!(bad.parse::<Cidr>(), Err(CidrError::Prefix(..))),
                "{bad}"
            );
        }
        let v6 = "2001:db8::1/32".parse::<Cidr>().unwrap_err();
        assert_eq!(
            v6,
            CidrError::HostBits("2001:db8::1/32".into(), cidr("2001:db8::/32"))
        );
        for bad in ["", "localhost", "10.0.0/8", "10.0.0.0.0"] {
            assert!(
                matches!(bad.parse::<Cidr>(), Err(CidrError::Address(_))),
                "{bad}"
            );
        }
    }

    /// The words an operator reads (the config error adds the file, line and key).
    #[test]
    fn errors_read_as_before() {
        let error = |text: &str| text.parse::<Cidr>().unwrap_err().to_string();
        assert_eq!(
            error("10.1.2.3/8"),
            "10.1.2.3/8 has bits set past its prefix length (did you mean 10.0.0.0/8?)"
        );
        assert_eq!(
            error("::/129"),
            "the prefix length \"129\" is not a number from 0 to 128"
        );
        assert_eq!(error("localhost/8"), "\"localhost\" is not an IP address");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        assert_eq!(cidr("2001:db8::/32").to_string(), "2001:db8::/32");
    }
}

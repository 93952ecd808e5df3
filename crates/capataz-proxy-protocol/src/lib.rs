//! The PROXY protocol (HAProxy's, versions 1 and 2): the header a proxy in front of capataz
//! sends first on a connection to say who the client really is, and the one capataz sends to a
//! backend for the same purpose.
//!
//! This module is IO-free: [`parse`] reads a header from the bytes a connection starts with
//! and says how many it used; [`encode_v1`] and [`encode_v2`] write one. `read.rs` drives
//! `parse` over a socket. Invariants: `parse` never panics and never asks for more than
//! [`MAX_HEADER`] bytes, whatever the input; a header it accepts names addresses of one family.

mod read;

pub use read::{read_header, ReadError, Rewind};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The longest header accepted: a version 1 line is at most 107 bytes; a version 2 header may
/// carry TLVs after its addresses, up to this many bytes in all (HAProxy bounds it by its
/// buffer too). Longer is an error, never a bigger buffer.
pub const MAX_HEADER: usize = 1024;

/// The longest version 1 line, CRLF included (the specification's bound).
const MAX_V1: usize = 107;

/// The 12 bytes every version 2 header starts with.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// What a header says about the connection it came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// The client's and the proxy's addresses as seen by the proxy.
    Proxied {
        /// Where the client connected from.
        source: SocketAddr,
        /// The address the client connected to.
        destination: SocketAddr,
    },
    /// The connection carries no client: version 2's `LOCAL` (the proxy's own health check),
    /// version 1's `UNKNOWN`, or an address family other than IPv4/IPv6 (a Unix socket). The
    /// connection's own addresses apply, as the specification asks.
    Local,
}

/// A parsed header and how many bytes of the input it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The addresses it carries.
    pub addresses: Addresses,
    /// Its version, 1 or 2.
    pub version: u8,
    /// Its length in bytes: what to skip before the connection's own data starts.
    pub length: usize,
}

/// The result of looking at the first bytes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A whole header.
    Header(Header),
    /// The bytes so far start a header (or could): read more. Never returned once
    /// [`MAX_HEADER`] bytes are there.
    Incomplete,
}

/// Why the bytes are not an acceptable header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The connection does not start with a PROXY protocol header at all.
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    /// It starts like one but breaks the grammar.
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(&'static str),
    /// It is longer than [`MAX_HEADER`] bytes (or a version 1 line than 107).
    #[error("PROXY protocol header longer than the limit")]
    TooLong,
}

/// Parses the header at the start of `bytes`: a whole header, a request for more bytes, or an
/// error. Bytes after the header are not looked at.
pub fn parse(bytes: &[u8]) -> Result<Parsed, ParseError> {
    const V1_PREFIX: &[u8] = b"PROXY ";
    if starts_or_prefix(bytes, &V2_SIGNATURE) {
        if bytes.len() < V2_SIGNATURE.len() {
            return Ok(Parsed::Incomplete);
        }
        return parse_v2(bytes);
    }
    if starts_or_prefix(bytes, V1_PREFIX) {
        if bytes.len() < V1_PREFIX.len() {
            return Ok(Parsed::Incomplete);
        }
        return parse_v1(bytes);
    }
    Err(ParseError::Missing)
}

/// Whether `bytes` starts with `prefix`, or is a (possibly empty) beginning of it.
fn starts_or_prefix(bytes: &[u8], prefix: &[u8]) -> bool {
    let n = bytes.len().min(prefix.len());
    bytes[..n] == prefix[..n]
}

fn parse_v1(bytes: &[u8]) -> Result<Parsed, ParseError> {
    let window = &bytes[..bytes.len().min(MAX_V1)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        return if bytes.len() >= MAX_V1 {
            Err(ParseError::TooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    if lf == 0 || window[lf - 1] != b'\r' {
        return Err(ParseError::Malformed(
            "version 1 line does not end with CRLF",
        ));
    }
    let line = std::str::from_utf8(&window[..lf - 1])
        .map_err(|_| ParseError::Malformed("version 1 line is not text"))?;
    let length = lf + 1;
    let mut fields = line.split(' ');
    // `parse` checked the "PROXY " prefix.
    fields.next();
    let family = fields.next().unwrap_or("");
    if family == "UNKNOWN" {
        // The specification lets anything follow UNKNOWN; the receiver ignores it.
        return Ok(Parsed::Header(Header {
            addresses: Addresses::Local,
            version: 1,
            length,
        }));
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(ParseError::Malformed(
                "version 1 family is not TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    let (Some(src), Some(dst), Some(sport), Some(dport), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(ParseError::Malformed(
            "version 1 line does not have four addresses and ports",
        ));
    };
    let ip = |text: &str| -> Result<IpAddr, ParseError> {
        let parsed = if v6 {
            text.parse::<Ipv6Addr>().map(IpAddr::V6)
        } else {
            text.parse::<Ipv4Addr>().map(IpAddr::V4)
        };
        parsed.map_err(|_| ParseError::Malformed("version 1 address does not match its family"))
    };
    let source = SocketAddr::new(ip(src)?, port(sport)?);
    let destination = SocketAddr::new(ip(dst)?, port(dport)?);
    Ok(Parsed::Header(Header {
        addresses: Addresses::Proxied {
            source,
            destination,
        },
        version: 1,
        length,
    }))
}

/// A version 1 port: 1 to 5 decimal digits, at most 65535, no sign, no leading zero.
fn port(text: &str) -> Result<u16, ParseError> {
    let bad = ParseError::Malformed("version 1 port is not a number from 0 to 65535");
    let digits_only =
        !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
    if !digits_only || (text.len() > 1 && text.starts_with('0')) {
        return Err(bad);
    }
    text.parse::<u16>().map_err(|_| bad)
}

fn parse_v2(bytes: &[u8]) -> Result<Parsed, ParseError> {
    const FIXED: usize = 16;
    if bytes.len() < FIXED {
        return Ok(Parsed::Incomplete);
    }
    let version_command = bytes[12];
    if version_command >> 4 != 2 {
        return Err(ParseError::Malformed(
            "version 2 signature with another version",
        ));
    }
    let local = match version_command & 0x0f {
        0 => true,
        1 => false,
        _ => {
            return Err(ParseError::Malformed(
                "version 2 command is neither LOCAL nor PROXY",
            ))
        }
    };
    let family_transport = bytes[13];
    let announced = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    let length = FIXED + announced;
    if length > MAX_HEADER {
        return Err(ParseError::TooLong);
    }
    if bytes.len() < length {
        return Ok(Parsed::Incomplete);
    }
    let body = &bytes[FIXED..length];
    let local_header = Parsed::Header(Header {
        addresses: Addresses::Local,
        version: 2,
        length,
    });
    if local {
        // LOCAL: the proxy speaks for itself; whatever addresses follow are ignored.
        return Ok(local_header);
    }
    let transport = family_transport & 0x0f;
    if transport > 2 {
        return Err(ParseError::Malformed("version 2 transport is unknown"));
    }
    let addresses = match family_transport >> 4 {
        // UNSPEC and AF_UNIX: nothing an IP listener can use; the connection's own apply.
        0 | 3 => return Ok(local_header),
        1 => {
            let a = body
                .get(..12)
                .ok_or(ParseError::Malformed("version 2 length too short for IPv4"))?;
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]));
            (ip(0), ip(4), be16(&a[8..10]), be16(&a[10..12]))
        }
        2 => {
            let a = body
                .get(..36)
                .ok_or(ParseError::Malformed("version 2 length too short for IPv6"))?;
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            (ip(0), ip(16), be16(&a[32..34]), be16(&a[34..36]))
        }
        _ => return Err(ParseError::Malformed("version 2 address family is unknown")),
    };
    if transport != 1 {
        return Err(ParseError::Malformed("version 2 transport is not a stream"));
    }
    let (src, dst, sport, dport) = addresses;
    Ok(Parsed::Header(Header {
        addresses: Addresses::Proxied {
            source: SocketAddr::new(src, sport),
            destination: SocketAddr::new(dst, dport),
        },
        version: 2,
        length,
    }))
}

fn be16(two: &[u8]) -> u16 {
    u16::from_be_bytes([two[0], two[1]])
}

/// A version 1 line for a connection from `source` to `destination`. Mixed families (one IPv4,
/// one IPv6) are written as `TCP6` with the IPv4 address mapped, as HAProxy does.
pub fn encode_v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (src, dst, family) = same_family(source.ip(), destination.ip());
    format!(
        "PROXY {family} {src} {dst} {} {}\r\n",
        source.port(),
        destination.port()
    )
    .into_bytes()
}

/// A version 2 `PROXY` header (stream transport, no TLVs) for a connection from `source` to
/// `destination`, mixed families mapped to IPv6 as in [`encode_v1`].
pub fn encode_v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (src, dst, _) = same_family(source.ip(), destination.ip());
    let mut out = Vec::with_capacity(16 + 36);
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&[0x11, 0, 12]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            out.extend_from_slice(&[0x21, 0, 36]);
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

/// The header of a connection that carries no client, to a peer that expects one: version 2's
/// `LOCAL` (no addresses) or version 1's `PROXY UNKNOWN` line. capataz's health probes send it
/// to backends that get the PROXY protocol (HAProxy does the same for its checks).
pub fn encode_local(version: Version) -> Vec<u8> {
    match version {
        Version::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        Version::V2 => {
            let mut out = Vec::with_capacity(16);
            out.extend_from_slice(&V2_SIGNATURE);
            // Version 2, command LOCAL; family and transport unspecified; no address bytes.
            out.extend_from_slice(&[0x20, 0x00, 0, 0]);
            out
        }
    }
}

/// A version of the PROXY protocol, as a pool sends it to its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The text line (`PROXY TCP4 ...\r\n`).
    V1,
    /// The binary header.
    V2,
}

impl Version {
    /// The header for a connection from `source` to `destination` in this version.
    pub fn encode(self, source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
        match self {
            Version::V1 => encode_v1(source, destination),
            Version::V2 => encode_v2(source, destination),
        }
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr, &'static str) {
    match (a, b) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (a, b, "TCP4"),
        _ => (IpAddr::V6(v6(a)), IpAddr::V6(v6(b)), "TCP6"),
    }
}

#[cfg(test)]
mod tests;

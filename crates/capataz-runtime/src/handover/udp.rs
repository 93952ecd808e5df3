//! The UDP sockets of a handover (`http3:FD=CONFIGURED=BOUND` entries): a TLS listener's
//! HTTP/3 endpoint, which the new process serves on at once, from the same socket.
//!
//! Both processes hold the socket until the old one exits, and the kernel gives each datagram
//! to whichever reads first: QUIC connections cannot be shared that way (a packet of one
//! process's connection read by the other is dropped). So the old process closes its HTTP/3
//! connections when the new one serves (`supervisor/http3.rs`), and from then on only the new
//! one reads the socket.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;

use super::DescriptorError;

/// One UDP socket handed over.
#[derive(Debug)]
pub(crate) struct HandedUdp {
    /// The address the old process's configuration asked for.
    pub configured: SocketAddr,
    /// The address it is bound to.
    pub bound: SocketAddr,
    /// The socket.
    pub socket: UdpSocket,
}

/// The socket in `owned`, if it is a bound IP datagram socket, set non-blocking.
pub(super) fn bound_udp(owned: OwnedFd) -> Result<UdpSocket, DescriptorError> {
    let socket = socket2::Socket::from(owned);
    let domain = socket.domain()?;
    if domain != socket2::Domain::IPV4 && domain != socket2::Domain::IPV6 {
        return Err(DescriptorError::NotIp);
    }
    if socket.r#type()? != socket2::Type::DGRAM {
        return Err(DescriptorError::NotDatagram);
    }
    let bound = socket.local_addr()?.as_socket();
    if bound.is_none_or(|address| address.port() == 0) {
        return Err(DescriptorError::NotBound);
    }
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Where in `sockets` the one for `address` is: the first configured with that address, or
/// else the one bound to it (when `address` names a port).
pub(super) fn position(sockets: &[HandedUdp], address: SocketAddr) -> Option<usize> {
    sockets
        .iter()
        .position(|h| h.configured == address)
        .or_else(|| {
            (address.port() != 0)
                .then(|| sockets.iter().position(|h| h.bound == address))
                .flatten()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bound_udp_socket_is_taken() {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(bound_udp(OwnedFd::from(udp)).is_ok());
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(bound_udp(OwnedFd::from(tcp)).is_err());
        let unbound = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None);
        assert!(bound_udp(OwnedFd::from(unbound.unwrap())).is_err());
    }
}

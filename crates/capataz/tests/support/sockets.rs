//! The TCP sockets this test process holds, read from `/proc/net/tcp` and `/proc/self/fd`
//! (Linux): a listener's socket or its accepted connections, told apart from every other
//! socket the tests running beside it in the same binary open and close meanwhile.

use std::net::SocketAddr;

/// How many of this process's descriptors are TCP sockets bound to `addr` (IPv4) that are
/// listening (`listening`) or not (the connections it accepted): the inodes of the
/// `/proc/net/tcp` rows with that local address, among this process's descriptors.
pub fn held_tcp_sockets(addr: SocketAddr, listening: bool) -> usize {
    let SocketAddr::V4(v4) = addr else {
        panic!("an IPv4 address: {addr}")
    };
    let [a, b, c, d] = v4.ip().octets();
    let local = format!("{d:02X}{c:02X}{b:02X}{a:02X}:{:04X}", v4.port());
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, then st (0A is LISTEN), then the inode, tenth.
            (fields.get(1) == Some(&local.as_str()) && (fields.get(3) == Some(&"0A")) == listening)
                .then(|| fields.get(9).map(|inode| format!("socket:[{inode}]")))
                .flatten()
        })
        .collect();
    if inodes.is_empty() {
        return 0;
    }
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
        .count()
}

//! A minimal epoll: the loop's only way to wait.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An epoll instance; each registered socket is reported with its token.
pub(crate) struct Epoll(OwnedFd);

/// What a socket is watched for, edge-triggered: each change is reported once, so a
/// connection reads only while an answer is awaited and idle ones cost nothing.
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: a plain system call; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is open and owned by nothing else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` until it is closed (closing it is what removes it).
    pub(crate) fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: INTEREST,
            u64: token,
        };
        // SAFETY: `event` is valid for the call; the kernel copies it.
        let done =
            unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` (rounded up to a millisecond, as tokio's timer does) for events,
    /// which replace `events`' contents: each a token and its readiness flags.
    pub(crate) fn wait(
        &self,
        events: &mut Vec<libc::epoll_event>,
        timeout: Duration,
    ) -> io::Result<()> {
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        events.clear();
        let room = events.capacity().min(i32::MAX as usize) as i32;
        // SAFETY: the kernel writes at most `room` events into the vector's spare capacity.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), room, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: the kernel initialised the first `n` (<= `room`) events.
        unsafe { events.set_len(n as usize) };
        Ok(())
    }
}

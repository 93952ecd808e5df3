//! The schedule, run by one loop over every connection: no task, no timer per request.
//!
//! Request `n` (from 0) is due at `start + n / rate` on connection `n % c`: connection `i`
//! every `c / rate` seconds, offset by `i / rate`. A cursor walks the requests in that order
//! as they come due and sends each whose connection is free, its latency counted from when it
//! is sent; a connection that frees up (an answer, a failure, a new connection open) after its
//! next request came due sends it at once, its latency counted from when it was due. The loop
//! sleeps in `epoll_wait` until a socket is ready or the millisecond boundary (counted from the
//! start) at or after the cursor's next due time: the requests due within a millisecond go out
//! together at its end, as tokio's timer wheel sent them in openload's first version.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::connection::Connection;
use crate::poll::Epoll;
use crate::{Tally, SLOW_KEPT};

/// Where a connection is.
enum State {
    /// Open, no request outstanding.
    Idle,
    /// Its request sent (but the first `sent` bytes: the rest when the socket is writable),
    /// its answer awaited; latency counts from `began`.
    Busy { began: Instant, sent: usize },
    /// A new connection being opened, after a failure.
    Connecting,
    /// No connection (the server closed it, or opening one failed): its next request fails
    /// with this error when due, and a new connection is opened.
    Down(String),
}

struct Slot {
    /// Open or being opened: `Idle`, `Busy` and `Connecting`.
    link: Option<Connection>,
    state: State,
    /// The request it is on (`Busy`), or its next one: `n` with `n % c` its index.
    next: u64,
}

struct Load<'a> {
    args: &'a Args,
    epoll: Epoll,
    slots: Vec<Slot>,
    tally: Tally,
    start: Instant,
    /// Requests per second.
    rate: u64,
    /// Requests `0..total` are due before the end of the run; those from `measured` on count.
    total: u64,
    measured: u64,
    /// Connections with requests still to send or answers still to come.
    unfinished: usize,
}

/// Runs the schedule on `streams` (connection `i` is `streams[i]`) from `start`; gives what
/// came back. An answer still missing 5 s after the end is a failure, and the run ends.
pub(crate) fn run(args: &Args, streams: Vec<TcpStream>, start: Instant) -> std::io::Result<Tally> {
    let epoll = Epoll::new()?;
    let mut slots = Vec::with_capacity(streams.len());
    for (i, stream) in streams.into_iter().enumerate() {
        let link = Connection::from_stream(stream)?;
        epoll.add(link.fd(), i as u64)?;
        slots.push(Slot {
            link: Some(link),
            state: State::Idle,
            next: i as u64,
        });
    }
    let rate = args.rate;
    // The first request due at or after `after` from the start: ceil(after * rate / 1e9).
    let first_after =
        |after: Duration| (after.as_nanos() * u128::from(rate)).div_ceil(1_000_000_000) as u64;
    let total = first_after(args.warmup + args.duration);
    let measured = first_after(args.warmup);
    let give_up = start + args.warmup + args.duration + Duration::from_secs(5);
    let expected = (total - measured).min(1 << 24) as usize;
    let mut load = Load {
        args,
        epoll,
        unfinished: slots.iter().filter(|s| s.next < total).count(),
        slots,
        tally: Tally {
            latencies_us: Vec::with_capacity(expected),
            ..Tally::default()
        },
        start,
        rate,
        total,
        measured,
    };
    let mut events = Vec::with_capacity(load.slots.len().clamp(1, 1024));
    let mut cursor = 0;
    while load.unfinished > 0 {
        let now = Instant::now();
        if now >= give_up {
            load.give_up();
            break;
        }
        // Requests go out on a millisecond grid counted from the start, as tokio's timer wheel
        // fired them before: those due up to the last boundary passed, together. Waking once
        // for many requests, here and in the server, costs far less than once for each (on
        // the 2-vCPU VM, sending each the moment it came due doubled the CPU per request of
        // both openload and nginx: each woke up for nearly every request).
        if now >= start {
            let boundary = start + floor_ms(now - start);
            while cursor < total && load.due(cursor) <= boundary {
                load.release(cursor);
                cursor += 1;
            }
        }
        let wake = if cursor < total {
            (start + ceil_ms(load.due(cursor) - start)).min(give_up)
        } else {
            give_up
        };
        load.epoll
            .wait(&mut events, wake.saturating_duration_since(now))?;
        for event in &events {
            let (token, flags) = (event.u64, event.events);
            load.on_event(token as usize, flags);
        }
    }
    Ok(load.tally)
}

fn floor_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

fn ceil_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_nanos().div_ceil(1_000_000) as u64)
}

impl Load<'_> {
    /// When request `n` is due: `n / rate` seconds after the start, to the nanosecond (in
    /// whole seconds and a remainder, so that nothing overflows 64 bits).
    fn due(&self, n: u64) -> Instant {
        let (seconds, rest) = (n / self.rate, n % self.rate);
        self.start + Duration::new(seconds, (rest * 1_000_000_000 / self.rate) as u32)
    }

    /// Request `n` is due now: sent if its connection is free (its latency counts from now),
    /// failed if it has none; otherwise it goes when the connection frees up.
    fn release(&mut self, n: u64) {
        let i = (n % self.slots.len() as u64) as usize;
        if self.slots[i].next != n {
            return;
        }
        match self.slots[i].state {
            State::Idle => {
                if self.send(i, Instant::now()) {
                    self.catch_up(i);
                }
            }
            State::Down(_) => self.catch_up(i),
            State::Busy { .. } | State::Connecting => {}
        }
    }

    /// Connection `i` is free: each of its requests already due goes at once (in turn, as
    /// long as answers are at hand), its latency counted from when it was due; with no
    /// connection, each fails.
    fn catch_up(&mut self, i: usize) {
        while self.slots[i].next < self.total {
            let due = self.due(self.slots[i].next);
            if due > Instant::now() {
                return; // the cursor sends it when due
            }
            match &self.slots[i].state {
                State::Idle => {
                    if !self.send(i, due) {
                        return;
                    }
                }
                State::Down(e) => {
                    let e = e.clone();
                    self.finish(i, Err(e));
                }
                State::Busy { .. } | State::Connecting => return,
            }
        }
    }

    /// Sends connection `i`'s next request; whether its exchange is already over (see
    /// [`Load::proceed`]).
    fn send(&mut self, i: usize, began: Instant) -> bool {
        self.slots[i].state = State::Busy { began, sent: 0 };
        self.proceed(i)
    }

    /// Moves connection `i`'s exchange on: the rest of its request, then its answer. Gives
    /// whether the exchange is over (answered or failed): the caller then sees to the next
    /// request, as a loop rather than a recursion as deep as a backlog.
    fn proceed(&mut self, i: usize) -> bool {
        let slot = &mut self.slots[i];
        let (State::Busy { sent, .. }, Some(link)) = (&mut slot.state, slot.link.as_mut()) else {
            return false;
        };
        let request = &self.args.request;
        let outcome = loop {
            if *sent == request.len() {
                break link.answer();
            }
            match link.write(&request[*sent..]) {
                Ok(0) => return false, // the rest when the socket is writable again
                Ok(n) => *sent += n,
                Err(e) => break Err(e),
            }
        };
        match outcome {
            Ok(None) => return false,
            Ok(Some(status)) => self.finish(i, Ok(status)),
            Err(e) => self.finish(i, Err(e)),
        }
        true
    }

    fn on_event(&mut self, i: usize, flags: u32) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let Some(link) = slot.link.as_mut() else {
            return;
        };
        link.ready(flags);
        match slot.state {
            State::Busy { .. } => {
                if self.proceed(i) {
                    self.catch_up(i);
                }
            }
            State::Connecting => {
                let done = (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32;
                if flags & done == 0 {
                    return;
                }
                slot.state = match link.opened() {
                    Ok(()) => State::Idle,
                    Err(e) => {
                        slot.link = None;
                        State::Down(format!("connect: {e}"))
                    }
                };
                self.catch_up(i);
            }
            State::Idle | State::Down(_) => {}
        }
    }

    /// Connection `i`'s request is done: answered with `status`, or failed. Counts it if it
    /// is measured and moves the connection to its next request (a failure opens a new
    /// connection for it); the caller sends that request if it is due.
    fn finish(&mut self, i: usize, outcome: Result<u16, String>) {
        self.record(i, outcome.as_ref().copied().map_err(String::as_str));
        let slot = &mut self.slots[i];
        slot.state = match outcome {
            Ok(_) if slot.link.as_ref().is_some_and(|l| l.closing) => {
                slot.link = None;
                State::Down("the server closed the connection".into())
            }
            Ok(_) => State::Idle,
            // A new connection for the next request; a failed connect fails that one.
            Err(_) => {
                slot.link = None;
                match Connection::connect(self.args.addr) {
                    Ok((link, open)) => match self.epoll.add(link.fd(), i as u64) {
                        Ok(()) => {
                            slot.link = Some(link);
                            if open {
                                State::Idle
                            } else {
                                State::Connecting
                            }
                        }
                        Err(e) => State::Down(format!("connect: {e}")),
                    },
                    Err(e) => State::Down(format!("connect: {e}")),
                }
            }
        };
    }

    /// Counts connection `i`'s request, if measured, and moves the connection past it.
    fn record(&mut self, i: usize, outcome: Result<u16, &str>) {
        let n = self.slots[i].next;
        self.slots[i].next += self.slots.len() as u64;
        if self.slots[i].next >= self.total && n < self.total {
            self.unfinished -= 1;
        }
        self.tally.all += 1;
        if n < self.measured {
            return;
        }
        let due = self.due(n);
        let tally = &mut self.tally;
        tally.due += 1;
        match (outcome, &self.slots[i].state) {
            (Ok(status), State::Busy { began, .. }) => {
                let now = Instant::now();
                let latency = now.duration_since(*began);
                let us = latency.as_micros().min(u32::MAX as u128) as u32;
                tally.latencies_us.push(us);
                if self.args.slow.is_some_and(|slow| latency > slow) && tally.slow.len() < SLOW_KEPT
                {
                    tally.slow.push((i, due, us));
                }
                tally.last_answer = Some(now);
                if !(200..300).contains(&status) {
                    tally.not_2xx += 1;
                }
            }
            (Ok(_), _) => {} // an answer comes only to a request sent
            (Err(e), _) => {
                tally.failed += 1;
                tally.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// The run's end plus 5 s: every answer still missing fails.
    fn give_up(&mut self) {
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].state, State::Busy { .. }) && self.slots[i].next < self.total
            {
                self.record(i, Err("no answer before the run's end"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::args::Args;
    use crate::Tally;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// Runs `openload ARGS http://SERVER/` against a server answering each request after
    /// `delay` with `answer` (and closing if it says so).
    fn run(args: &str, answer: &'static [u8], delay: Duration) -> Tally {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0; 4096];
                    // Every request fits one read here; one read, one answer.
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {
                        std::thread::sleep(delay);
                        if stream.write_all(answer).is_err() || answer.ends_with(b"close\r\n\r\n") {
                            return;
                        }
                    }
                });
            }
        });
        let args = Args::parse(format!("{args} {url}").split(' ').map(String::from)).unwrap();
        let streams = (0..args.connections)
            .map(|_| TcpStream::connect(args.addr).unwrap())
            .collect();
        super::run(&args, streams, Instant::now()).unwrap()
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";

    #[test]
    fn every_request_due_in_the_run_is_sent_and_counted_once() {
        let tally = run("-r 1000 -c 4 -d 1 -w 1", OK, Duration::ZERO);
        assert_eq!((tally.due, tally.failed), (1000, 0));
        assert_eq!(tally.latencies_us.len(), 1000);
    }

    #[test]
    fn a_connection_the_server_closes_fails_its_next_request_then_reopens() {
        let close = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let tally = run("-r 400 -c 2 -d 1 -w 0", close, Duration::ZERO);
        assert_eq!((tally.due, tally.failed), (400, 200));
        assert_eq!(tally.latencies_us.len(), 200);
    }

    #[test]
    fn a_request_due_while_its_connection_is_busy_counts_from_when_it_was_due() {
        // One connection, a request due every 5 ms, each answer 10 ms after its request: the
        // 200 requests wait for one another, the last about a second.
        let tally = run("-r 200 -c 1 -d 1 -w 0", OK, Duration::from_millis(10));
        assert_eq!((tally.due, tally.failed), (200, 0));
        let worst = *tally.latencies_us.iter().max().unwrap();
        assert!((900_000..3_000_000).contains(&worst), "{worst} us");
    }
}

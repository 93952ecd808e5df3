//! capataz's HTTP/1.1 client side, without IO: parsing a backend's response head, deciding how
//! its body is delimited (RFC 9112 section 6.3) and whether the connection can carry another
//! request, reading a body as it arrives (`body::BodyReader`, chunked decoding included), and
//! encoding a request head. `upstream` does the IO, over any `upstream::Transport`; nothing
//! here depends on tokio or on a socket type, so a new transport touches none of it.
//!
//! capataz speaks HTTP/1.1 to backends itself rather than through hyper's client: an idle
//! backend connection then holds only its socket (no dispatch channel, task or buffers), and a
//! request goes out from the task that received it. See BENCHMARKS.md, Memory.
//!
//! A crate of its own, without tokio or any socket type among its dependencies: the compiler
//! keeps it sans-IO. The `h1_response` fuzz target (`fuzz/`) drives it.

pub mod body;
pub mod chunked;
pub mod framing;
pub mod head;
pub mod request;

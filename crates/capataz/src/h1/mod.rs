//! The pieces of an HTTP/1.1 client for backend connections, without IO: parsing a response
//! head, deciding how its body is delimited (RFC 9112 section 6.3) and whether the connection
//! can carry another request, decoding a chunked body, and encoding a request head.
//!
//! Not wired in yet: backend connections still go through hyper's client. These are the parts
//! of capataz's own client (no dispatch channel or task per connection, buffers only while a
//! request is in flight); see BENCHMARKS.md, Memory.

pub(crate) mod chunked;
pub(crate) mod framing;
pub(crate) mod head;
pub(crate) mod request;

use super::StreamId;

use bytes::BufMut;

#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct Head {
    kind: Kind,
    flag: u8,
    stream_id: StreamId,
}

#[repr(u8)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Kind {
    Data = 0,
    Headers = 1,
    Priority = 2,
    Reset = 3,
    Settings = 4,
    PushPromise = 5,
    Ping = 6,
    GoAway = 7,
    WindowUpdate = 8,
    Continuation = 9,
    Unknown,
}

// ===== impl Head =====

impl Head {
    pub fn new(kind: Kind, flag: u8, stream_id: StreamId) -> Head {
        Head {
            kind,
            flag,
            stream_id,
        }
    }

    /// Parse an HTTP/2 frame header
    pub fn parse(header: &[u8]) -> Head {
        let (stream_id, _) = StreamId::parse(&header[5..]);

        Head {
            kind: Kind::new(header[3]),
            flag: header[4],
            stream_id,
        }
    }

    pub fn stream_id(&self) -> StreamId {
        self.stream_id
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn flag(&self) -> u8 {
        self.flag
    }

    pub fn encode_len(&self) -> usize {
        super::HEADER_LEN
    }

    pub fn encode<T: BufMut>(&self, payload_len: usize, dst: &mut T) {
        debug_assert!(self.encode_len() <= dst.remaining_mut());

        // capataz: the 9 bytes in one `put_slice` instead of four `put_*` calls (each one
        // checking and advancing `dst`, a `Limit` around the write buffer for HEADERS); the same
        // bytes as `put_uint(payload_len, 3)` (its low three bytes), kind, flags, `put_u32(id)`.
        let len = (payload_len as u64).to_be_bytes();
        let id = u32::from(self.stream_id).to_be_bytes();
        dst.put_slice(&[
            len[5],
            len[6],
            len[7],
            self.kind as u8,
            self.flag,
            id[0],
            id[1],
            id[2],
            id[3],
        ]);
    }
}

// ===== impl Kind =====

impl Kind {
    pub fn new(byte: u8) -> Kind {
        match byte {
            0 => Kind::Data,
            1 => Kind::Headers,
            2 => Kind::Priority,
            3 => Kind::Reset,
            4 => Kind::Settings,
            5 => Kind::PushPromise,
            6 => Kind::Ping,
            7 => Kind::GoAway,
            8 => Kind::WindowUpdate,
            9 => Kind::Continuation,
            _ => Kind::Unknown,
        }
    }
}

// capataz: `Head::encode` writes what upstream's four `put_*` calls wrote.
#[cfg(test)]
mod test {
    use super::*;
    use bytes::BytesMut;

    #[test]
    fn encode_is_upstreams() {
        let kinds = [
            Kind::Data,
            Kind::Headers,
            Kind::Settings,
            Kind::WindowUpdate,
            Kind::Continuation,
        ];
        let lens = [0, 1, 9, 255, 256, 16_384, 0xFF_FFFF, 0x100_0000, usize::MAX];
        let ids = [0, 1, 3, 0x0102_0304, 0x7FFF_FFFF];
        for &kind in &kinds {
            for flag in [0, 0x1, 0x4, 0x25, 0xFF] {
                for id in ids {
                    for len in lens {
                        let head = Head::new(kind, flag, StreamId::from(id));
                        let mut upstream = BytesMut::new();
                        upstream.put_uint(len as u64, 3);
                        upstream.put_u8(kind as u8);
                        upstream.put_u8(flag);
                        upstream.put_u32(head.stream_id().into());
                        let mut ours = BytesMut::new();
                        head.encode(len, &mut ours);
                        assert_eq!(ours, upstream, "{:?} {} {} {}", kind, flag, id, len);
                        // Through a `Limit`, as HEADERS frames are encoded.
                        let mut limited = BytesMut::new();
                        head.encode(len, &mut (&mut limited).limit(9));
                        assert_eq!(limited, upstream);
                    }
                }
            }
        }
    }
}

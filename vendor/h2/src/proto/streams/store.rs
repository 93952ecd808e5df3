use super::*;

use indexmap::{self, IndexMap};

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::marker::PhantomData;
use std::ops;

/// Storage for streams
#[derive(Debug)]
pub(super) struct Store {
    slab: slab::Slab<Stream>,
    // capataz: stream ids are hashed by `StreamIdHash` (a few multiplications and shifts)
    // instead of the default SipHash-1-3 (`RandomState`): see `StreamIdHash`.
    ids: IndexMap<StreamId, SlabIndex, StreamIdHash>,
}

/// capataz: the hasher of the store's stream ids: MurmurHash3's 64-bit finalizer over the id
/// xor a random 64-bit key, about 10 instructions, where SipHash-1-3 (`RandomState`, upstream's)
/// cost about 120 a hash with its call, and a request takes two (the HEADERS frame's lookup,
/// whose hash the insertion reuses, and the removal; `IndexMap` keeps each entry's hash, so the
/// entry `swap_remove` moves is not hashed again).
///
/// The finalizer mixes every bit of its input into every bit of the result, so ids in any
/// pattern a peer may choose (consecutive odd numbers, or ids equal modulo a power of two)
/// spread over the buckets as random values would; the key, drawn from `RandomState` for each
/// connection and never sent, makes which ids share a bucket differ between connections.
/// Unlike SipHash it is not a keyed pseudo-random function: a peer able to time lookups might
/// in theory learn something of the key.
///
/// Even against a peer that knew the key, lookups could not become quadratic: the peer picks
/// the ids of the streams it opens, but they must be strictly increasing (a lower id is a
/// connection error before any lookup inserts it), and the map holds only streams that are
/// not closed yet: at most `max_concurrent_streams` opened by the peer (one more is refused
/// before it is inserted), the locally reset ones waiting to expire (at most
/// `max_concurrent_reset_streams`), and those this side opened (as many as the application
/// asked for). A closed stream is unlinked from the map at once (`Counts::transition_after`),
/// and the ids of closed streams are not kept (an id is told idle or closed by comparing it
/// with the next expected one). A lookup walks at most those entries, bounded as the memory
/// they hold is.
#[derive(Debug, Clone, Copy)]
struct StreamIdHash {
    key: u64,
}

impl StreamIdHash {
    fn new() -> Self {
        let mut random = RandomState::new().build_hasher();
        random.write_u8(0);
        StreamIdHash {
            key: random.finish() | 1,
        }
    }
}

impl BuildHasher for StreamIdHash {
    type Hasher = StreamIdHasher;

    fn build_hasher(&self) -> StreamIdHasher {
        StreamIdHasher {
            key: self.key,
            value: 0,
        }
    }
}

/// capataz: see `StreamIdHash`. `StreamId` hashes as one `u32` (its derived `Hash`).
struct StreamIdHasher {
    key: u64,
    value: u64,
}

impl Hasher for StreamIdHasher {
    #[inline]
    fn write_u32(&mut self, id: u32) {
        self.value = (self.value << 32) ^ u64::from(id);
    }

    // Not reached by `StreamId`, which writes one `u32`; kept correct for any other input.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.value = self.value.rotate_left(8) ^ u64::from(byte);
        }
    }

    // MurmurHash3's 64-bit finalizer (`fmix64`) over the id xor the key: every bit of the
    // result depends on every bit of the id, so ids in any arithmetic progression (a peer's
    // ids go up by 2) spread over the buckets (`hash & mask`) and tags (`hash >> 57`) as
    // random values would. A plain multiplication does not: its high bits, for ids in a
    // progression, fall on few buckets for about one key in a hundred.
    #[inline]
    fn finish(&self) -> u64 {
        let mut x = self.value ^ self.key;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

/// "Pointer" to an entry in the store
pub(super) struct Ptr<'a> {
    key: Key,
    store: &'a mut Store,
}

/// References an entry in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    index: SlabIndex,
    /// Keep the stream ID in the key as an ABA guard, since slab indices
    /// could be re-used with a new stream.
    stream_id: StreamId,
}

// We can never have more than `StreamId::MAX` streams in the store,
// so we can save a smaller index (u32 vs usize).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlabIndex(u32);

pub(super) struct Queue<N> {
    indices: Option<store::Indices>,
    _p: PhantomData<N>,
}

pub(super) trait Next {
    fn next(stream: &Stream) -> Option<Key>;

    fn set_next(stream: &mut Stream, key: Option<Key>);

    fn take_next(stream: &mut Stream) -> Option<Key>;

    fn is_queued(stream: &Stream) -> bool;

    fn set_queued(stream: &mut Stream, val: bool);
}

/// A linked list
#[derive(Debug, Clone, Copy)]
struct Indices {
    pub head: Key,
    pub tail: Key,
}

pub(super) enum Entry<'a> {
    Occupied(OccupiedEntry<'a>),
    Vacant(VacantEntry<'a>),
}

pub(super) struct OccupiedEntry<'a> {
    ids: indexmap::map::OccupiedEntry<'a, StreamId, SlabIndex>,
}

pub(super) struct VacantEntry<'a> {
    ids: indexmap::map::VacantEntry<'a, StreamId, SlabIndex>,
    slab: &'a mut slab::Slab<Stream>,
}

pub(super) trait Resolve {
    fn resolve(&mut self, key: Key) -> Ptr<'_>;
}

// ===== impl Store =====

impl Store {
    pub fn new() -> Self {
        Store {
            slab: slab::Slab::new(),
            ids: IndexMap::with_hasher(StreamIdHash::new()),
        }
    }

    pub fn find_mut(&mut self, id: &StreamId) -> Option<Ptr<'_>> {
        let index = {
            let key = self.ids.get(id)?;
            *key
        };

        Some(Ptr {
            key: Key {
                index,
                stream_id: *id,
            },
            store: self,
        })
    }

    pub fn insert(&mut self, id: StreamId, val: Stream) -> Ptr<'_> {
        let index = SlabIndex(self.slab.insert(val) as u32);
        assert!(self.ids.insert(id, index).is_none());

        Ptr {
            key: Key {
                index,
                stream_id: id,
            },
            store: self,
        }
    }

    pub fn find_entry(&mut self, id: StreamId) -> Entry<'_> {
        use self::indexmap::map::Entry::*;

        match self.ids.entry(id) {
            Occupied(e) => Entry::Occupied(OccupiedEntry { ids: e }),
            Vacant(e) => Entry::Vacant(VacantEntry {
                ids: e,
                slab: &mut self.slab,
            }),
        }
    }

    #[allow(clippy::blocks_in_conditions)]
    pub(crate) fn for_each<F>(&mut self, mut f: F)
    where
        F: FnMut(Ptr),
    {
        match self.try_for_each(|ptr| {
            f(ptr);
            Ok::<_, Infallible>(())
        }) {
            Ok(()) => (),
            #[allow(unused)]
            Err(infallible) => match infallible {},
        }
    }

    pub fn try_for_each<F, E>(&mut self, mut f: F) -> Result<(), E>
    where
        F: FnMut(Ptr) -> Result<(), E>,
    {
        let mut len = self.ids.len();
        let mut i = 0;

        while i < len {
            // Get the key by index, this makes the borrow checker happy
            let (stream_id, index) = {
                let entry = self.ids.get_index(i).unwrap();
                (*entry.0, *entry.1)
            };

            f(Ptr {
                key: Key { index, stream_id },
                store: self,
            })?;

            // TODO: This logic probably could be better...
            let new_len = self.ids.len();

            if new_len < len {
                debug_assert!(new_len == len - 1);
                len -= 1;
            } else {
                i += 1;
            }
        }

        Ok(())
    }
}

impl Resolve for Store {
    fn resolve(&mut self, key: Key) -> Ptr<'_> {
        Ptr { key, store: self }
    }
}

impl ops::Index<Key> for Store {
    type Output = Stream;

    fn index(&self, key: Key) -> &Self::Output {
        self.slab
            .get(key.index.0 as usize)
            .filter(|s| s.id == key.stream_id)
            .unwrap_or_else(|| {
                panic!("dangling store key for stream_id={:?}", key.stream_id);
            })
    }
}

impl ops::IndexMut<Key> for Store {
    fn index_mut(&mut self, key: Key) -> &mut Self::Output {
        self.slab
            .get_mut(key.index.0 as usize)
            .filter(|s| s.id == key.stream_id)
            .unwrap_or_else(|| {
                panic!("dangling store key for stream_id={:?}", key.stream_id);
            })
    }
}

impl Store {
    #[cfg(feature = "unstable")]
    pub fn num_active_streams(&self) -> usize {
        self.ids.len()
    }

    #[cfg(feature = "unstable")]
    pub fn num_wired_streams(&self) -> usize {
        self.slab.len()
    }
}

// While running h2 unit/integration tests, enable this debug assertion.
//
// In practice, we don't need to ensure this. But the integration tests
// help to make sure we've cleaned up in cases where we could (like, the
// runtime isn't suddenly dropping the task for unknown reasons).
#[cfg(feature = "unstable")]
impl Drop for Store {
    fn drop(&mut self) {
        use std::thread;

        if !thread::panicking() {
            debug_assert!(self.slab.is_empty());
        }
    }
}

// ===== impl Queue =====

impl<N> Queue<N>
where
    N: Next,
{
    pub fn new() -> Self {
        Queue {
            indices: None,
            _p: PhantomData,
        }
    }

    pub fn take(&mut self) -> Self {
        Queue {
            indices: self.indices.take(),
            _p: PhantomData,
        }
    }

    /// Queue the stream.
    ///
    /// If the stream is already contained by the list, return `false`.
    pub fn push(&mut self, stream: &mut store::Ptr) -> bool {
        tracing::trace!("Queue::push_back");

        if N::is_queued(stream) {
            tracing::trace!(" -> already queued");
            return false;
        }

        N::set_queued(stream, true);

        // The next pointer shouldn't be set
        debug_assert!(N::next(stream).is_none());

        // Queue the stream
        match self.indices {
            Some(ref mut idxs) => {
                tracing::trace!(" -> existing entries");

                // Update the current tail node to point to `stream`
                let key = stream.key();
                N::set_next(&mut stream.resolve(idxs.tail), Some(key));

                // Update the tail pointer
                idxs.tail = stream.key();
            }
            None => {
                tracing::trace!(" -> first entry");
                self.indices = Some(store::Indices {
                    head: stream.key(),
                    tail: stream.key(),
                });
            }
        }

        true
    }

    /// Queue the stream
    ///
    /// If the stream is already contained by the list, return `false`.
    pub fn push_front(&mut self, stream: &mut store::Ptr) -> bool {
        tracing::trace!("Queue::push_front");

        if N::is_queued(stream) {
            tracing::trace!(" -> already queued");
            return false;
        }

        N::set_queued(stream, true);

        // The next pointer shouldn't be set
        debug_assert!(N::next(stream).is_none());

        // Queue the stream
        match self.indices {
            Some(ref mut idxs) => {
                tracing::trace!(" -> existing entries");

                // Update the provided stream to point to the head node
                let head_key = stream.resolve(idxs.head).key();
                N::set_next(stream, Some(head_key));

                // Update the head pointer
                idxs.head = stream.key();
            }
            None => {
                tracing::trace!(" -> first entry");
                self.indices = Some(store::Indices {
                    head: stream.key(),
                    tail: stream.key(),
                });
            }
        }

        true
    }

    pub fn pop<'a, R>(&mut self, store: &'a mut R) -> Option<store::Ptr<'a>>
    where
        R: Resolve,
    {
        if let Some(mut idxs) = self.indices {
            let mut stream = store.resolve(idxs.head);

            if idxs.head == idxs.tail {
                assert!(N::next(&stream).is_none());
                self.indices = None;
            } else {
                idxs.head = N::take_next(&mut stream).unwrap();
                self.indices = Some(idxs);
            }

            debug_assert!(N::is_queued(&stream));
            N::set_queued(&mut stream, false);

            return Some(stream);
        }

        None
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_none()
    }

    pub fn pop_if<'a, R, F>(&mut self, store: &'a mut R, f: F) -> Option<store::Ptr<'a>>
    where
        R: Resolve,
        F: Fn(&Stream) -> bool,
    {
        if let Some(idxs) = self.indices {
            let should_pop = f(&store.resolve(idxs.head));
            if should_pop {
                return self.pop(store);
            }
        }

        None
    }
}

impl<N> fmt::Debug for Queue<N> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Queue")
            .field("indices", &self.indices)
            // skip phantom data
            .finish()
    }
}

// ===== impl Ptr =====

impl<'a> Ptr<'a> {
    /// Returns the Key associated with the stream
    pub fn key(&self) -> Key {
        self.key
    }

    pub fn store_mut(&mut self) -> &mut Store {
        self.store
    }

    /// Remove the stream from the store
    pub fn remove(self) -> StreamId {
        // The stream must have been unlinked before this point
        debug_assert!(!self.store.ids.contains_key(&self.key.stream_id));

        // Remove the stream state
        let stream = self.store.slab.remove(self.key.index.0 as usize);
        assert_eq!(stream.id, self.key.stream_id);
        stream.id
    }

    /// Remove the StreamId -> stream state association.
    ///
    /// This will effectively remove the stream as far as the H2 protocol is
    /// concerned.
    pub fn unlink(&mut self) {
        let id = self.key.stream_id;
        self.store.ids.swap_remove(&id);
    }
}

impl<'a> Resolve for Ptr<'a> {
    fn resolve(&mut self, key: Key) -> Ptr<'_> {
        Ptr {
            key,
            store: &mut *self.store,
        }
    }
}

impl<'a> ops::Deref for Ptr<'a> {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        &self.store[self.key]
    }
}

impl<'a> ops::DerefMut for Ptr<'a> {
    fn deref_mut(&mut self) -> &mut Stream {
        &mut self.store[self.key]
    }
}

impl<'a> fmt::Debug for Ptr<'a> {
    fn fmt(&self, fmt: &mut fmt::Formatter) -> fmt::Result {
        (**self).fmt(fmt)
    }
}

// ===== impl OccupiedEntry =====

impl<'a> OccupiedEntry<'a> {
    pub fn key(&self) -> Key {
        let stream_id = *self.ids.key();
        let index = *self.ids.get();
        Key { index, stream_id }
    }
}

// ===== impl VacantEntry =====

impl<'a> VacantEntry<'a> {
    pub fn insert(self, value: Stream) -> Key {
        // Insert the value in the slab
        let stream_id = value.id;
        let index = SlabIndex(self.slab.insert(value) as u32);

        // Insert the handle in the ID map
        self.ids.insert(index);

        Key { index, stream_id }
    }
}

// capataz: tests of `StreamIdHash` (patch 0009).
#[cfg(test)]
mod test {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::hash::Hash;

    fn hash(builder: &StreamIdHash, id: u32) -> u64 {
        let mut hasher = builder.build_hasher();
        StreamId::from(id).hash(&mut hasher);
        hasher.finish()
    }

    // A peer's ids are consecutive odd numbers, or any increasing ids it likes: they must
    // spread over the buckets (the low bits) and the tags (the top 7 bits) as random values
    // would, whatever the key.
    #[test]
    fn stream_id_hash_spreads_consecutive_ids() {
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..64 {
            let builder = StreamIdHash { key: rng.gen() };
            for (first, step) in [
                (1u32, 2),
                (2, 2),
                (1 << 20 | 1, 2),
                ((1 << 31) - 513, 2),
                (1, 256),
                (7, 1 << 16),
            ] {
                let ids = (0..256).map(|i| first + step * i);
                let mut buckets = [0u32; 256];
                let mut tags = [0u32; 128];
                for id in ids {
                    let h = hash(&builder, id);
                    buckets[(h & 255) as usize] += 1;
                    tags[(h >> 57) as usize] += 1;
                }
                // 256 random values in 256 buckets fill about 162 of them, the fullest
                // holding about 5; in 128 tags, about 111 (for the keys of this seed: 145-184
                // buckets, at most 8 in one, 102-122 tags). A multiplication alone left 2
                // buckets in use for one key in 64.
                let used = buckets.iter().filter(|&&n| n > 0).count();
                assert!(used >= 130, "{used} buckets used, key {:#x}", builder.key);
                assert!(buckets.iter().all(|&n| n <= 10), "key {:#x}", builder.key);
                let used = tags.iter().filter(|&&n| n > 0).count();
                assert!(used >= 90, "{used} tags used, key {:#x}", builder.key);
            }
        }
    }

    // Each store draws its own key.
    #[test]
    fn stream_id_hash_keys_differ() {
        let keys: std::collections::HashSet<u64> =
            (0..64).map(|_| StreamIdHash::new().key).collect();
        assert_eq!(keys.len(), 64);
        assert!(keys.iter().all(|key| key & 1 == 1));
    }

    // The hasher places entries only: the store finds, unlinks and walks its streams (in
    // `try_for_each`'s order, which depends on insertions and `swap_remove`s alone) as with
    // upstream's `RandomState`.
    #[test]
    fn store_behaves_as_with_siphash() {
        let mut rng = StdRng::seed_from_u64(25);
        let mut store = Store::new();
        let mut reference: IndexMap<StreamId, ()> = IndexMap::new();
        let mut live: Vec<Key> = Vec::new();
        let mut next = 1u32;
        for _ in 0..20_000 {
            if live.is_empty() || (live.len() < 300 && rng.gen_bool(0.5)) {
                next += 2 * rng.gen_range(1..4);
                let id = StreamId::from(next);
                let key = match store.find_entry(id) {
                    Entry::Vacant(e) => e.insert(Stream::new(id, 65_535, 65_535)),
                    Entry::Occupied(_) => panic!("{id:?} found before it was inserted"),
                };
                reference.insert(id, ());
                live.push(key);
            } else {
                let key = live.swap_remove(rng.gen_range(0..live.len()));
                let mut ptr = store.resolve(key);
                ptr.unlink();
                ptr.remove();
                reference.swap_remove(&key.stream_id);
            }
            if rng.gen_range(0..50) == 0 {
                let mut walked = Vec::new();
                store.for_each(|ptr| walked.push(ptr.key().stream_id));
                assert!(walked.iter().eq(reference.keys()));
            }
            for _ in 0..3 {
                let id = StreamId::from(rng.gen_range(0..next + 8));
                let found = store.find_mut(&id).map(|ptr| ptr.key());
                assert_eq!(found.is_some(), reference.contains_key(&id), "{id:?}");
                if let Some(key) = found {
                    assert_eq!(store[key].id, id);
                }
            }
        }
        for key in live {
            let mut ptr = store.resolve(key);
            ptr.unlink();
            ptr.remove();
        }
    }
}

//! Session tickets with the listener's lifetime (`session_ticket_lifetime`): the keys that
//! seal them, rotated and erased, and the lifetime checked on every ticket presented.
//!
//! rustls's own ticketer (`rustls::crypto::ring::Ticketer`) has a fixed lifetime (a key
//! rotated every 6 hours, kept one rotation more), and the AEAD ticket producer it rotates is
//! private to rustls; its public `TicketRotator` keeps two keys and rotates at most once per
//! call, so after an idle spell it still opens a ticket of any age. So the tickets are sealed
//! here, in rustls's own format, with ring's ChaCha20-Poly1305 (ring is the provider rustls
//! runs on; nothing of the cipher is written here): a ticket is the key's random 16-byte name,
//! a random 12-byte nonce, then the sealed `issued || state` and the tag, with the key's name
//! as associated data. `issued` (8 bytes, milliseconds on this process's monotonic clock) is
//! sealed with rustls's session state so that a ticket older than the lifetime is refused
//! whatever the client claims and however long the listener was idle.
//!
//! Invariants: a key seals new tickets for at most [`ROTATION`] (or the lifetime, if shorter;
//! longer only while the system gives no random bytes for the next one); a key that no longer
//! seals is erased as soon as no ticket it sealed can still be accepted (at the first ticket
//! sealed or presented after that moment: the work is done by the calls, as in rustls's
//! rotator); a ticket is accepted only under a key still held and younger than the lifetime.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// The lifetime when none is configured: 12 hours, what rustls's own ticketer tells clients.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The shortest lifetime: a second (the lifetime a client is told is in whole seconds).
pub const MIN_LIFETIME: Duration = Duration::from_secs(1);

/// The longest lifetime: 7 days, the most TLS 1.3 allows (RFC 8446, section 4.6.1).
pub const MAX_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest a key seals new tickets: an hour, so that a key seals a bounded number of
/// tickets under random nonces and is erased within an hour and a lifetime.
pub const ROTATION: Duration = Duration::from_secs(3600);

/// The length of a key's name, at the start of each ticket.
const NAME_LEN: usize = 16;

/// The length of the issue time sealed before rustls's state.
const ISSUED_LEN: usize = 8;

/// A listener's ticket keys: shared by its TCP and QUIC sides, and kept by a reload that
/// leaves the tickets' settings alone (see [`crate::ServerTls::keep_ticket_keys`]).
pub struct TicketKeys {
    lifetime: Duration,
    rotation: Duration,
    /// The zero of the clock the issue times are read on.
    epoch: Instant,
    /// Oldest first; the last one seals.
    keys: RwLock<Vec<Key>>,
    /// The longest ticket sealed: a longer one is refused unopened (as rustls does, against
    /// partitioning oracles).
    longest: AtomicUsize,
    random: SystemRandom,
}

struct Key {
    name: [u8; NAME_LEN],
    key: LessSafeKey,
    /// When it started sealing (milliseconds since `epoch`).
    since: u64,
    /// The issue time of the last ticket it sealed (`since` before the first): once another
    /// key seals, it is erased a lifetime after this.
    last_sealed: AtomicU64,
}

/// No random bytes could be read to make a key.
#[derive(Debug, thiserror::Error)]
#[error("the system gave no random bytes for a session ticket key")]
pub struct NoRandom;

impl TicketKeys {
    /// Keys for tickets accepted for `lifetime` (clamped to [`MIN_LIFETIME`] and
    /// [`MAX_LIFETIME`]; the config refuses values outside), the first one made now.
    pub fn new(lifetime: Duration) -> Result<TicketKeys, NoRandom> {
        let lifetime = lifetime.clamp(MIN_LIFETIME, MAX_LIFETIME);
        let random = SystemRandom::new();
        let first = Key::new(&random, 0)?;
        Ok(TicketKeys {
            lifetime,
            rotation: lifetime.min(ROTATION),
            epoch: Instant::now(),
            keys: RwLock::new(vec![first]),
            longest: AtomicUsize::new(0),
            random,
        })
    }

    /// Makes `config` resume sessions by tickets accepted for `lifetime` (stateless, so a
    /// returning client skips the full handshake), under new keys, returned. `None`: no
    /// tickets; rustls's server-side cache (`session_storage`, 256 sessions) still resumes
    /// sessions, as HAProxy's and nginx's caches do under `no-tls-tickets` and
    /// `ssl_session_tickets off`.
    pub(crate) fn install(
        config: &mut rustls::ServerConfig,
        lifetime: Option<Duration>,
    ) -> Result<Option<Arc<TicketKeys>>, crate::LoadError> {
        let Some(lifetime) = lifetime else {
            return Ok(None);
        };
        let keys = TicketKeys::new(lifetime).map_err(|e| crate::LoadError {
            part: crate::Part::SessionTickets,
            file: std::path::PathBuf::new(),
            message: e.to_string(),
        })?;
        let keys = Arc::new(keys);
        config.ticketer = keys.clone();
        Ok(Some(keys))
    }

    /// How long a ticket is accepted.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Milliseconds since `epoch`.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lifetime_ms(&self) -> u64 {
        u64::try_from(self.lifetime.as_millis()).unwrap_or(u64::MAX)
    }

    /// The keys at `now`: a new sealing key if the last one's time is up, and none that can
    /// no longer open a live ticket.
    fn keys_at(&self, now: u64) -> Option<RwLockReadGuard<'_, Vec<Key>>> {
        let rotation = u64::try_from(self.rotation.as_millis()).unwrap_or(u64::MAX);
        let lifetime = self.lifetime_ms();
        let rotate = |keys: &[Key]| {
            keys.last()
                .is_none_or(|k| k.since.saturating_add(rotation) <= now)
        };
        let spent = |k: &Key| {
            k.last_sealed
                .load(Ordering::Relaxed)
                .saturating_add(lifetime)
                <= now
        };
        {
            let keys = self.keys.read().ok()?;
            // Keys are in the order they sealed, so the first is the one to erase first.
            let erase = keys.len() > 1 && keys.first().is_some_and(spent);
            if !rotate(&keys) && !erase {
                return Some(keys);
            }
        }
        // Made before the lock is taken: reading random bytes may take a while.
        let fresh = Key::new(&self.random, now).ok();
        {
            let mut keys = self.keys.write().ok()?;
            if let (true, Some(fresh)) = (rotate(&keys), fresh) {
                keys.push(fresh);
            }
            let sealing = keys.len().saturating_sub(1);
            let mut index = 0;
            keys.retain(|k| {
                index += 1;
                index > sealing || !spent(k)
            });
        }
        self.keys.read().ok()
    }

    /// `state` sealed at `now` into a ticket.
    fn seal(&self, now: u64, state: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys_at(now)?;
        let key = keys.last()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).ok()?;
        let tag_len = CHACHA20_POLY1305.tag_len();
        let mut ticket =
            Vec::with_capacity(NAME_LEN + NONCE_LEN + ISSUED_LEN + state.len() + tag_len);
        ticket.extend_from_slice(&key.name);
        ticket.extend_from_slice(&nonce);
        ticket.extend_from_slice(&now.to_be_bytes());
        ticket.extend_from_slice(state);
        let tag = key
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key.name),
                &mut ticket[NAME_LEN + NONCE_LEN..],
            )
            .ok()?;
        ticket.extend_from_slice(tag.as_ref());
        key.last_sealed.fetch_max(now, Ordering::Relaxed);
        self.longest.fetch_max(ticket.len(), Ordering::Relaxed);
        Some(ticket)
    }

    /// The state in `ticket`, if one of the keys held at `now` sealed it less than the
    /// lifetime ago.
    fn open(&self, now: u64, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() > self.longest.load(Ordering::Relaxed) {
            return None;
        }
        let (name, rest) = ticket.split_at_checked(NAME_LEN)?;
        let (nonce, sealed) = rest.split_at_checked(NONCE_LEN)?;
        let keys = self.keys_at(now)?;
        // Names are random and sent in the clear in every ticket: nothing secret is compared.
        let key = keys.iter().find(|k| k.name[..] == *name)?;
        let mut plain = sealed.to_vec();
        let opened = key
            .key
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(key.name),
                &mut plain,
            )
            .ok()?;
        let (issued, state) = opened.split_at_checked(ISSUED_LEN)?;
        let issued = u64::from_be_bytes(issued.try_into().ok()?);
        if now.saturating_sub(issued) >= self.lifetime_ms() {
            return None;
        }
        Some(state.to_vec())
    }
}

impl Key {
    fn new(random: &SystemRandom, now: u64) -> Result<Key, NoRandom> {
        let mut secret = [0u8; 32];
        random.fill(&mut secret).map_err(|_| NoRandom)?;
        let mut name = [0u8; NAME_LEN];
        random.fill(&mut name).map_err(|_| NoRandom)?;
        // ChaCha20-Poly1305 takes any 32 bytes as a key.
        let key = UnboundKey::new(&CHACHA20_POLY1305, &secret).map_err(|_| NoRandom)?;
        Ok(Key {
            name,
            key: LessSafeKey::new(key),
            since: now,
            last_sealed: AtomicU64::new(now),
        })
    }
}

impl ProducesTickets for TicketKeys {
    fn enabled(&self) -> bool {
        true
    }

    /// The lifetime told to clients, in whole seconds (the config takes whole seconds).
    fn lifetime(&self) -> u32 {
        u32::try_from(self.lifetime.as_secs()).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, state: &[u8]) -> Option<Vec<u8>> {
        self.seal(self.now(), state)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        self.open(self.now(), ticket)
    }
}

impl std::fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys stay out of logs.
        f.debug_struct("TicketKeys")
            .field("lifetime", &self.lifetime)
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn keys(lifetime: Duration) -> TicketKeys {
        TicketKeys::new(lifetime).expect("random bytes")
    }

    fn held(keys: &TicketKeys) -> usize {
        keys.keys.read().unwrap().len()
    }

    #[test]
    fn a_ticket_opens_within_its_lifetime_and_not_after() {
        let keys = keys(Duration::from_secs(10));
        let ticket = keys.seal(1_000, b"state").unwrap();
        assert_eq!(keys.open(1_000, &ticket).as_deref(), Some(&b"state"[..]));
        assert_eq!(keys.open(10_999, &ticket).as_deref(), Some(&b"state"[..]));
        assert_eq!(keys.open(11_000, &ticket), None, "ten seconds old");
    }

    #[test]
    fn an_idle_listener_refuses_an_old_ticket_and_erases_its_key() {
        // rustls's rotator rotates once per call: after an idle spell its previous key is the
        // one that sealed the old ticket, and it opens it. Here the key is gone.
        let keys = keys(Duration::from_secs(3600 * 12));
        let ticket = keys.seal(0, b"state").unwrap();
        assert_eq!(keys.open(48 * HOUR, &ticket), None);
        assert_eq!(held(&keys), 1, "only the new sealing key is held");
    }

    #[test]
    fn keys_rotate_hourly_and_old_tickets_open_until_their_lifetime() {
        let keys = keys(Duration::from_secs(3 * 3600));
        let first = keys.seal(0, b"first").unwrap();
        let later = keys.seal(HOUR + 1, b"later").unwrap();
        assert_ne!(
            first[..NAME_LEN],
            later[..NAME_LEN],
            "a new key after an hour"
        );
        assert_eq!(
            keys.open(3 * HOUR - 1, &first).as_deref(),
            Some(&b"first"[..])
        );
        let holds = |name: &[u8]| {
            keys.keys
                .read()
                .unwrap()
                .iter()
                .any(|k| k.name[..] == *name)
        };
        assert!(holds(&first[..NAME_LEN]));
        assert_eq!(keys.open(3 * HOUR, &first), None);
        assert!(
            !holds(&first[..NAME_LEN]),
            "the first key's last ticket expired: erased"
        );
        assert_eq!(keys.open(4 * HOUR, &later).as_deref(), Some(&b"later"[..]));
        // Three hours of lifetime, a key an hour: never more than four held.
        for hour in 5..30 {
            keys.seal(hour * HOUR, b"x").unwrap();
            assert!(held(&keys) <= 4, "{} keys", held(&keys));
        }
    }

    #[test]
    fn a_short_lifetime_rotates_at_the_lifetime() {
        let keys = keys(Duration::from_secs(2));
        let first = keys.seal(0, b"a").unwrap();
        assert_eq!(keys.open(1_999, &first).as_deref(), Some(&b"a"[..]));
        let second = keys.seal(2_000, b"b").unwrap();
        assert_ne!(first[..NAME_LEN], second[..NAME_LEN]);
        assert_eq!(keys.open(3_999, &second).as_deref(), Some(&b"b"[..]));
        assert_eq!(keys.open(4_000, &second), None);
    }

    #[test]
    fn a_forged_or_mangled_ticket_is_refused() {
        let keys = keys(Duration::from_secs(60));
        let ticket = keys.seal(0, b"state").unwrap();
        for cut in 0..ticket.len() {
            assert_eq!(keys.open(1, &ticket[..cut]), None, "cut at {cut}");
        }
        for at in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[at] ^= 1;
            assert_eq!(keys.open(1, &bad), None, "bit flipped at {at}");
        }
        let mut long = ticket.clone();
        long.push(0);
        assert_eq!(keys.open(1, &long), None, "longer than any sealed");
        let other = self::keys(Duration::from_secs(60));
        let theirs = other.seal(0, b"state").unwrap();
        assert_eq!(keys.open(1, &theirs), None, "another listener's key");
    }

    #[test]
    fn clients_are_told_the_lifetime_in_seconds() {
        assert_eq!(
            ProducesTickets::lifetime(&keys(Duration::from_secs(300))),
            300
        );
        assert_eq!(
            keys(Duration::from_secs(30 * 24 * 3600)).lifetime(),
            MAX_LIFETIME
        );
    }
}

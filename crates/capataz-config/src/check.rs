//! Foot-guns: settings that are valid but probably not what the operator wants.
//!
//! Validation rejects what cannot work; `check` points at what works badly, such as a health
//! check that flaps on one lost probe. Warnings never stop the balancer. The defaults raise none.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{CheckKind, Config, PoolConfig, PoolSource};

/// How long a dead backend may keep receiving traffic, judged by `fall x (interval +
/// timeout)` (each probe of a hung backend waits out its timeout, and the next starts one
/// interval after it), before a warning says so.
pub const DETECTION_BUDGET: Duration = Duration::from_secs(60);

/// How long a recovered backend may stay out of the pool, judged by `rise x interval`, before a
/// warning says so.
pub const RECOVERY_BUDGET: Duration = Duration::from_secs(300);

/// A certificate expiring within this long gets a warning: 30 days, the window in which
/// Let's Encrypt and most CAs expect a renewal.
pub const CERTIFICATE_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86_400);

/// A webhook attempt allowed this long or longer holds up every alert queued behind it.
const SLOW_WEBHOOK: Duration = Duration::from_secs(30);

/// One suspicious setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The configuration file (its `source`).
    pub file: String,
    /// The dotted key path, e.g. `pools.web.active.rise`.
    pub key: String,
    /// The 1-based line of the key, or of the nearest table around it that was written (a
    /// default raises warnings too); `None` for a config not read from text.
    pub line: Option<usize>,
    /// What is risky and what to do.
    pub message: String,
}

/// `file:line: key: message`, like a [`ConfigError`](super::ConfigError).
impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", super::parse::one_line(&self.file))?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}: {}", self.key, self.message)
    }
}

/// Returns a warning for each foot-gun in `config`: the admin listener, then the pools in
/// order, then the alert hooks, then TLS certificates that expire within
/// [`CERTIFICATE_EXPIRY_WARNING`] of now; none for the defaults.
pub fn check(config: &Config) -> Vec<Warning> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut warnings = check_settings(config);
    warnings.extend(expiring_certificates(config, now));
    warnings
}

/// The certificates of `config` that expire within [`CERTIFICATE_EXPIRY_WARNING`] of `now`
/// (Unix seconds), each with its line.
fn expiring_certificates(config: &Config, now: i64) -> Vec<Warning> {
    let window = CERTIFICATE_EXPIRY_WARNING.as_secs() as i64;
    let mut warnings = Vec::new();
    for (index, listener) in config.listeners.iter().enumerate() {
        let Some(tls) = &listener.tls else { continue };
        let Some(loaded) = &tls.loaded else { continue };
        for (i, certificate) in loaded.certificates().iter().enumerate() {
            let left = certificate.not_after.saturating_sub(now);
            if left >= window {
                continue;
            }
            warnings.push(Warning {
                file: config.source.clone(),
                key: format!("listeners[{index}].tls.certificates[{i}].cert"),
                line: tls.certificate_lines.get(i).copied().flatten(),
                message: format!(
                    "{}: the certificate expires on {}, in {} days (renew it; the warning \
                     starts {} days before)",
                    certificate.file.display(),
                    capataz_timefmt::rfc3339(
                        UNIX_EPOCH + Duration::from_secs(certificate.not_after.max(0) as u64)
                    ),
                    left.max(0) / 86_400,
                    window / 86_400,
                ),
            });
        }
    }
    warnings
}

/// The warnings about settings, which do not depend on the time.
fn check_settings(config: &Config) -> Vec<Warning> {
    let mut w = Warnings {
        config,
        list: Vec::new(),
    };
    check_admin(&mut w);
    check_listeners(&mut w);
    for pool in &config.pools {
        check_pool(&mut w, pool);
        if pool.active.kind != CheckKind::None {
            check_active(&mut w, pool);
        }
    }
    check_alerts(&mut w);
    w.list
}

/// The warnings found so far, each placed in `config`'s file by its key.
struct Warnings<'a> {
    config: &'a Config,
    list: Vec<Warning>,
}

impl Warnings<'_> {
    fn warn(&mut self, key: String, message: String) {
        self.list.push(Warning {
            file: self.config.source.clone(),
            line: self.config.lines.nearest(&key),
            key,
            message,
        });
    }
}

/// An admin API whose read-only opening opens everything.
fn check_admin(w: &mut Warnings<'_>) {
    if let Some(admin) = &w.config.admin {
        if admin.open_read_only && admin.token.is_none() {
            w.warn(
                "admin.open_read_only".into(),
                "open_read_only does nothing without a token: every endpoint, the ones that \
                 change backends included, is open to anyone who reaches the admin address \
                 (set admin.token)"
                    .into(),
            );
        }
    }
}

/// An http-01 challenge with no plaintext listener on port 80.
fn check_listeners(w: &mut Warnings<'_>) {
    let config = w.config;
    let port_80 = config
        .listeners
        .iter()
        .any(|l| l.tls.is_none() && l.address.port() == 80);
    for (index, listener) in config.listeners.iter().enumerate() {
        let http01 = listener
            .tls
            .as_ref()
            .and_then(|tls| tls.settings.acme.as_ref())
            .is_some_and(|acme| acme.challenge == capataz_tls::acme::Challenge::Http01);
        if http01 && !port_80 {
            w.warn(
                format!("listeners[{index}].tls.acme.challenge"),
                "http-01 is validated on port 80 and no plaintext listener is on port 80: the \
                 validation fails unless port 80 reaches one of them (by a port forward) or the \
                 CA is a test server told another port"
                    .into(),
            );
        }
    }
}

/// A pool's backend TLS, etcd credentials, `min_healthy`, and no health checking at all.
fn check_pool(w: &mut Warnings<'_>, pool: &PoolConfig) {
    let at = format!("pools.{}", pool.name);
    if pool.tls.as_ref().is_some_and(|tls| !tls.verify) {
        w.warn(
            format!("{at}.tls.verify"),
            "verify = false accepts any certificate: traffic to the backends is encrypted, \
             but to whoever answers, a man in the middle included (give the backends' CA \
             as ca_file, and server_name if their certificates name another host)"
                .into(),
        );
    }
    if let PoolSource::Etcd(etcd) = &pool.source {
        let clear = etcd.endpoints.iter().find(|e| {
            e.access.auth.is_some()
                && e.access.tls.is_none()
                && !e
                    .host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
                && e.host != "localhost"
        });
        if let Some(endpoint) = clear {
            w.warn(
                format!("{at}.source.username"),
                format!(
                    "{}: the etcd password and token travel in clear text over http:// \
                     (use https:// endpoints with the source's tls settings)",
                    endpoint.url
                ),
            );
        }
    }
    let primaries = pool.backends.iter().filter(|b| !b.backup).count();
    // A pool whose backends come from a source has none in the file to count.
    if !pool.source.is_dynamic()
        && usize::try_from(pool.min_healthy.count).is_ok_and(|n| n > primaries)
    {
        w.warn(
            format!("{at}.min_healthy"),
            format!(
                "min_healthy = {} is above the pool's {primaries} primaries, so it counts \
                 as {primaries}: the pool fails open as soon as any primary is out (lower \
                 it, or add primaries)",
                pool.min_healthy.count
            ),
        );
    }
    if pool.active.kind == CheckKind::None && !pool.passive.enabled {
        w.warn(
            at,
            "no health checking at all: active.kind is \"none\" and passive checks are \
             disabled, so a dead backend keeps receiving traffic (enable one of them)"
                .into(),
        );
    }
}

/// A pool's active checks: streak lengths, the timeout beside the interval, an `expect` a TCP
/// probe ignores, how long detection and recovery take, and probes in lockstep.
fn check_active(w: &mut Warnings<'_>, pool: &PoolConfig) {
    let at = format!("pools.{}", pool.name);
    let active = &pool.active;
    if active.rise.get() == 1 {
        w.warn(
            format!("{at}.active.rise"),
            "rise = 1 brings a backend back on one lucky probe, so a flapping backend keeps \
             flapping in and out of the pool (use 2 or more)"
                .into(),
        );
    }
    if active.fall.get() == 1 {
        w.warn(
            format!("{at}.active.fall"),
            "fall = 1 takes a healthy backend out on one lost probe, so the pool flaps \
             (use 2 or more)"
                .into(),
        );
    }
    if active.timeout >= active.interval {
        w.warn(
            format!("{at}.active.timeout"),
            format!(
                "the probe timeout ({:?}) is not shorter than the interval ({:?}), so a \
                 hung backend stretches every probe cycle (make the timeout shorter)",
                active.timeout, active.interval
            ),
        );
    }
    let expect_key = format!("{at}.active.expect");
    if active.kind == CheckKind::Tcp && w.config.lines.written(&expect_key) {
        w.warn(
            expect_key,
            "expect does nothing with kind = \"tcp\": a TCP probe passes when the connection \
             opens and reads no status (remove expect, or use kind = \"http\" to check a \
             status)"
                .into(),
        );
    }
    let detection = active
        .interval
        .saturating_add(active.timeout)
        .saturating_mul(active.fall.get());
    if detection > DETECTION_BUDGET {
        w.warn(
            format!("{at}.active.fall"),
            format!(
                "fall {} x (interval {:?} + timeout {:?}) = {:?}: a dead or hung backend keeps \
                 receiving traffic that long before probes take it out (keep it within {:?}: \
                 lower fall, interval or timeout)",
                active.fall, active.interval, active.timeout, detection, DETECTION_BUDGET
            ),
        );
    }
    let recovery = active.interval.saturating_mul(active.rise.get());
    if recovery > RECOVERY_BUDGET {
        w.warn(
            format!("{at}.active.rise"),
            format!(
                "rise {} x interval {:?} = {:?}: a backend that recovered stays out of the \
                 pool that long (keep it within {:?}: lower rise or interval)",
                active.rise, active.interval, recovery, RECOVERY_BUDGET
            ),
        );
    }
    if active.jitter == 0.0 {
        w.warn(
            format!("{at}.active.jitter"),
            "jitter 0 sends the probes of all backends in lockstep, in bursts \
             (use e.g. \"10%\")"
                .into(),
        );
    }
}

/// A webhook timeout long enough to hold the alerts queued behind it.
fn check_alerts(w: &mut Warnings<'_>) {
    for (index, webhook) in w.config.alerts.webhooks.iter().enumerate() {
        if webhook.timeout >= SLOW_WEBHOOK {
            w.warn(
                format!("alerts.webhooks[{index}].timeout"),
                format!(
                    "a timeout of {:?} lets one hung endpoint hold every alert queued behind it \
                     that long per attempt, so alerts arrive late or are dropped when the queue \
                     fills (keep it under {:?}; the default is 2s)",
                    webhook.timeout, SLOW_WEBHOOK
                ),
            );
        }
    }
}

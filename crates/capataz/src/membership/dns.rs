//! The `dns` source: A/AAAA records with a configured port, or SRV records, through
//! `hickory-resolver` on the tokio runtime (never a blocking call on a runtime thread).
//!
//! Every query goes to the server (the resolver's cache is off): the source itself waits out
//! the TTL. An answer with no records (NODATA) is an empty membership, which the guard holds
//! as a drop; NXDOMAIN, SERVFAIL, REFUSED, timeouts and unreachable servers are failures, and
//! the last membership stays.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::{ResolveError, TokioResolver};

use super::{Answer, MAX_MEMBERS};
use crate::config::{BackendConfig, DnsRecord, DnsSource};

/// The resolver of one pool's DNS source.
pub struct DnsResolver {
    config: DnsSource,
    resolver: TokioResolver,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What one lookup found: records, none (NODATA), or a failure.
enum Found<T> {
    Records(Vec<T>, u32),
    NoData,
    Failed(String),
}

impl DnsResolver {
    /// A resolver for `config`: its `resolver` address, else the nameservers of
    /// /etc/resolv.conf (read here: call it off the runtime threads).
    pub fn new(config: &DnsSource) -> Result<DnsResolver, String> {
        let (servers, mut options) = match config.resolver {
            Some(address) => (
                ResolverConfig::from_parts(
                    None,
                    Vec::new(),
                    NameServerConfigGroup::from_ips_clear(&[address.ip()], address.port(), true),
                ),
                ResolverOpts::default(),
            ),
            None => hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?,
        };
        options.timeout = config.timeout;
        options.attempts = 1;
        options.cache_size = 0;
        options.use_hosts_file = ResolveHosts::Never;
        options.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        let mut builder =
            TokioResolver::builder_with_config(servers, TokioConnectionProvider::default());
        *builder.options_mut() = options;
        Ok(DnsResolver {
            config: config.clone(),
            resolver: builder.build(),
        })
    }

    /// How long to wait after an answer whose smallest TTL was `ttl` (`None`: a failure, or
    /// no TTL): within the configured floor and ceiling; the floor when there is none.
    pub fn wait_for(&self, ttl: Option<u32>) -> Duration {
        let ttl = ttl.map_or(self.config.ttl_min, |t| Duration::from_secs(u64::from(t)));
        ttl.clamp(self.config.ttl_min, self.config.ttl_max)
    }

    /// Asks for the membership now: the answer and its smallest TTL.
    pub async fn query(&self) -> (Answer, Option<u32>) {
        self.resolver.clear_cache();
        match self.config.record {
            DnsRecord::Address { port } => match self.addresses(&self.config.name).await {
                Found::Failed(error) => (Answer::Failed(error), None),
                Found::NoData => (Answer::Members(Vec::new()), None),
                Found::Records(ips, ttl) => {
                    let members = ips
                        .into_iter()
                        .map(|ip| {
                            let address = SocketAddr::new(ip, port);
                            member(address.to_string(), address, 1, false)
                        })
                        .collect();
                    (Answer::Members(finish(members)), Some(ttl))
                }
            },
            DnsRecord::Srv => self.srv().await,
        }
    }

    /// The A and AAAA records of `name`, sorted and unique.
    async fn addresses(&self, name: &str) -> Found<IpAddr> {
        match self.resolver.lookup_ip(name).await {
            Ok(found) => {
                let ttl = min_ttl(found.as_lookup());
                let mut ips: Vec<IpAddr> = found.iter().collect();
                ips.sort_unstable();
                ips.dedup();
                if ips.is_empty() {
                    Found::NoData
                } else {
                    Found::Records(ips, ttl)
                }
            }
            Err(error) => classify(&error),
        }
    }

    /// The SRV records: one backend per target and port, at the target's first address; the
    /// lowest priority is the primaries, the others backups; weights within 1-1000.
    async fn srv(&self) -> (Answer, Option<u32>) {
        let found = match self.resolver.srv_lookup(self.config.name.as_str()).await {
            Ok(found) => found,
            Err(error) => {
                return match classify::<()>(&error) {
                    Found::NoData => (Answer::Members(Vec::new()), None),
                    Found::Failed(error) => (Answer::Failed(error), None),
                    // classify never finds records; said as a failure rather than a panic.
                    Found::Records(..) => (Answer::Failed(error.to_string()), None),
                };
            }
        };
        let mut ttl = min_ttl(found.as_lookup());
        // By name, first (lowest priority) record wins: a target:port is one backend.
        let mut records: Vec<_> = found.iter().take(MAX_MEMBERS).collect();
        records.sort_by_key(|s| s.priority());
        let mut by_name: BTreeMap<String, (String, u16, u16, u16)> = BTreeMap::new();
        for srv in records {
            let target = srv.target().to_ascii();
            let host = target.trim_end_matches('.').to_owned();
            let name = format!("{host}:{}", srv.port());
            by_name
                .entry(name)
                .or_insert((target, srv.port(), srv.weight(), srv.priority()));
        }
        let mut resolved = Vec::with_capacity(by_name.len());
        for (name, (target, port, weight, priority)) in by_name {
            match self.addresses(&target).await {
                Found::Records(ips, target_ttl) => {
                    ttl = ttl.min(target_ttl);
                    let address = SocketAddr::new(ips[0], port);
                    let weight = u32::from(weight).clamp(1, 1000);
                    resolved.push((member(name, address, weight, false), priority));
                }
                // A target without addresses is no backend; the others still are.
                Found::NoData => {}
                Found::Failed(error) => {
                    return (
                        Answer::Failed(format!("resolving SRV target {target}: {error}")),
                        None,
                    )
                }
            }
        }
        // The lowest priority with an address serves; the others stand by as backups.
        let lowest = resolved.iter().map(|(_, p)| *p).min().unwrap_or(0);
        let members = resolved
            .into_iter()
            .map(|(mut m, priority)| {
                m.backup = priority != lowest;
                m
            })
            .collect();
        (Answer::Members(finish(members)), Some(ttl))
    }
}

fn member(name: String, address: SocketAddr, weight: u32, backup: bool) -> BackendConfig {
    BackendConfig {
        name,
        address: address.to_string(),
        socket_addr: address,
        weight,
        backup,
        agent_port: None,
        track: None,
    }
}

/// Sorted by name, at most [`MAX_MEMBERS`].
fn finish(mut members: Vec<BackendConfig>) -> Vec<BackendConfig> {
    members.sort_by(|a, b| a.name.cmp(&b.name));
    if members.len() > MAX_MEMBERS {
        tracing::warn!(
            answered = members.len(),
            kept = MAX_MEMBERS,
            "a DNS answer has more backends than a pool takes; the rest are ignored"
        );
        members.truncate(MAX_MEMBERS);
    }
    members
}

/// NODATA (the name exists, no such records) apart from every other failure.
fn classify<T>(error: &ResolveError) -> Found<T> {
    if let Some(proto) = error.proto() {
        if let ProtoErrorKind::NoRecordsFound { response_code, .. } = proto.kind() {
            return match *response_code {
                ResponseCode::NoError => Found::NoData,
                code => Found::Failed(format!("the server answered {code}")),
            };
        }
    }
    Found::Failed(error.to_string())
}

/// The smallest TTL among an answer's records (0 for none).
fn min_ttl(lookup: &hickory_resolver::lookup::Lookup) -> u32 {
    lookup.records().iter().map(|r| r.ttl()).min().unwrap_or(0)
}

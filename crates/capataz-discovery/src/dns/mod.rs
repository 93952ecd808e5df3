//! The `dns` source: A/AAAA records with a configured port, or SRV records, through
//! `hickory-resolver` on the tokio runtime (never a blocking call on a runtime thread).
//!
//! Every query goes to the server (the resolver's cache is off): the source itself waits out
//! the TTL. A and AAAA are asked apart and judged apart ([`lookup`]): an answer with no
//! records (NODATA) is an empty membership, which the guard holds as a drop; NXDOMAIN on the
//! name, SERVFAIL, REFUSED, timeouts, malformed answers and unreachable servers, on either
//! type, are failures, and the last membership stays. An SRV target's trouble is that
//! target's alone ([`srv`]): it is left out, or kept at its last address while its lookup
//! fails, and the other targets are the membership.

mod lookup;
mod srv;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use tokio::task::JoinSet;

use super::{Answer, MAX_MEMBERS};
use capataz_config::{BackendConfig, DnsRecord, DnsSource};
use capataz_events::Unresolved;
use lookup::Found;

/// How many SRV targets are looked up at once (each an A and an AAAA query): a set of slow
/// targets costs a few timeouts, not one per target.
const PARALLEL_TARGETS: usize = 32;

/// The resolver of one pool's DNS source, and what it remembers of its last SRV answer.
pub struct DnsResolver {
    config: DnsSource,
    resolver: TokioResolver,
    /// The last answer's backends (SRV), by name: where a target whose lookup fails stays.
    known: HashMap<String, SocketAddr>,
    /// The last answer's targets without an address (SRV), sorted.
    unresolved: Vec<Unresolved>,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("config", &self.config)
            .field("unresolved", &self.unresolved)
            .finish_non_exhaustive()
    }
}

/// Why a DNS source cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DnsSetupError {
    /// /etc/resolv.conf cannot be read (hickory's error).
    #[error("cannot read the system's resolver configuration: {0}")]
    SystemConf(#[source] hickory_resolver::net::NetError),
    /// The resolver refused its settings (hickory's error).
    #[error("cannot set up the DNS resolver: {0}")]
    Resolver(#[source] hickory_resolver::net::NetError),
}

impl DnsResolver {
    /// A resolver for `config`: its `resolver` address, else the nameservers of
    /// /etc/resolv.conf (read here: call it off the runtime threads).
    pub fn new(config: &DnsSource) -> Result<DnsResolver, DnsSetupError> {
        let (servers, mut options) = match config.resolver {
            Some(address) => (
                ResolverConfig::from_name_servers(vec![name_server(address)]),
                ResolverOpts::default(),
            ),
            None => hickory_resolver::system_conf::read_system_conf()
                .map_err(DnsSetupError::SystemConf)?,
        };
        options.timeout = config.timeout;
        options.attempts = 1;
        options.cache_size = 0;
        options.use_hosts_file = ResolveHosts::Never;
        let mut builder =
            TokioResolver::builder_with_config(servers, TokioRuntimeProvider::default());
        *builder.options_mut() = options;
        Ok(DnsResolver {
            config: config.clone(),
            resolver: builder.build().map_err(DnsSetupError::Resolver)?,
            known: HashMap::new(),
            unresolved: Vec::new(),
        })
    }

    /// Picks up where a previous source of the same pool left off (a reload): `members` in
    /// force are where failing targets stay, `unresolved` what was told about the targets.
    pub fn resume(&mut self, members: &[BackendConfig], unresolved: Vec<Unresolved>) {
        self.known = known(members);
        self.unresolved = unresolved;
    }

    /// How long to wait after an answer whose smallest TTL was `ttl` (`None`: a failure, or
    /// no TTL): within the configured floor and ceiling; the floor when there is none.
    pub fn wait_for(&self, ttl: Option<u32>) -> Duration {
        let ttl = ttl.map_or(self.config.ttl_min, |t| Duration::from_secs(u64::from(t)));
        ttl.clamp(self.config.ttl_min, self.config.ttl_max)
    }

    /// Asks for the membership now: the answers to tell, in order (for SRV, the targets'
    /// standing, then the membership), and the smallest TTL.
    pub async fn query(&mut self) -> (Vec<Answer>, Option<u32>) {
        self.resolver.clear_cache();
        match self.config.record {
            DnsRecord::Address { port } => {
                let (answer, ttl) = match addresses(&self.resolver, &self.config.name).await {
                    Found::Failed(error) => (Answer::Failed(error), None),
                    Found::NxDomain => (Answer::Failed(nxdomain()), None),
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
                };
                (vec![answer], ttl)
            }
            DnsRecord::Srv => self.srv().await,
        }
    }

    /// The SRV records: one backend per target and port, at the target's first address; the
    /// lowest priority is the primaries, the others backups; weights within 1-1000.
    async fn srv(&mut self) -> (Vec<Answer>, Option<u32>) {
        let name = self.config.name.as_str();
        let found = lookup::classify(
            self.resolver.lookup(name, RecordType::SRV).await,
            |r| match r {
                RData::SRV(srv) => Some(srv.clone()),
                _ => None,
            },
        );
        let (records, srv_ttl) = match found {
            Found::Records(mut records, ttl) => {
                records.truncate(MAX_MEMBERS);
                (records, Some(ttl))
            }
            // No SRV record: no target, an empty membership.
            Found::NoData => (Vec::new(), None),
            Found::NxDomain => return (vec![Answer::Failed(nxdomain())], None),
            Found::Failed(error) => return (vec![Answer::Failed(error)], None),
        };
        let targets = srv::targets(&records);
        let mut hosts: Vec<String> = targets.iter().map(|t| t.host.clone()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let found = self.resolve(hosts).await;
        let placed = srv::place(targets, &found, &self.known);
        let changes = srv::changes(&self.unresolved, &placed.unresolved, &placed.members);
        self.known = known(&placed.members);
        self.unresolved.clone_from(&placed.unresolved);
        let ttl = match (srv_ttl, placed.ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let answers = vec![
            Answer::Targets {
                unresolved: placed.unresolved,
                changes,
            },
            Answer::Members(placed.members),
        ];
        (answers, ttl)
    }

    /// The addresses of `hosts`, looked up [`PARALLEL_TARGETS`] at a time. A lookup that
    /// ended without a result (its task panicked) leaves its host out: a failure for
    /// [`srv::place`].
    async fn resolve(&self, hosts: Vec<String>) -> BTreeMap<String, Found<IpAddr>> {
        let mut found = BTreeMap::new();
        let mut hosts = hosts.into_iter();
        let mut running = JoinSet::new();
        loop {
            while running.len() < PARALLEL_TARGETS {
                let Some(host) = hosts.next() else { break };
                let resolver = self.resolver.clone();
                running.spawn(async move {
                    let addresses = addresses(&resolver, &host).await;
                    (host, addresses)
                });
            }
            match running.join_next().await {
                Some(Ok((host, addresses))) => {
                    found.insert(host, addresses);
                }
                Some(Err(_)) => {}
                None => return found,
            }
        }
    }
}

/// The A and AAAA records of `name`, asked at once, judged apart ([`lookup::addresses`]).
async fn addresses(resolver: &TokioResolver, name: &str) -> Found<IpAddr> {
    let (a, aaaa) = tokio::join!(
        resolver.lookup(name, RecordType::A),
        resolver.lookup(name, RecordType::AAAA)
    );
    lookup::addresses(
        lookup::classify(a, RData::ip_addr),
        lookup::classify(aaaa, RData::ip_addr),
    )
}

/// The one name server at `address`, over UDP and TCP (for truncated answers) on its port.
fn name_server(address: SocketAddr) -> NameServerConfig {
    let mut server = NameServerConfig::udp_and_tcp(address.ip());
    for connection in &mut server.connections {
        connection.port = address.port();
    }
    server
}

/// NXDOMAIN on the source's own name: a failure, the membership stays (a name that vanished
/// is more often a mistake than a pool's end).
fn nxdomain() -> String {
    "the server answered NXDOMAIN (the name does not exist)".to_owned()
}

fn known(members: &[BackendConfig]) -> HashMap<String, SocketAddr> {
    members
        .iter()
        .map(|m| (m.name.clone(), m.socket_addr))
        .collect()
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
        limit: None,
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

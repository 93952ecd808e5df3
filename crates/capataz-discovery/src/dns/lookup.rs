//! One DNS lookup's result, classified once ([`classify`]), and a name's A and AAAA lookups
//! taken together ([`addresses`]).
//!
//! Invariant: only an answer that says there is nothing (NOERROR with no record of the type
//! asked, NODATA; or NXDOMAIN) reads as "none". Every other outcome, on any record type asked,
//! is a failure: a timeout (also what a malformed answer becomes: the resolver drops what it
//! cannot read and waits on), SERVFAIL, REFUSED, a referral, a truncated answer that TCP could
//! not complete. hickory's `lookup_ip` merges A and AAAA and turns a failure of one into the
//! other's answer, an empty one included: the two are asked and judged apart here.

use std::net::IpAddr;

use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::{DnsError, NetError, NoRecords};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RData;

/// What one lookup (or a name's A and AAAA lookups together) found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Found<T> {
    /// The records, never empty, and their smallest TTL.
    Records(Vec<T>, u32),
    /// The name exists without a record of the type asked (NODATA).
    NoData,
    /// The name does not exist (NXDOMAIN).
    NxDomain,
    /// The lookup failed: why.
    Failed(String),
}

/// Classifies a lookup's `result`, `pick` taking out the records of the type asked.
pub(super) fn classify<T>(
    result: Result<Lookup, NetError>,
    pick: impl Fn(&RData) -> Option<T>,
) -> Found<T> {
    let error = match result {
        Ok(lookup) => {
            let mut ttl = u32::MAX;
            let records: Vec<T> = lookup
                .answers()
                .iter()
                .filter_map(|r| {
                    let found = pick(&r.data)?;
                    ttl = ttl.min(r.ttl);
                    Some(found)
                })
                .collect();
            return if records.is_empty() {
                // An answer whose records are all of another type (a CNAME left unresolved).
                Found::Failed("the answer holds no record of the type asked".to_owned())
            } else {
                Found::Records(records, ttl)
            };
        }
        Err(error) => error,
    };
    match error {
        NetError::Dns(DnsError::NoRecordsFound(NoRecords {
            response_code,
            soa,
            ns,
            ..
        })) => {
            // Name servers without the zone's SOA: a referral to another server, no answer.
            let referral = soa.is_none() && ns.is_some();
            match response_code {
                _ if referral => Found::Failed("the server answered with a referral".to_owned()),
                ResponseCode::NoError => Found::NoData,
                ResponseCode::NXDomain => Found::NxDomain,
                code => Found::Failed(format!("the server answered {}", code_name(code))),
            }
        }
        NetError::Dns(DnsError::ResponseCode(code)) => {
            Found::Failed(format!("the server answered {}", code_name(code)))
        }
        // Said without hickory's "protocol error: " in front.
        NetError::Proto(proto) => Found::Failed(proto.to_string()),
        error => Found::Failed(error.to_string()),
    }
}

/// A name's addresses from its A and AAAA lookups: a failure of either is the name's failure
/// (said with its record type), NXDOMAIN on either is NXDOMAIN; else the addresses of both,
/// sorted and unique, or NODATA when neither has one.
pub(super) fn addresses(a: Found<IpAddr>, aaaa: Found<IpAddr>) -> Found<IpAddr> {
    match (a, aaaa) {
        (Found::Failed(a), Found::Failed(aaaa)) => Found::Failed(format!("A: {a}; AAAA: {aaaa}")),
        (Found::Failed(a), _) => Found::Failed(format!("A: {a}")),
        (_, Found::Failed(aaaa)) => Found::Failed(format!("AAAA: {aaaa}")),
        (Found::NxDomain, _) | (_, Found::NxDomain) => Found::NxDomain,
        (Found::NoData, Found::NoData) => Found::NoData,
        (Found::Records(ips, ttl), Found::NoData) | (Found::NoData, Found::Records(ips, ttl)) => {
            sorted(ips, ttl)
        }
        (Found::Records(mut v4, ttl4), Found::Records(v6, ttl6)) => {
            v4.extend(v6);
            sorted(v4, ttl4.min(ttl6))
        }
    }
}

fn sorted(mut ips: Vec<IpAddr>, ttl: u32) -> Found<IpAddr> {
    ips.sort_unstable();
    ips.dedup();
    Found::Records(ips, ttl)
}

/// A response code as DNS operators write it.
pub(super) fn code_name(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "NOERROR".to_owned(),
        ResponseCode::FormErr => "FORMERR".to_owned(),
        ResponseCode::ServFail => "SERVFAIL".to_owned(),
        ResponseCode::NXDomain => "NXDOMAIN".to_owned(),
        ResponseCode::NotImp => "NOTIMP".to_owned(),
        ResponseCode::Refused => "REFUSED".to_owned(),
        code => format!("response code {}", u16::from(code)),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use hickory_resolver::proto::op::Query;
    use hickory_resolver::proto::rr::rdata::{A, SOA};
    use hickory_resolver::proto::rr::{Name, Record, RecordType};

    use super::*;

    fn name() -> Name {
        Name::from_ascii("web.test.").expect("a name")
    }

    fn a(ip: [u8; 4], ttl: u32) -> Record {
        Record::from_rdata(name(), ttl, RData::A(A(Ipv4Addr::from(ip))))
    }

    fn ok(records: Vec<Record>) -> Result<Lookup, NetError> {
        let query = Query::query(name(), RecordType::A);
        Ok(Lookup::new_with_max_ttl(query, records))
    }

    /// The error hickory makes of an answer without records: `code`, with the zone's SOA or a
    /// referral's name servers.
    fn none(code: ResponseCode, with_soa: bool, referral: bool) -> Result<Lookup, NetError> {
        let soa = with_soa.then(|| {
            let zone = Name::from_ascii("test.").expect("a name");
            let soa = SOA::new(zone.clone(), zone.clone(), 1, 60, 60, 600, 1);
            Box::new(Record::from_rdata(zone, 1, soa))
        });
        let ns = referral.then(|| Arc::from(Vec::new()));
        let mut none = NoRecords::new(Query::query(name(), RecordType::A), code);
        none.soa = soa;
        none.ns = ns;
        Err(NetError::Dns(DnsError::NoRecordsFound(none)))
    }

    fn ip(r: &RData) -> Option<IpAddr> {
        r.ip_addr()
    }

    #[test]
    fn only_nodata_and_nxdomain_read_as_none_every_other_outcome_is_a_failure() {
        let v4 = |d: [u8; 4]| IpAddr::from(d);
        assert_eq!(
            classify(ok(vec![a([10, 0, 0, 2], 30), a([10, 0, 0, 1], 5)]), ip),
            Found::Records(vec![v4([10, 0, 0, 2]), v4([10, 0, 0, 1])], 5)
        );
        assert_eq!(
            classify(none(ResponseCode::NoError, true, false), ip),
            Found::NoData
        );
        // Without the SOA (as some embedded servers answer), still no record.
        assert_eq!(
            classify(none(ResponseCode::NoError, false, false), ip),
            Found::NoData
        );
        assert_eq!(
            classify(none(ResponseCode::NXDomain, true, false), ip),
            Found::NxDomain
        );
        assert_eq!(
            classify(none(ResponseCode::NoError, false, true), ip),
            Found::Failed("the server answered with a referral".into())
        );
        assert_eq!(
            classify(none(ResponseCode::ServFail, false, false), ip),
            Found::Failed("the server answered SERVFAIL".into())
        );
        assert_eq!(
            classify(
                Err(NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused))),
                ip
            ),
            Found::Failed("the server answered REFUSED".into())
        );
        assert_eq!(
            classify(Err(NetError::Timeout), ip),
            Found::Failed("request timed out".into())
        );
        // Records, none of them an address.
        let txt = Record::from_rdata(
            name(),
            5,
            RData::TXT(hickory_resolver::proto::rr::rdata::TXT::new(vec![
                "x".into()
            ])),
        );
        assert!(matches!(classify(ok(vec![txt]), ip), Found::Failed(_)));
    }

    #[test]
    fn a_failure_of_a_or_aaaa_is_the_names_failure_never_its_other_half() {
        let one = || Found::Records(vec![IpAddr::from([10, 0, 0, 1])], 5);
        let failed = || Found::Failed("request timed out".to_owned());
        assert_eq!(
            addresses(failed(), Found::NoData),
            Found::Failed("A: request timed out".into())
        );
        assert_eq!(
            addresses(one(), failed()),
            Found::Failed("AAAA: request timed out".into())
        );
        assert_eq!(
            addresses(failed(), failed()),
            Found::Failed("A: request timed out; AAAA: request timed out".into())
        );
        assert_eq!(addresses(Found::NoData, Found::NoData), Found::NoData);
        assert_eq!(addresses(Found::NxDomain, Found::NxDomain), Found::NxDomain);
        assert_eq!(addresses(one(), Found::NoData), one());
        let v6 = IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1u16]);
        assert_eq!(
            addresses(
                Found::Records(
                    vec![IpAddr::from([10, 0, 0, 2]), IpAddr::from([10, 0, 0, 1])],
                    9
                ),
                Found::Records(vec![v6], 3)
            ),
            Found::Records(
                vec![IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]), v6],
                3
            )
        );
    }
}

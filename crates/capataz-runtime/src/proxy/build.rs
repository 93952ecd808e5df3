//! Building a listener's [`Proxy`] from its config: its routes resolved to their pools (or
//! redirects), their labels, metrics and rate limits (kept from the proxy a reload replaces
//! where unchanged), and the listener's settings the request path reads.

use std::sync::Arc;

use super::tally::PoolNames;
use super::Proxy;
use super::{error_pages, rate_limit};
use crate::access_log::AccessLog;
use crate::acme::Http01Tokens;
use crate::balance::PoolHandle;
use crate::config::{HeaderRules, ListenerConfig, RouteTarget, Variable};
use crate::instruments::{ListenerMetrics, RouteMetrics};

/// One route, resolved to its pool.
#[derive(Debug)]
pub(super) struct Route {
    /// Its label (metrics and access log): its host and path prefix.
    pub(super) label: String,
    pub(super) host: Option<String>,
    pub(super) path_prefix: String,
    /// Its other matchers (`matchers.rs`); `None`, and not looked at, when it has none.
    pub(super) matches: Option<Box<crate::config::RouteMatch>>,
    /// Its header rules (`rules.rs`), run after the listener's.
    pub(super) request_headers: Option<Box<HeaderRules>>,
    pub(super) response_headers: Option<Box<HeaderRules>>,
    /// Its path rewrite (`rewrite.rs`), if any.
    pub(super) rewrite: Option<Box<crate::config::PathRewrite>>,
    /// Its pool, or the redirect capataz answers with.
    pub(super) target: Target,
    /// Its requests' counters.
    pub(super) metrics: RouteMetrics,
    /// Its local rate limit, if it has one (shared with the proxy a reload replaces, when
    /// the route and its limit are unchanged).
    pub(super) limit: Option<Arc<rate_limit::RouteLimit>>,
}

/// What serves a route.
#[derive(Debug)]
pub(super) enum Target {
    Pool(Arc<PoolHandle>),
    Redirect(Box<crate::config::Redirect>),
}

impl Proxy {
    /// The handler of `listener`, whose routes' `pool` indexes refer to `pools` (the pools'
    /// request-path handles: the proxy never sees the health runtime), counting into
    /// `metrics`, the listener's, answering the pending HTTP-01 tokens of `http01` if given.
    /// A route whose rate limit `previous` (the proxy this one replaces) had for the same
    /// route keeps its buckets.
    pub(crate) fn new(
        listener: &ListenerConfig,
        pools: &[Arc<PoolHandle>],
        metrics: Arc<ListenerMetrics>,
        (access_log, http01): (Option<Arc<AccessLog>>, Option<Arc<Http01Tokens>>),
        previous: Option<&Proxy>,
    ) -> Proxy {
        let routes = &listener.routes;
        let access_log = access_log.map(|log| {
            let names = routes
                .iter()
                .map(|r| match &r.target {
                    RouteTarget::Pool(index) => (
                        route_label(r),
                        Some(pools[*index].name.clone()),
                        pools[*index]
                            .backends
                            .iter()
                            .map(|b| b.name.clone())
                            .collect(),
                    ),
                    RouteTarget::Redirect(_) => (route_label(r), None, Vec::new()),
                })
                .collect();
            (log, Arc::new(PoolNames { routes: names }))
        });
        Proxy {
            routes: routes
                .iter()
                .map(|r| {
                    let target = match &r.target {
                        RouteTarget::Pool(index) => Target::Pool(pools[*index].clone()),
                        RouteTarget::Redirect(redirect) => Target::Redirect(redirect.clone()),
                    };
                    let pool_name = match &target {
                        Target::Pool(pool) => &*pool.name,
                        Target::Redirect(_) => "",
                    };
                    let label = route_label(r);
                    Route {
                        host: r.host.clone(),
                        path_prefix: r.path_prefix.clone(),
                        matches: r.matches.clone(),
                        request_headers: r.request_headers.clone(),
                        response_headers: r.response_headers.clone(),
                        rewrite: r.rewrite.clone(),
                        metrics: metrics.route(&label, pool_name),
                        limit: r.rate_limit.as_ref().map(|limit| {
                            rate_limit::RouteLimit::kept_or_new(
                                previous.map(|p| p.routes.iter().map(|r| (&r.label, &r.limit))),
                                &label,
                                limit,
                                || metrics.rate_limited(&label),
                            )
                        }),
                        label,
                        target,
                    }
                })
                .collect(),
            any_host: routes.iter().any(|r| r.host.is_some()),
            max_header_bytes: listener.max_header_bytes,
            forwarded: listener.forwarded,
            request_id: listener.request_id.clone(),
            request_headers: listener.request_headers.clone(),
            response_headers: listener.response_headers.clone(),
            rewrites: listener.request_id.is_some()
                || listener.forwarded.rfc7239()
                || listener.request_headers.is_some()
                || listener.response_headers.is_some()
                || routes
                    .iter()
                    .any(|r| r.request_headers.is_some() || r.response_headers.is_some()),
            rules_need_host: listener.forwarded.rfc7239()
                || [&listener.request_headers, &listener.response_headers]
                    .into_iter()
                    .chain(
                        routes
                            .iter()
                            .flat_map(|r| [&r.request_headers, &r.response_headers]),
                    )
                    .flatten()
                    .any(|rules| rules.uses(Variable::Host)),
            request_body_timeout: listener.request_body_timeout,
            tunnel_idle: listener.idle_timeout,
            unrouted: metrics.route("", ""),
            metrics,
            access_log,
            http01,
            https_redirect: listener.https_redirect,
            error_pages: error_pages::Pages::new(listener.error_pages.as_ref()),
            tls: listener.tls.is_some(),
            hsts: listener
                .tls
                .as_ref()
                .and_then(|tls| tls.hsts.as_ref())
                .map(crate::config::Hsts::value),
            alt_svc: listener
                .tls
                .as_ref()
                .and_then(|tls| tls.http3.as_ref())
                .map(|http3| http3.alt_svc(listener.address.port())),
        }
    }
}

/// A route's label (metrics and access log): its `name`, else its host and path prefix.
fn route_label(route: &crate::config::RouteConfig) -> String {
    match &route.name {
        Some(name) => name.clone(),
        None => format!(
            "{}{}",
            route.host.as_deref().unwrap_or(""),
            route.path_prefix
        ),
    }
}

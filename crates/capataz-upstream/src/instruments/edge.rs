//! The families of what a listener's routes refuse at the edge: requests over a route's rate
//! limit (`capataz_rate_limited`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Families;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    listener: String,
    route: String,
}

/// The edge's families.
#[derive(Clone, Debug)]
pub(super) struct EdgeFamilies {
    rate_limited: Family<RouteLabels, Counter>,
}

impl EdgeFamilies {
    /// Registers the edge's families into `registry`.
    pub(super) fn register(registry: &mut Registry) -> EdgeFamilies {
        let rate_limited = Family::default();
        registry.register(
            "capataz_rate_limited",
            "Requests answered 429 because their key was over the route's rate limit (no \
             backend was tried)",
            rate_limited.clone(),
        );
        EdgeFamilies { rate_limited }
    }
}

impl Families {
    /// The counter of requests route `route` of listener `listener` refused over its rate
    /// limit (its series appears once the route has a limit).
    pub fn rate_limited(&self, listener: &str, route: &str) -> Counter {
        self.edge.rate_limited.get_or_create_owned(&RouteLabels {
            listener: listener.into(),
            route: route.into(),
        })
    }
}

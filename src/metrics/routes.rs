//! The work side's metrics by route: attempts, the hold, and the work waiting and running.
//!
//! Route names come from the config (at most [`crate::config`]'s limit of routes), so the
//! `route` label is bounded; a route removed from the config keeps its last values until the
//! process restarts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::{gauge, AttemptResult};
use crate::route_name::RouteName;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OfRoute {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteAnd {
    result: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteState {
    route: String,
    state: &'static str,
}

type Float = Counter<f64, std::sync::atomic::AtomicU64>;

pub struct RouteMetrics {
    attempts: Family<RouteAnd, Counter>,
    attempt_duration: Family<RouteAnd, Histogram, fn() -> Histogram>,
    hold: Family<OfRoute, Gauge>,
    holds_opened: Family<OfRoute, Counter>,
    held_seconds: Family<OfRoute, Float>,
    hold_waiting: Family<OfRoute, Gauge>,
    work: Family<RouteState, Gauge>,
}

impl Default for RouteMetrics {
    fn default() -> Self {
        RouteMetrics {
            attempts: Family::default(),
            attempt_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.01, 4.0, 10))
            }),
            hold: Family::default(),
            holds_opened: Family::default(),
            held_seconds: Family::default(),
            hold_waiting: Family::default(),
            work: Family::default(),
        }
    }
}

fn of(route: &str) -> OfRoute {
    OfRoute {
        route: route.to_owned(),
    }
}

impl RouteMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sume_attempts",
            "Handler attempts by result (done, failed) and route",
            self.attempts.clone(),
        );
        registry.register_with_unit(
            "sume_attempt_duration",
            "How long handler attempts ran, by result (done, failed) and route",
            Unit::Seconds,
            self.attempt_duration.clone(),
        );
        registry.register(
            "sume_handler_hold",
            "1 while a route's downstream looks down (a hold): no attempt of that route starts but one probe at a time",
            self.hold.clone(),
        );
        registry.register(
            "sume_handler_holds_opened",
            "Holds this receiver opened, by route",
            self.holds_opened.clone(),
        );
        registry.register_with_unit(
            "sume_handler_held",
            "Time this receiver spent in a hold, by route",
            Unit::Seconds,
            self.held_seconds.clone(),
        );
        registry.register(
            "sume_handler_hold_waiting_jobs",
            "Jobs waiting to run on a route (claimed or retrying) behind its hold; 0 when there is none",
            self.hold_waiting.clone(),
        );
        registry.register(
            "sume_route_jobs",
            "Work in the ledger by route and state (waiting: claimed or retrying; running), every receiver's on a shared ledger",
            self.work.clone(),
        );
    }

    /// Makes every series of `route` appear at 0, before anything happens on it.
    pub fn declare(&self, route: &RouteName) {
        let route = route.as_str();
        for result in ["done", "failed"] {
            let labels = RouteAnd {
                result,
                route: route.to_owned(),
            };
            drop(self.attempts.get_or_create(&labels));
        }
        drop(self.hold.get_or_create(&of(route)));
        drop(self.holds_opened.get_or_create(&of(route)));
        drop(self.held_seconds.get_or_create(&of(route)));
        drop(self.hold_waiting.get_or_create(&of(route)));
    }

    pub(super) fn record_attempt_end(
        &self,
        route: &str,
        result: AttemptResult,
        seconds: Option<f64>,
    ) {
        let labels = RouteAnd {
            result: match result {
                AttemptResult::Done => "done",
                AttemptResult::Failed | AttemptResult::Dead => "failed",
            },
            route: route.to_owned(),
        };
        self.attempts.get_or_create(&labels).inc();
        if let Some(seconds) = seconds {
            self.attempt_duration
                .get_or_create(&labels)
                .observe(seconds);
        }
    }

    /// Whether this receiver knows of a hold of `route`.
    pub fn set_hold(&self, route: &RouteName, held: bool) {
        self.hold
            .get_or_create(&of(route.as_str()))
            .set(held.into());
    }

    pub fn record_hold_opened(&self, route: &RouteName) {
        self.holds_opened.get_or_create(&of(route.as_str())).inc();
    }

    pub fn add_held_seconds(&self, route: &RouteName, seconds: f64) {
        self.held_seconds
            .get_or_create(&of(route.as_str()))
            .inc_by(seconds);
    }

    /// The scrape's counts of work by route: `(route, waiting, running)`.
    pub(super) fn set_work(&self, work: &[(String, u64, u64)]) {
        for (route, waiting, running) in work {
            for (state, count) in [("waiting", waiting), ("running", running)] {
                let labels = RouteState {
                    route: route.clone(),
                    state,
                };
                self.work.get_or_create(&labels).set(gauge(*count));
            }
            let held = self.hold.get_or_create(&of(route)).get() == 1;
            self.hold_waiting
                .get_or_create(&of(route))
                .set(if held { gauge(*waiting) } else { 0 });
        }
    }
}

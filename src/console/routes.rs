//! The overview's routes: each route's dispatch and work, and the work of routes not in force.

use serde::Serialize;

use crate::worker::Queues;

/// One route as the overview shows it.
#[derive(Debug, Serialize)]
pub struct RouteRow {
    pub route: String,
    /// `running`, `held`, `paused`, or `not in the config` (its work is kept, unrun).
    pub dispatch: &'static str,
    pub waiting: u64,
    pub running: u64,
    /// When its hold opened, while it is held.
    pub held_since: Option<i64>,
}

/// The routes in force in the config's order (as this process knows their dispatch), then the
/// routes with work that are not; `work` is each route's (route, waiting, running) as the
/// ledger counts it.
pub fn rows(queues: &Queues, work: &[(String, u64, u64)]) -> Vec<RouteRow> {
    let in_force = queues.in_force();
    let work_of = |route: &str| {
        work.iter()
            .find(|(name, _, _)| name == route)
            .map_or((0, 0), |(_, waiting, running)| (*waiting, *running))
    };
    let mut rows: Vec<RouteRow> = in_force
        .names()
        .map(|name| {
            let queue = in_force
                .route(name.as_str())
                .expect("a route in force has its queue");
            let hold = queue.hold();
            let (waiting, running) = work_of(name.as_str());
            RouteRow {
                route: name.to_string(),
                dispatch: match &hold {
                    _ if queue.dispatch_paused() => "paused",
                    Some(_) => "held",
                    None => "running",
                },
                waiting,
                running,
                held_since: hold.map(|hold| hold.since),
            }
        })
        .collect();
    rows.extend(
        work.iter()
            .filter(|(route, waiting, running)| {
                *waiting + *running > 0 && in_force.route(route).is_none()
            })
            .map(|(route, waiting, running)| RouteRow {
                route: route.clone(),
                dispatch: "not in the config",
                waiting: *waiting,
                running: *running,
                held_since: None,
            }),
    );
    rows
}

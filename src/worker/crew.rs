//! A worker per route: started with the service, and started, stopped or replaced when a reload changes the routes.
//!
//! A route taken out of the config keeps its work in the ledger, unrun, until a route of its
//! name comes back; a route whose handler section changed gets a new worker at once, while the
//! old one lets its running attempts end (as at a stop, within the shutdown grace: one still
//! running then is stopped, and the sweeper takes it back when its lease runs out).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Queue, Queues, Worker};
use crate::config::{HandlerConfig, Routes};
use crate::ledger::Ledger;
use crate::route_name::RouteName;
use crate::traces::Tracer;

/// The routes' workers, and the [`Queues`] every other part of the service offers work to.
pub struct Crew {
    ledger: Arc<Ledger>,
    /// Lease slack past each handler's timeout (the sweeper's `stale_after`).
    lease_slack: Duration,
    /// How long a stopping worker lets its running attempts end.
    grace: Duration,
    tracer: Tracer,
    /// The service's stop: every worker's own stop is a child of it.
    stop: CancellationToken,
    queues: Queues,
    working: Vec<Working>,
    /// Every worker's task, those retired by a reload included until their attempts ended.
    tasks: JoinSet<()>,
}

/// A route's running worker.
struct Working {
    route: RouteName,
    handler: HandlerConfig,
    queue: Queue,
    retire: CancellationToken,
}

/// What a change of routes did to the workers, by route.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// New routes: a worker started.
    pub started: Vec<RouteName>,
    /// Routes whose handler section changed: a new worker, the old one retired.
    pub replaced: Vec<RouteName>,
    /// Routes taken out: the worker retired, the work kept in the ledger.
    pub stopped: Vec<RouteName>,
}

impl Crew {
    /// `routes` in force with no worker yet: the sweeper's recovery at start comes first, then
    /// [`Crew::apply`] starts them.
    pub fn new(
        ledger: Arc<Ledger>,
        routes: Arc<Routes>,
        (lease_slack, grace): (Duration, Duration),
        tracer: Tracer,
        stop: CancellationToken,
    ) -> Crew {
        Crew {
            ledger,
            lease_slack,
            grace,
            tracer,
            stop,
            queues: Queues::new(routes, Vec::new()),
            working: Vec::new(),
            tasks: JoinSet::new(),
        }
    }

    /// What the request path, the sweeper, the actions and `/readyz` offer work to and read.
    pub fn queues(&self) -> Queues {
        self.queues.clone()
    }

    /// Puts `routes` in force: a worker for each route that has none, a new one for each whose
    /// handler section changed, none for a route taken out. Every new worker is made before
    /// anything changes, so a route that cannot run (its CA file unreadable) leaves every route
    /// as it was.
    pub fn apply(&mut self, routes: Arc<Routes>) -> anyhow::Result<Changes> {
        // Per route, in the config's order: none where its worker runs on unchanged.
        let made = routes
            .list()
            .iter()
            .map(|route| {
                let unchanged = self
                    .working
                    .iter()
                    .any(|working| working.route == route.name && working.handler == route.handler);
                if unchanged {
                    return Ok(None);
                }
                let (worker, queue) = Worker::new(
                    route.name.clone(),
                    self.ledger.clone(),
                    route.handler.clone(),
                    self.lease_slack,
                )?;
                Ok(Some((worker.traced_by(self.tracer.clone()), queue)))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut changes = Changes::default();
        let mut before = std::mem::take(&mut self.working);
        for (route, made) in routes.list().iter().zip(made) {
            let at = before
                .iter()
                .position(|working| working.route == route.name);
            let previous = at.map(|at| before.remove(at));
            let Some((worker, queue)) = made else {
                self.working
                    .push(previous.expect("an unchanged route's worker runs"));
                continue;
            };
            match previous {
                Some(replaced) => {
                    replaced.retire.cancel();
                    changes.replaced.push(route.name.clone());
                }
                None => changes.started.push(route.name.clone()),
            }
            let retire = self.stop.child_token();
            self.tasks.spawn(worker.run(retire.clone(), self.grace));
            self.working.push(Working {
                route: route.name.clone(),
                handler: route.handler.clone(),
                queue,
                retire,
            });
        }
        for gone in before {
            gone.retire.cancel();
            changes.stopped.push(gone.route);
        }
        let queues = self
            .working
            .iter()
            .map(|working| (working.route.clone(), working.queue.clone()))
            .collect();
        self.queues.replace(routes, queues);
        // Workers retired earlier whose attempts have ended.
        while self.tasks.try_join_next().is_some() {}
        Ok(changes)
    }

    /// After the service's stop: waits for every worker, retired ones included, to let its
    /// running attempts end.
    pub async fn stopped(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

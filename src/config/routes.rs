//! Routes: which downstreams an event goes to, from `[[route]]` and `[routing]` or `[handler]`.
//!
//! Resolved once at load with every problem named by its line; then chosen per event at claim
//! time by [`Routes::select`], one walk over the routes in file order.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::handler::HandlerConfig;
use super::parsing::line_number;
use super::route_match::{BodyFields, EventTypePattern, FieldCondition, FieldValues, RouteMatch};
use crate::route_name::RouteName;

/// Routes become metric labels and ledger keys: a bounded set, and more than a person reads.
pub const MAX_ROUTES: usize = 64;

/// A `[[route]]` table as the file has it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteTable {
    name: RouteName,
    event_types: Option<Vec<EventTypePattern>>,
    fields: Option<BTreeMap<String, FieldValues>>,
    /// `continue = true`: a matched event is offered to the routes after this one too.
    #[serde(default, rename = "continue")]
    fan_out: bool,
    handler: HandlerConfig,
}

impl RouteTable {
    /// For the paths in it to be taken from the config's directory.
    pub(super) fn handler_mut(&mut self) -> &mut HandlerConfig {
        &mut self.handler
    }
}

/// `[routing]` as the file has it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RoutingTable {
    unmatched: Option<Spanned<String>>,
}

/// Every route, in file order, and what happens to an event none of them takes. Made once at
/// load and never changed, so what is worked out from the routes (the fields they read) stays
/// true.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    list: Vec<Route>,
    unmatched: Unmatched,
    /// The top-level fields some route's match reads, sorted, each once.
    field_names: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: RouteName,
    pub matcher: RouteMatch,
    /// `continue = true`: once this route takes an event, the routes after it are tried too.
    pub fan_out: bool,
    pub handler: HandlerConfig,
    /// The line of its `[[route]]` in the file; `None` for the route `[handler]` becomes.
    pub line: Option<usize>,
}

impl Route {
    /// How messages name it: `route "pager" (line 12)`, or `[handler]` for the default route
    /// of a config without `[[route]]`.
    pub fn describe(&self) -> String {
        match self.line {
            Some(line) => format!("route {:?} (line {line})", self.name.as_str()),
            None => "[handler]".to_owned(),
        }
    }

    /// One of its handler's keys as messages name it: `handler.command` for `[handler]`'s
    /// route, `route "pager" (line 12): handler.command` for a `[[route]]`'s.
    pub fn handler_key(&self, key: &str) -> String {
        match self.line {
            Some(_) => format!("{}: handler.{key}", self.describe()),
            None => format!("handler.{key}"),
        }
    }
}

/// `routing.unmatched`: what becomes of an event no route takes. Never a silent drop.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Unmatched {
    /// `"done"`: done with no work (counted), for a config that routes only what it wants.
    Done,
    /// `"dead"`, the default: dead at once with an error naming its type, so it shows in the
    /// dead letters and their alert, and can be retried once the config routes it.
    #[default]
    Dead,
    /// A route's name: that route takes it.
    Route(RouteName),
}

/// The routes an event takes, as [`Routes::select`] chose them.
#[derive(Debug)]
pub enum Selection<'r> {
    /// The routes that matched, in file order; never empty.
    Matched(Vec<&'r Route>),
    /// None matched; `routing.unmatched` names this route.
    Fallback(&'r Route),
    /// None matched; `routing.unmatched = "done"`.
    Done,
    /// None matched; `routing.unmatched = "dead"` (see [`unmatched_error`]).
    Dead,
    /// The config has no route at all: the job stays claimed for an external consumer.
    NoRoutes,
}

impl<'r> Selection<'r> {
    /// The routes with work to do for the event: none for `Done`, `Dead` and `NoRoutes`.
    pub fn routes(&self) -> &[&'r Route] {
        match self {
            Selection::Matched(routes) => routes,
            Selection::Fallback(route) => std::slice::from_ref(route),
            Selection::Done | Selection::Dead | Selection::NoRoutes => &[],
        }
    }
}

/// The error a job dead for want of a route is given: it names the event type, so that the
/// dead letters group by it and say what to route.
pub fn unmatched_error(event_type: Option<&str>) -> String {
    match event_type {
        Some(event_type) => format!("no route takes event type {event_type:?}"),
        None => "no route takes an event without a type".to_owned(),
    }
}

impl Routes {
    fn new(list: Vec<Route>, unmatched: Unmatched) -> Routes {
        let mut field_names: Vec<String> = list
            .iter()
            .flat_map(|route| &route.matcher.fields)
            .map(|condition| condition.name.clone())
            .collect();
        field_names.sort_unstable();
        field_names.dedup();
        Routes {
            list,
            unmatched,
            field_names,
        }
    }

    /// Every route, in file order. Empty when the config has neither `[handler]` nor
    /// `[[route]]`: jobs stay claimed for an external consumer.
    pub fn list(&self) -> &[Route] {
        &self.list
    }

    pub fn unmatched(&self) -> &Unmatched {
        &self.unmatched
    }

    /// The top-level fields some route's match reads, sorted, each once: what the claim path
    /// must keep from a body besides its job_id and type (`KeyFields::read_routed` takes them).
    pub fn field_names(&self) -> &[String] {
        &self.field_names
    }

    /// The work the ledger keeps for routes not in this list, from its count of each route's
    /// work (route, waiting, running): it waits, unrun, until a route of its name comes back.
    pub fn work_not_here(&self, work: &[(String, u64, u64)]) -> Vec<(String, u64)> {
        work.iter()
            .filter(|(route, waiting, _)| {
                *waiting > 0 && !self.list.iter().any(|known| known.name.as_str() == route)
            })
            .map(|(route, waiting, _)| (route.clone(), *waiting))
            .collect()
    }

    /// The routes the event takes: the walk goes over the routes once, in file order, and
    /// stops at the first match without `continue`. `event_type` is the delivery's type as
    /// the claim path read it (`None` without one); `body` its top-level fields as read there.
    pub fn select(&self, event_type: Option<&str>, body: &impl BodyFields) -> Selection<'_> {
        if self.list.is_empty() {
            return Selection::NoRoutes;
        }
        let mut taken = Vec::new();
        for route in &self.list {
            if route.matcher.matches(event_type, body) {
                taken.push(route);
                if !route.fan_out {
                    break;
                }
            }
        }
        if !taken.is_empty() {
            return Selection::Matched(taken);
        }
        match &self.unmatched {
            Unmatched::Done => Selection::Done,
            Unmatched::Dead => Selection::Dead,
            Unmatched::Route(name) => self
                .list
                .iter()
                .find(|route| route.name == *name)
                // Resolution refuses a name that is no route; dead is the visible answer anyway.
                .map_or(Selection::Dead, Selection::Fallback),
        }
    }
}

/// Builds the routes from the file's tables (`text` gives their lines), adding to `problems`
/// everything wrong with them at once.
pub(super) fn resolve(
    tables: Vec<Spanned<RouteTable>>,
    routing: Option<RoutingTable>,
    handler: Option<&HandlerConfig>,
    text: &str,
    problems: &mut Vec<String>,
) -> Routes {
    let unmatched_key = routing.and_then(|routing| routing.unmatched);
    if let (Some(_), Some(first)) = (handler, tables.first()) {
        problems.push(format!(
            "[handler] and [[route]] (line {}) are both set: move [handler] into a [[route]] \
             with name = \"default\" and event_types = [\"*\"] (the name existing jobs belong \
             to), placed after the routes that should take their events first",
            line_number(text, first.span().start)
        ));
    }
    if tables.is_empty() {
        if let Some(unmatched) = unmatched_key {
            problems.push(format!(
                "routing.unmatched (line {}) is for [[route]] tables, and there are none",
                line_number(text, unmatched.span().start)
            ));
        }
        let list = handler.map(|handler| Route {
            name: RouteName::default_route(),
            matcher: RouteMatch::everything(),
            fan_out: false,
            handler: handler.clone(),
            line: None,
        });
        return Routes::new(list.into_iter().collect(), Unmatched::Dead);
    }
    if tables.len() > MAX_ROUTES {
        problems.push(format!(
            "{} [[route]] tables: at most {MAX_ROUTES} (each route is a label on every metric \
             of its work)",
            tables.len()
        ));
    }
    let mut list: Vec<Route> = Vec::with_capacity(tables.len());
    for table in tables {
        let line = line_number(text, table.span().start);
        let route = route(table.into_inner(), line, problems);
        let name = route.name.as_str();
        let describe = route.describe();
        if let Some(first) = list.iter().find(|earlier| earlier.name == route.name) {
            problems.push(format!(
                "{describe}: the name {name:?} is given twice (first on line {})",
                first.line.unwrap_or(0)
            ));
        }
        if let Some(catch_all) = list
            .iter()
            .find(|earlier| earlier.matcher.is_catch_all() && !earlier.fan_out)
        {
            problems.push(format!(
                "{describe} is never reached: {} before it takes every event and has no \
                 `continue = true`",
                catch_all.describe()
            ));
        }
        list.push(route);
    }
    let unmatched = match unmatched_key {
        None => Unmatched::Dead,
        Some(key) => unmatched(&key, &list, text, problems),
    };
    Routes::new(list, unmatched)
}

/// One `[[route]]`, its own problems added to `problems`.
fn route(table: RouteTable, line: usize, problems: &mut Vec<String>) -> Route {
    let fields = table
        .fields
        .as_ref()
        .map(FieldCondition::from_table)
        .unwrap_or_default();
    let route = Route {
        matcher: RouteMatch {
            event_types: table
                .event_types
                .clone()
                .unwrap_or_else(|| vec![EventTypePattern::Any]),
            fields,
        },
        name: table.name,
        fan_out: table.fan_out,
        handler: table.handler,
        line: Some(line),
    };
    let describe = route.describe();
    match (&table.event_types, &table.fields) {
        // Refused rather than read as "everything": a forgotten match must not take it all.
        (None, None) => problems.push(format!(
            "{describe} has no match: give it event_types ([\"*\"] for every event), fields, \
             or both"
        )),
        (Some(types), _) if types.is_empty() => problems.push(format!(
            "{describe}: event_types is empty, so it matches nothing (write [\"*\"] for every \
             event)"
        )),
        (None, Some(fields)) if fields.is_empty() => problems.push(format!(
            "{describe} has no match: fields is empty and event_types is not set (write \
             event_types = [\"*\"] for every event)"
        )),
        _ => {}
    }
    for condition in &route.matcher.fields {
        if let Some(problem) = condition.problem() {
            problems.push(format!("{describe}: {problem}"));
        }
    }
    if ["done", "dead"].contains(&route.name.as_str()) {
        problems.push(format!(
            "{describe}: the name {:?} is reserved: routing.unmatched uses it for an outcome",
            route.name.as_str()
        ));
    }
    let mut handler_problems = Vec::new();
    route.handler.validate(&mut handler_problems);
    problems.extend(
        handler_problems
            .into_iter()
            .map(|problem| format!("{describe}: {problem}")),
    );
    route
}

/// `routing.unmatched`: `"done"`, `"dead"`, or the name of one of `routes`.
fn unmatched(
    key: &Spanned<String>,
    routes: &[Route],
    text: &str,
    problems: &mut Vec<String>,
) -> Unmatched {
    let line = line_number(text, key.span().start);
    match key.get_ref().as_str() {
        "done" => Unmatched::Done,
        "dead" => Unmatched::Dead,
        other => match RouteName::parse(other) {
            Ok(name) if routes.iter().any(|route| route.name == name) => Unmatched::Route(name),
            _ => {
                let names: Vec<&str> = routes.iter().map(|route| route.name.as_str()).collect();
                let shown: String = other.chars().take(64).collect();
                problems.push(format!(
                    "routing.unmatched (line {line}) is {shown:?}: write \"dead\" (the default), \
                     \"done\", or one of the routes: {}",
                    names.join(", ")
                ));
                Unmatched::Dead
            }
        },
    }
}

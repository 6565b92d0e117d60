//! `[[route]]` and `[routing]`: each rule with a file that breaks it, and events walked through.
use super::*;
use crate::route_name::RouteName;

fn parse(text: &str) -> anyhow::Result<Config> {
    Config::parse(text, Path::new("/base"))
}

fn error(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

const MINIMAL: &str = "[signature]\nsecrets = [\"whsec_a\"]\n";

/// Two routes and a catch-all after them, as the example config shows (lines 3, 10, 15).
const ROUTES: &str = "[signature]\nsecrets = [\"whsec_a\"]\n\
    [[route]]\nname = \"pager\"\nevent_types = [\"job.failed\", \"job.timed_*\"]\n\
    fields = { queue = \"critical\", region = [\"eu\", \"us\"] }\ncontinue = true\n\
    [route.handler]\nurl = \"http://127.0.0.1:9000/pager\"\n\
    [[route]]\nname = \"completed\"\nevent_types = [\"job.completed\"]\n\
    [route.handler]\ncommand = [\"true\"]\n\
    [[route]]\nname = \"archive\"\nevent_types = [\"*\"]\n\
    [route.handler]\ncommand = [\"archive\"]\nconcurrency = 1\n";

fn body(json: &str) -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str(json).unwrap()
}

fn names(selection: &Selection) -> Vec<String> {
    selection
        .routes()
        .iter()
        .map(|route| route.name.to_string())
        .collect()
}

/// A route with `name`, its match as `matcher` (TOML lines), a command handler.
fn route(name: &str, matcher: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\n{matcher}[route.handler]\ncommand = [\"true\"]\n")
}

#[test]
fn routes_are_read_in_file_order_with_their_handlers() {
    let config = parse(ROUTES).unwrap();
    let routes = &config.routes;
    let names: Vec<&str> = routes.list().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["pager", "completed", "archive"]);
    let pager = &routes.list()[0];
    assert!(pager.fan_out);
    assert_eq!(pager.line, Some(3));
    assert_eq!(pager.describe(), "route \"pager\" (line 3)");
    assert_eq!(pager.matcher.fields.len(), 2);
    assert!(matches!(pager.handler.kind, HandlerKind::Url(_)));
    assert_eq!(routes.list()[1].line, Some(10));
    assert_eq!(routes.list()[2].handler.concurrency, 1);
    assert_eq!(*routes.unmatched(), Unmatched::Dead, "the default");
    assert_eq!(routes.field_names(), ["queue", "region"]);
    assert!(config.handler.is_none());
}

#[test]
fn a_route_handler_takes_the_handler_keys_and_their_checks() {
    let message = error(&ROUTES.replace("concurrency = 1", "concurrency = 0"));
    assert!(
        message.contains("route \"archive\" (line 15): handler.concurrency must be at least 1"),
        "{message}"
    );
    let with_ca = |url: &str| {
        ROUTES.replace(
            "command = [\"true\"]\n",
            &format!("url = \"{url}\"\nca_file = \"ca.pem\"\n"),
        )
    };
    let config = parse(&with_ca("https://h/")).unwrap();
    assert_eq!(
        config.routes.list()[1].handler.ca_file.as_deref(),
        Some(Path::new("/base/ca.pem")),
        "taken from the config's directory"
    );
    let plain = error(&with_ca("http://h/"));
    assert!(
        plain.contains("line 13") && plain.contains("ca_file is for an https://"),
        "{plain}"
    );
}

#[test]
fn the_handler_table_alone_is_the_default_route_taking_everything() {
    let config = parse(&format!("{MINIMAL}[handler]\ncommand = [\"true\"]\n")).unwrap();
    let [route] = config.routes.list() else {
        panic!("{:?}", config.routes);
    };
    assert_eq!(route.name.as_str(), RouteName::DEFAULT);
    assert!(route.matcher.is_catch_all() && !route.fan_out && route.line.is_none());
    assert_eq!(route.describe(), "[handler]");
    for (event_type, json) in [(Some("job.completed"), "{}"), (None, "{\"n\":1}")] {
        let selection = config.routes.select(event_type, &body(json));
        assert_eq!(names(&selection), ["default"], "{event_type:?}");
    }
    assert!(
        config.handler.is_some(),
        "still read by the code not yet on routes"
    );
}

#[test]
fn no_handler_and_no_route_is_no_route() {
    let config = parse(MINIMAL).unwrap();
    assert!(config.routes.list().is_empty());
    assert!(matches!(
        config.routes.select(Some("job.completed"), &body("{}")),
        Selection::NoRoutes
    ));
}

#[test]
fn handler_and_routes_together_are_refused() {
    let text = format!("{ROUTES}[handler]\ncommand = [\"true\"]\n");
    let message = error(&text);
    assert!(
        message.contains("[handler] and [[route]] (line 3) are both set")
            && message.contains("name = \"default\" and event_types = [\"*\"]"),
        "{message}"
    );
}

#[test]
fn events_take_the_routes_they_match_in_file_order() {
    let config = parse(ROUTES).unwrap();
    let routes = &config.routes;
    let critical = body(r#"{"queue":"critical","region":"eu"}"#);
    // Pager has `continue`: the event goes on, and archive takes it too.
    assert_eq!(
        names(&routes.select(Some("job.failed"), &critical)),
        ["pager", "archive"]
    );
    assert_eq!(
        names(&routes.select(Some("job.timed_out"), &critical)),
        ["pager", "archive"]
    );
    // Completed has none: archive never sees what it takes.
    assert_eq!(
        names(&routes.select(Some("job.completed"), &critical)),
        ["completed"]
    );
    for other in [
        body(r#"{"queue":"critical","region":"asia"}"#),
        body(r#"{"queue":"critical","region":["eu"]}"#),
        body(r#"{"queue":"bulk","region":"eu"}"#),
        body(r#"{"region":"eu"}"#),
    ] {
        assert_eq!(
            names(&routes.select(Some("job.failed"), &other)),
            ["archive"],
            "{other:?}"
        );
    }
    assert_eq!(names(&routes.select(None, &critical)), ["archive"]);
    let huge = "job.".repeat(2_500);
    assert_eq!(names(&routes.select(Some(&huge), &critical)), ["archive"]);
}

#[test]
fn unmatched_events_are_dead_done_or_given_to_a_route() {
    let two = format!(
        "{MINIMAL}{}{}",
        route("pager", "event_types = [\"job.failed\"]\n"),
        route("archive", "fields = { queue = \"bulk\" }\n")
    );
    let select = |routing: &str, event_type: &str| {
        let config = parse(&format!("{two}{routing}")).unwrap();
        let selection = config.routes.select(Some(event_type), &body("{}"));
        (names(&selection), format!("{selection:?}"))
    };
    assert_eq!(select("", "job.failed").0, ["pager"]);
    assert!(select("", "job.completed").1.starts_with("Dead"));
    assert!(select("[routing]\nunmatched = \"dead\"\n", "x")
        .1
        .starts_with("Dead"));
    assert!(select("[routing]\nunmatched = \"done\"\n", "x")
        .1
        .starts_with("Done"));
    let fallback = select("[routing]\nunmatched = \"archive\"\n", "job.completed");
    assert_eq!(fallback.0, ["archive"]);
    assert!(fallback.1.starts_with("Fallback"), "{}", fallback.1);
    assert_eq!(
        unmatched_error(Some("job.completed")),
        "no route takes event type \"job.completed\""
    );
    assert!(unmatched_error(None).contains("without a type"));
}

#[test]
fn routing_names_an_existing_route_or_an_outcome() {
    let one = format!("{MINIMAL}{}", route("pager", "event_types = [\"job.*\"]\n"));
    let message = error(&format!("{one}[routing]\nunmatched = \"pagr\"\n"));
    assert!(
        message.contains("routing.unmatched (line 9) is \"pagr\"")
            && message.contains("one of the routes: pager"),
        "{message}"
    );
    let message = error(&format!("{MINIMAL}[routing]\nunmatched = \"done\"\n"));
    assert!(
        message.contains("routing.unmatched (line 4) is for [[route]] tables"),
        "{message}"
    );
    let message = error(&format!(
        "{one}[routing]\nunmatched = \"done\"\nextra = 1\n"
    ));
    assert!(
        message.contains("line 10") && message.contains("unknown field `extra`"),
        "{message}"
    );
}

#[test]
fn a_bad_route_is_named_by_its_line() {
    let check = |matcher: &str, wanted: &str| {
        let text = format!("{MINIMAL}{}", route("pager", matcher));
        let message = error(&text);
        assert!(message.contains(wanted), "{matcher:?}: {message}");
    };
    // Refused by the parser, which names the line of the value or key.
    check("event_types = [\"job.*.*\"]\n", "line 5");
    check("event_types = [\"job.*.*\"]\n", "more than one `*`");
    check("event_types = [\"job failed\"]\n", "whitespace");
    check("event_types = [\"\"]\n", "empty");
    check("event_types = \"job.failed\"\n", "line 5");
    check("event_types = [\"*\"]\nmatch = \"x\"\n", "line 6");
    check(
        "event_types = [\"*\"]\nmatch = \"x\"\n",
        "unknown field `match`",
    );
    check(
        "fields = { queue = 7 }\n",
        "a string (equality) or an array of strings",
    );
    // Refused by the checks, with the route's line.
    check("", "route \"pager\" (line 3) has no match");
    check("event_types = []\n", "(line 3): event_types is empty");
    check("fields = {}\n", "(line 3) has no match: fields is empty");
    check("fields = { queue = [] }\n", "fields.queue is an empty list");
    let message = error(&format!(
        "{MINIMAL}[[route]]\nname = \"Pager\"\n[route.handler]\ncommand = [\"true\"]\n"
    ));
    assert!(
        message.contains("line 4") && message.contains("must be 1 to 64"),
        "{message}"
    );
    let message = error(&format!(
        "{MINIMAL}[[route]]\nname = \"pager\"\nevent_types = [\"*\"]\n"
    ));
    assert!(message.contains("missing field `handler`"), "{message}");
    let message = error(&format!(
        "{MINIMAL}{}",
        route("pager", "event_types = [\"*\"]\n").replace("command", "concurency = 2\ncommand")
    ));
    assert!(
        message.contains("line 7") && message.contains("unknown field `concurency`"),
        "{message}"
    );
    let message = error(&format!(
        "{MINIMAL}{}",
        route("dead", "event_types = [\"*\"]\n")
    ));
    assert!(
        message.contains("the name \"dead\" is reserved"),
        "{message}"
    );
}

#[test]
fn duplicates_and_unreachable_routes_are_named_by_their_lines() {
    let text = format!(
        "{MINIMAL}{}{}{}{}",
        route("a", "event_types = [\"job.failed\"]\n"),
        route("all", "event_types = [\"job.*\", \"*\"]\n"),
        route("a", "event_types = [\"job.completed\"]\n"),
        route("b", "fields = { queue = \"x\" }\n"),
    );
    let message = error(&text);
    for wanted in [
        "3 problems",
        "route \"a\" (line 13): the name \"a\" is given twice (first on line 3)",
        "route \"a\" (line 13) is never reached: route \"all\" (line 8) before it takes every \
         event and has no `continue = true`",
        "route \"b\" (line 18) is never reached",
    ] {
        assert!(
            message.contains(wanted),
            "{wanted:?} missing from {message}"
        );
    }
    // With `continue`, or with a field condition, the routes after it are reached.
    let reached = text
        .replace("\"job.*\", \"*\"]\n", "\"*\"]\ncontinue = true\n")
        .replace(
            "name = \"a\"\nevent_types = [\"job.completed\"]",
            "name = \"c\"\nevent_types = [\"job.completed\"]",
        );
    parse(&reached).unwrap();
    let fields = text
        .replace(
            "\"job.*\", \"*\"]\n",
            "\"*\"]\nfields = { queue = \"y\" }\n",
        )
        .replace(
            "name = \"a\"\nevent_types = [\"job.completed\"]",
            "name = \"c\"\nevent_types = [\"job.completed\"]",
        );
    parse(&fields).unwrap();
}

#[test]
fn routes_are_capped() {
    let many: String = (0..=MAX_ROUTES)
        .map(|i| route(&format!("r{i}"), "event_types = [\"job.*\"]\n"))
        .collect();
    let message = error(&format!("{MINIMAL}{many}"));
    assert!(
        message.contains("65 [[route]] tables: at most 64"),
        "{message}"
    );
}

/// Any type and body, however shaped: no panic, and the selection is what a plain reading of
/// the rules says (the first match without `continue` ends the walk).
#[test]
fn random_events_are_matched_as_the_rules_say() {
    let config = parse(ROUTES).unwrap();
    let alphabet = [
        "job",
        ".",
        "failed",
        "completed",
        "timed_",
        "*",
        "",
        "é",
        "\"",
        "x",
    ];
    let mut rng = fastrand::Rng::with_seed(51);
    for _ in 0..20_000 {
        let event_type: String = (0..rng.usize(0..6))
            .map(|_| alphabet[rng.usize(..alphabet.len())])
            .collect();
        let event_type = rng.bool().then_some(event_type.as_str());
        let mut fields = serde_json::Map::new();
        for key in ["queue", "region"] {
            let value = match rng.u8(0..5) {
                0 => serde_json::json!("critical"),
                1 => serde_json::json!("eu"),
                2 => serde_json::json!(7),
                3 => serde_json::json!(["eu"]),
                _ => continue,
            };
            fields.insert(key.to_owned(), value);
        }
        let pager = event_type.is_some_and(|t| t == "job.failed" || t.starts_with("job.timed_"))
            && fields.get("queue").and_then(|v| v.as_str()) == Some("critical")
            && fields.get("region").and_then(|v| v.as_str()) == Some("eu");
        let completed = event_type == Some("job.completed");
        let wanted: Vec<&str> = match (pager, completed) {
            (true, _) => vec!["pager", "archive"],
            (false, true) => vec!["completed"],
            (false, false) => vec!["archive"],
        };
        let selection = config.routes.select(event_type, &fields);
        assert_eq!(names(&selection), wanted, "{event_type:?} {fields:?}");
    }
}

/// The example config's commented-out routes, uncommented, are valid and route as it says;
/// commented, they change nothing: the example keeps its one `[handler]`.
#[test]
fn the_example_routes_are_valid() {
    let example = include_str!("../../config.example.toml");
    assert_eq!(
        parse(example).unwrap().routes.list()[0].name.as_str(),
        RouteName::DEFAULT
    );
    let start = example
        .find("# [[route]]")
        .expect("the example shows routes");
    let end = example.find("# unmatched = ").unwrap();
    let routes: String = example[start..end]
        .lines()
        .chain(["# unmatched = \"dead\""])
        .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or(line)))
        .collect();
    let config = parse(&format!("{MINIMAL}{routes}")).unwrap();
    let critical = body(r#"{"queue":"critical","region":"us"}"#);
    let selection = config.routes.select(Some("job.failed"), &critical);
    assert_eq!(names(&selection), ["pager", "archive"]);
    assert_eq!(
        names(&config.routes.select(Some("job.completed"), &critical)),
        ["archive"]
    );
}

#[test]
fn a_route_url_with_a_password_over_http_is_warned_of_by_its_route() {
    let config = parse(&ROUTES.replace("http://127.0.0.1", "http://u:p@127.0.0.1")).unwrap();
    let warnings = config.warnings().join("\n");
    assert!(
        warnings.contains("route \"pager\" (line 3): handler.url: its user:password@ is sent"),
        "{warnings}"
    );
}

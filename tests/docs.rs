//! Docs that cannot drift: every config key, every metric, every command and option, every
//! relative link, the lines the runbooks and the troubleshooting page quote, and the example
//! handlers, checked against the code that exists.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::service::BINARY;
use common::*;
use sume_receiver::config::Config;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(relative))
        .unwrap_or_else(|error| panic!("cannot read {relative}: {error}"))
}

/// The first cell of each row of every table in `markdown` whose first column header is
/// `header`, as the code span it holds (`| `name{labels}` | ...` gives `name{labels}`).
fn first_column(markdown: &str, header: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or("").trim();
        if first == header {
            in_table = true;
        } else if in_table {
            if let Some(code) = first.strip_prefix('`').and_then(|s| s.split('`').next()) {
                names.push(code.to_owned());
            }
        }
    }
    names
}

/// The field names serde accepts where `probe` puts an unknown key: the deserializer of each
/// `deny_unknown_fields` struct lists them in its error ("unknown field `__probe`, expected
/// one of `a`, `b`"), so the list comes from the code itself.
/// `None` where `probe` does not put the key in a table (the probed name is a plain value).
fn accepted_fields(probe: &str) -> Option<Vec<String>> {
    let error = Config::parse(probe, Path::new("/"))
        .map(|_| ())
        .expect_err("an unknown key must be refused")
        .to_string();
    let list = error.split("unknown field `__probe`, expected ").nth(1)?;
    let list = list.lines().next().unwrap_or("");
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key the config file accepts, as `section.key`, and the keys of the tables within a
/// section as `section.table.key` (`server.tls.acme.domains`). A section that is an array of
/// tables (`[[route]]`) gives its tables' keys (`route.name`).
fn accepted_keys() -> BTreeSet<String> {
    let sections = accepted_fields("__probe = 1\n").expect("the top level is a table");
    assert!(sections.len() >= 8, "{sections:?}");
    let mut keys = BTreeSet::new();
    let mut tables: Vec<String> = sections.clone();
    while let Some(table) = tables.pop() {
        let fields = accepted_fields(&format!("[{table}]\n__probe = 1\n")).or_else(|| {
            sections
                .contains(&table)
                .then(|| accepted_fields(&format!("[[{table}]]\n__probe = 1\n")))
                .flatten()
        });
        let Some(fields) = fields else {
            continue;
        };
        assert!(!fields.is_empty(), "[{table}] accepts no key?");
        for field in fields {
            let key = format!("{table}.{field}");
            tables.push(key.clone());
            keys.insert(key);
        }
    }
    keys
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_exists() {
    let accepted = accepted_keys();
    let documented: BTreeSet<String> = first_column(&read("docs/configuration.md"), "key")
        .into_iter()
        .collect();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md lacks a row for {undocumented:?}; it documents keys the code \
         does not accept: {unknown:?}"
    );
}

#[test]
fn every_key_of_the_example_config_exists() {
    let accepted = accepted_keys();
    let mut section = String::new();
    for line in read("config.example.toml").lines() {
        // Commented-out keys (`# url = ...`) are documentation too.
        let line = line.trim_start_matches(['#', ' ']);
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // `[[admin.tokens]]`: a table of an array, which is itself the key.
            section = name.trim_matches(['[', ']']).to_owned();
        } else if let Some((key, _)) = line.split_once(" = ") {
            if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                let key = format!("{section}.{key}");
                assert!(
                    accepted.contains(&key) || accepted.contains(&section),
                    "config.example.toml has {key}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_served_is_in_the_metrics_table_and_back() {
    // One job run first: a histogram family shows in the exposition once it has a series.
    let server = TestServer::start("[handler]\ncommand = [\"true\"]\n").await;
    assert_eq!(server.deliver(&job_body("metrics-1")).await.status, 200);
    let mut text = String::new();
    for _ in 0..500 {
        text = server.metrics().await;
        if !text.contains("sume_attempts_total{result=\"done\",route=\"default\"} 0\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.contains("sume_attempts_total{result=\"done\",route=\"default\"} "),
        "the job never ran\n{text}"
    );
    // `# TYPE sume_deliveries counter`: a counter's samples end in _total, an info's in _info.
    let served: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|line| match line.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, "info")) => format!("{name}_info"),
            Some((name, _)) => name.to_owned(),
            None => panic!("a TYPE line without a type: {line}"),
        })
        .collect();
    assert!(served.len() >= 20, "{text}");
    // Served only on a PostgreSQL ledger, or an HTTPS listener, which this server has not
    // (tests/https.rs reads the TLS ones).
    const POSTGRES_ONLY: &[&str] = &["sume_work_side_writable"];
    const TLS_ONLY: &[&str] = &[
        "sume_tls_certificate_present",
        "sume_tls_certificate_expiry_timestamp_seconds",
        "sume_tls_certificate_failures_total",
        "sume_tls_handshakes_refused_total",
    ];
    let documented: BTreeSet<String> = first_column(&read("docs/operating.md"), "metric")
        .iter()
        .map(|name| name.split('{').next().unwrap().to_owned())
        .filter(|name| {
            !POSTGRES_ONLY.contains(&name.as_str()) && !TLS_ONLY.contains(&name.as_str())
        })
        .collect();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/operating.md's metrics table lacks {undocumented:?}; it names metrics /metrics \
         does not serve: {unknown:?}"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The markdown outside fenced code blocks.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    prose(markdown)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// The targets of the `[text](target)` links of `markdown`, code spans and blocks left out.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(markdown).lines() {
        let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for piece in outside_code.split("](").skip(1) {
            if let Some(end) = piece.find(')') {
                targets.push(piece[..end].to_owned());
            }
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let mut pages = vec![PathBuf::from(ROOT).join("README.md")];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    assert!(pages.len() >= 8, "{pages:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
            } else if !fragment.is_empty() && file.extension().is_some_and(|ext| ext == "md") {
                let headings = anchors(&std::fs::read_to_string(&file).unwrap());
                if !headings.contains(fragment) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `--help`'s sections of a command: its subcommands, its argument names and its long options.
struct Help {
    commands: Vec<String>,
    arguments: Vec<String>,
    options: Vec<String>,
}

fn help(path: &[&str]) -> Help {
    let output = Command::new(BINARY).args(path).arg("-h").output().unwrap();
    assert!(output.status.success(), "{path:?} -h failed");
    let text = String::from_utf8(output.stdout).unwrap();
    let mut help = Help {
        commands: Vec::new(),
        arguments: Vec::new(),
        options: Vec::new(),
    };
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') {
            section = line;
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or("");
        match section {
            "Commands:" if first != "help" => help.commands.push(first.to_owned()),
            "Arguments:" => help
                .arguments
                .push(first.trim_matches(['<', '>', '[', ']', '.']).to_owned()),
            "Options:" => {
                if let Some(long) = line.split_whitespace().find(|w| w.starts_with("--")) {
                    help.options.push(long.trim_end_matches(',').to_owned());
                }
            }
            _ => {}
        }
    }
    help
}

#[test]
fn the_man_page_and_the_command_line_page_have_every_command_and_every_option() {
    let output = Command::new(BINARY)
        .args(["generate", "man"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let man = String::from_utf8(output.stdout)
        .unwrap()
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "")
        .replace("\\fI", "");
    let lines: Vec<&str> = man.lines().collect();
    let root = help(&[]);
    for option in &root.options {
        assert!(man.contains(option.as_str()), "the man page lacks {option}");
    }
    let mut commands: Vec<Vec<String>> = root.commands.iter().map(|c| vec![c.clone()]).collect();
    let mut all = Vec::new();
    while let Some(path) = commands.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = help(&args);
        for sub in &help.commands {
            let mut deeper = path.clone();
            deeper.push(sub.clone());
            commands.push(deeper);
        }
        all.push((format!("sume-receiver {}", path.join(" ")), help));
    }
    assert!(all.len() >= 20, "{} commands", all.len());
    let headings: BTreeSet<&str> = all.iter().map(|(name, _)| name.as_str()).collect();
    let page = read("docs/command-line.md");
    let page_rows: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with("| `"))
        .collect();
    for (name, help) in &all {
        let start = lines
            .iter()
            .position(|line| *line == name)
            .unwrap_or_else(|| panic!("the man page lacks the command {name}"));
        let end = lines[start + 1..]
            .iter()
            .position(|line| headings.contains(line))
            .map_or(lines.len(), |offset| start + 1 + offset);
        let entry = lines[start..end].join("\n");
        for option in help.options.iter().filter(|o| !root.options.contains(o)) {
            assert!(
                entry.contains(option.as_str()),
                "{name}: no {option}\n{entry}"
            );
            // And docs/command-line.md has it in a row of that command, unless the row sends
            // the reader elsewhere (`loadgen [...]`: the performance page).
            let mut rows = page_rows.iter().filter(|row| row.contains(name.as_str()));
            assert!(
                rows.any(|row| row.contains(option.as_str()) || row.contains(" [...]`")),
                "docs/command-line.md has no row of `{name}` with {option}"
            );
        }
        for argument in &help.arguments {
            let shown = format!("<{argument}>");
            assert!(entry.contains(&shown), "{name}: no {shown}\n{entry}");
        }
    }
}

#[test]
fn the_readmes_example_handlers_are_the_files_the_tests_run() {
    let readme = read("README.md");
    for (heading, file) in [
        ("### Example: a shell handler", "examples/handler.sh"),
        ("### Example: an HTTP handler", "examples/http_handler.py"),
    ] {
        let section = &readme[readme.find(heading).expect(heading)..];
        let block = section
            .split("```")
            .nth(1)
            .expect("a code block under the heading");
        let source = read(file);
        let lines: BTreeSet<&str> = source.lines().map(str::trim_end).collect();
        // The block's first line is its language.
        for line in block.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            assert!(
                lines.contains(line.trim_end()),
                "{file} lacks the README's line {line:?}"
            );
        }
    }
}

/// Runs the receiver with `handler` (a `[handler]` section's keys) and delivers two jobs, one
/// whose id is no safe file name; both must end `done` with their body saved in `out`.
async fn example_handler_does_jobs(handler: &str, out: &Path) {
    let server = TestServer::start(&format!("[handler]\n{handler}\n")).await;
    let jobs = ["example-1", "tenant/42 ../x"];
    for job in jobs {
        assert_eq!(server.deliver(&job_body(job)).await.status, 200);
    }
    let done = eventually(Duration::from_secs(20), || {
        jobs.iter()
            .all(|job| server.state_of(job).as_deref() == Some("done"))
    })
    .await;
    assert!(
        done,
        "{:?}",
        server.rows("SELECT job_id, state, last_error FROM jobs", &[])
    );
    let mut saved: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    saved.sort();
    let mut expected: Vec<String> = jobs.iter().map(|job| job_body(job)).collect();
    expected.sort();
    assert_eq!(saved, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_example_handler_does_jobs() {
    let out = tempfile::tempdir().unwrap();
    let handler = format!(
        "command = [\"{ROOT}/examples/handler.sh\", \"{}\"]",
        out.path().display()
    );
    example_handler_does_jobs(&handler, out.path()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_example_handler_does_jobs() {
    let out = tempfile::tempdir().unwrap();
    let port = free_port();
    let _handler = KillOnDrop(
        Command::new("python3")
            .arg(format!("{ROOT}/examples/http_handler.py"))
            .arg(format!("127.0.0.1:{port}"))
            .arg(out.path())
            .spawn()
            .expect("python3 runs the HTTP example handler"),
    );
    let listening = eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(listening, "the HTTP example handler never listened");
    let config = format!("url = \"http://127.0.0.1:{port}/sume-jobs\"");
    example_handler_does_jobs(&config, out.path()).await;
}

/// A child process stopped when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The environment variables the tests read: every `SUME_TEST_*` name, and every name read
/// with `env::var`/`env::var_os` in tests/.
fn test_variables() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut files = vec![PathBuf::from(ROOT).join(".ci/run")];
    for dir in ["tests", "tests/common"] {
        for entry in std::fs::read_dir(Path::new(ROOT).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    let is_name = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices("SUME_TEST_") {
            let name: String = text[at..].chars().take_while(|c| is_name(*c)).collect();
            names.insert(name);
        }
        for call in ["env::var(\"", "env::var_os(\""] {
            for (at, _) in text.match_indices(call) {
                let rest = &text[at + call.len()..];
                names.insert(rest.chars().take_while(|c| is_name(*c)).collect());
            }
        }
    }
    names.retain(|name| name.len() > "SUME_TEST_".len() || !name.starts_with("SUME_TEST_"));
    names
}

#[test]
fn every_variable_the_tests_read_is_in_the_testing_page() {
    let documented: BTreeSet<String> = first_column(&read("docs/testing.md"), "variable")
        .into_iter()
        .collect();
    let read_by_tests = test_variables();
    assert!(read_by_tests.len() >= 5, "{read_by_tests:?}");
    let undocumented: Vec<_> = read_by_tests.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "docs/testing.md's variables table lacks {undocumented:?}"
    );
}

/// The files of a directory of the repository whose name ends in `suffix`, sorted.
fn files_in(dir: &str, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(Path::new(ROOT).join(dir))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(suffix))
        .collect();
    names.sort();
    names
}

#[test]
fn the_testing_page_lists_every_suite() {
    let listed: BTreeSet<String> = first_column(&read("docs/testing.md"), "suite")
        .into_iter()
        .collect();
    let suites = files_in("tests", ".rs");
    assert!(suites.len() >= 15, "{suites:?}");
    let missing: Vec<_> = suites
        .iter()
        .filter(|suite| !listed.contains(&format!("tests/{suite}")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/testing.md's suites table lacks {missing:?}"
    );
}

#[test]
fn the_operating_page_names_every_schema_version() {
    let operating = read("docs/operating.md");
    let schema = operating
        .split("\nSchema: ")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("docs/operating.md has a \"Schema:\" paragraph");
    let migrations = files_in("migrations/sqlite", ".sql");
    assert!(migrations.len() >= 8, "{migrations:?}");
    let missing: Vec<_> = migrations
        .iter()
        .filter(|file| {
            !schema.contains(&format!("`{file}`")) && !schema.contains(&format!("/{file}`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operating.md's schema list lacks {missing:?}"
    );
}

/// The text of every Rust file under src/.
fn sources() -> Vec<String> {
    let mut texts = Vec::new();
    let mut dirs = vec![Path::new(ROOT).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                texts.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    texts
}

/// Every string literal inside a `tracing::<level>!(...)` call in src/: what the journal can say.
fn logged_strings() -> Vec<String> {
    let mut logged = Vec::new();
    for text in sources() {
        for level in ["trace", "debug", "info", "warn", "error"] {
            for (at, call) in text.match_indices(&format!("tracing::{level}!(")) {
                logged.extend(literals_of_call(&text[at + call.len()..]));
            }
        }
    }
    logged
}

/// The rest of a string literal whose opening quote `chars` has just passed, unescaped; a
/// line ending escaped with `\` continues after the next line's indentation, as in Rust.
fn read_literal(chars: &mut std::iter::Peekable<std::str::Chars>) -> String {
    let mut literal = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => match chars.next() {
                Some('\n') => while chars.next_if(|c| c.is_whitespace()).is_some() {},
                Some('n') => literal.push('\n'),
                Some(escaped) => literal.push(escaped),
                None => {}
            },
            _ => literal.push(c),
        }
    }
    literal
}

/// The string literals of a macro call's arguments, up to its closing parenthesis.
fn literals_of_call(arguments: &str) -> Vec<String> {
    let mut literals = Vec::new();
    let mut depth = 1;
    let mut chars = arguments.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            '"' => literals.push(read_literal(&mut chars)),
            _ => {}
        }
    }
    literals
}

/// Every string literal of src/, comments left out: what an error can be made of.
fn source_literals() -> Vec<String> {
    let mut literals = Vec::new();
    for text in sources() {
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '/' if chars.next_if_eq(&'/').is_some() => {
                    while chars.next_if(|c| *c != '\n').is_some() {}
                }
                // A quote as a char literal ('"', '\"') opens no string.
                '\'' => {
                    let mut ahead = chars.clone();
                    if matches!(
                        (ahead.next(), ahead.next(), ahead.next()),
                        (Some('"'), Some('\''), _) | (Some('\\'), Some('"'), Some('\''))
                    ) {
                        chars = ahead;
                    }
                }
                '"' => literals.push(read_literal(&mut chars)),
                _ => {}
            }
        }
    }
    literals
}

/// A piece of text where some part is unknown: a format string's `{...}` placeholder, or a
/// quote's `...`.
#[derive(Clone, Copy, PartialEq)]
enum Piece {
    Char(char),
    Any,
}

fn format_pattern(literal: &str) -> Vec<Piece> {
    let mut pattern = Vec::new();
    let mut chars = literal.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.next_if_eq(&'{').is_some() => pattern.push(Piece::Char('{')),
            '}' if chars.next_if_eq(&'}').is_some() => pattern.push(Piece::Char('}')),
            '{' => {
                while chars.next_if(|c| *c != '}').is_some() {}
                chars.next();
                pattern.push(Piece::Any);
            }
            _ => pattern.push(Piece::Char(c)),
        }
    }
    pattern
}

fn quote_pattern(quote: &str) -> Vec<Piece> {
    quote
        .split("...")
        .map(|part| part.chars().map(Piece::Char).collect::<Vec<_>>())
        .collect::<Vec<_>>()
        .join(&Piece::Any)
}

/// How many of `literal`'s own characters a text that fits both patterns can take from
/// `quote`'s own characters, at most (each pattern's unknown parts standing for anything);
/// `None` when no text fits both.
fn matched_chars(literal: &[Piece], quote: &[Piece]) -> Option<usize> {
    // best[i][j]: for literal[i..] and quote[j..].
    let mut best = vec![vec![None; quote.len() + 1]; literal.len() + 1];
    for i in (0..=literal.len()).rev() {
        for j in (0..=quote.len()).rev() {
            let (a, b) = (literal.get(i), quote.get(j));
            let mut options = Vec::new();
            if a.is_none() && b.is_none() {
                options.push(Some(0));
            }
            if a == Some(&Piece::Any) {
                options.push(best[i + 1][j]);
                if b.is_some() {
                    options.push(best[i][j + 1]);
                }
            }
            if b == Some(&Piece::Any) {
                options.push(best[i][j + 1]);
                if a.is_some() {
                    options.push(best[i + 1][j]);
                }
            }
            if let (Some(Piece::Char(x)), Some(Piece::Char(y))) = (a, b) {
                if x == y {
                    options.push(best[i + 1][j + 1].map(|n: usize| n + 1));
                }
            }
            best[i][j] = options.into_iter().flatten().max();
        }
    }
    best[0][0]
}

/// Whether `quote` (an error as the docs quote it) holds what one of the code's `literals`
/// says: its placeholders filled by the quote's values, and where the quote has `...`, any part
/// of it left out, as long as 20 of its characters are in the quote as they are (so that
/// neither `"{}: {}"` nor a literal the quote's `...` takes whole passes for one).
fn says_a_literal(quote: &str, literals: &[String]) -> bool {
    let quoted = quote_pattern(quote);
    literals.iter().any(|literal| {
        let mut pattern = vec![Piece::Any];
        pattern.extend(format_pattern(literal));
        pattern.push(Piece::Any);
        // The cheap test first: a part of 10 characters or more is in the quote as it is.
        let in_quote = pattern
            .split(|piece| *piece == Piece::Any)
            .map(|part| {
                part.iter()
                    .map(|piece| match piece {
                        Piece::Char(c) => *c,
                        Piece::Any => unreachable!("split at them"),
                    })
                    .collect::<String>()
            })
            .any(|part| part.len() >= 10 && quote.contains(part.as_str()));
        in_quote && matched_chars(&pattern, &quoted).is_some_and(|matched| matched >= 20)
    })
}

/// The lines quoted in the code blocks of `markdown`'s `## ` sections.
fn quoted_lines(markdown: &str) -> Vec<String> {
    let body = &markdown[markdown.find("\n## ").expect("a ## heading")..];
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in body.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced && !line.trim().is_empty() {
            lines.push(line.to_owned());
        }
    }
    lines
}

#[test]
fn every_line_the_troubleshooting_page_quotes_is_one_the_receiver_says() {
    let logged = logged_strings();
    let literals = source_literals();
    assert!(literals.len() > 1000, "{} literals", literals.len());
    let quoted = quoted_lines(&read("docs/troubleshooting.md"));
    assert!(quoted.len() >= 15, "{quoted:?}");
    let mut unknown = Vec::new();
    for line in &quoted {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some(error) = line
            .strip_prefix("error: ")
            .or_else(|| line.strip_prefix("warning: "))
        {
            // What `serve` or `check-config` printed: an error's chain of contexts.
            if !says_a_literal(error, &literals) {
                unknown.push(line);
            }
        } else if first == "curl:" || first.ends_with("]:") {
            // Another program's words (`curl: (60) ...`, `systemd-journald[301]: ...`).
        } else {
            // A journal line: the message, then its fields (`name=value`) or `...`.
            let message = line
                .split(' ')
                .take_while(|word| *word != "..." && !is_field(word))
                .collect::<Vec<_>>()
                .join(" ");
            if !logged.contains(&message) {
                unknown.push(line);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/troubleshooting.md quotes lines the code never says: {unknown:#?}"
    );
}

/// `name=value`, a journal line's field.
fn is_field(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
    })
}

#[test]
fn every_journal_line_the_alert_runbooks_quote_is_one_the_code_logs() {
    let logged = logged_strings();
    assert!(logged.len() > 100, "{} logged strings", logged.len());
    // A quoted line: text in double quotes after "journal" in the same paragraph.
    let mut quoted = Vec::new();
    for paragraph in read("docs/alerts.md").split("\n\n") {
        let paragraph = paragraph.replace('\n', " ");
        if let Some(at) = paragraph.find("journal") {
            let after = &paragraph[at..];
            quoted.extend(after.split('"').skip(1).step_by(2).map(str::to_owned));
        }
    }
    assert!(quoted.len() >= 2, "{quoted:?}");
    let never_logged: Vec<_> = quoted
        .iter()
        .filter(|line| !logged.iter().any(|logged| logged.contains(line.as_str())))
        .collect();
    assert!(
        never_logged.is_empty(),
        "docs/alerts.md quotes journal lines the code never logs: {never_logged:?}"
    );
}

//! The house's imports point down: no file of src/ imports, directly or through others, a file
//! that imports it (docs/architecture.md). The graph is read from the sources themselves.
//!
//! An arrow is any path that names a module of the crate: `use crate::a::b`, `super::`,
//! `self::`, a child module by its name (`jobs::claim`), and the binary's `sume_receiver::`.
//! It points at the file of the longest module prefix of that path, so an item re-exported by a
//! module's root (`crate::ledger::Ledger`) is an arrow to that root (ledger/mod.rs). A module
//! declaring its children (`mod jobs;`) is not an arrow.
//!
//! A file reaching the root of a module it is inside (`super::PostgresLedger` from
//! postgres/hold.rs, `super::Console` from console/act.rs) is the one arrow up the house allows:
//! a module's root is the door its files share, and Rust gives a child its parent's private
//! items for that. Every other arrow must point down; the backends' rule is stricter (they
//! never reach `ledger/mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A module's path from its crate's root, with the crate: `["lib", "ledger", "sqlite"]`.
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The tokens that matter to paths, with comments, strings and char literals left out.
fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && raw_string_at(&chars, i) {
            // r"..." or r#"..."#: ends at a quote followed by as many hashes.
            let mut hashes = 0;
            i += 1;
            while chars[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push(Token::Other);
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(Token::Other);
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            out.push(Token::Other);
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_whitespace() {
            i += 1;
        } else if c == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(match c {
                '{' => Token::Open,
                '}' => Token::Close,
                ',' => Token::Comma,
                ';' => Token::Semi,
                '*' => Token::Star,
                _ => Token::Other,
            });
            i += 1;
        }
    }
    out
}

fn raw_string_at(chars: &[char], i: usize) -> bool {
    // An identifier ending in r (`bar"`) is not a raw string: the r must start a token.
    let starts_token = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    starts_token && chars.get(j) == Some(&'"')
}

fn ident(token: Option<&Token>) -> Option<&str> {
    match token {
        Some(Token::Ident(name)) => Some(name),
        _ => None,
    }
}

/// The paths a use tree names, from `at` (just after `use`) to its `;`: `a::{b, c::{d, e}}`
/// gives `a::b`, `a::c::d`, `a::c::e`.
fn use_tree(tokens: &[Token], at: &mut usize, prefix: &[String], paths: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while *at < tokens.len() {
        match &tokens[*at] {
            Token::Ident(name) if name == "as" => {
                *at += 2;
            }
            Token::Ident(name) => {
                path.push(name.clone());
                *at += 1;
            }
            Token::PathSep | Token::Star => *at += 1,
            Token::Open => {
                *at += 1;
                while *at < tokens.len() && tokens[*at] != Token::Close {
                    use_tree(tokens, at, &path, paths);
                    if tokens.get(*at) == Some(&Token::Comma) {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            Token::Comma | Token::Close | Token::Semi | Token::Other => break,
        }
    }
    if path.len() > prefix.len() {
        paths.push(path);
    }
}

/// One source file: its module and the module paths it names, each resolved against the
/// (possibly inline) module it is written in.
struct Source {
    module: ModPath,
    named: Vec<ModPath>,
}

/// Turns a path written in `module` into a path from the crate's root, or None for a path
/// outside the crate (std, a dependency, a local name).
fn absolute(path: &[String], module: &ModPath, children: &BTreeSet<String>) -> Option<ModPath> {
    let first = path.first()?;
    let crate_root = vec![module[0].clone()];
    let (mut base, rest) = match first.as_str() {
        "crate" => (crate_root, &path[1..]),
        "sume_receiver" if module[0] == "bin" => (vec!["lib".to_owned()], &path[1..]),
        "self" => (module.clone(), &path[1..]),
        "super" => {
            let mut base = module.clone();
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        name if children.contains(name) => (module.clone(), path),
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

fn read_source(module: ModPath, text: &str) -> Source {
    let tokens = tokens(text);
    // The children a module declares (`mod jobs;`, `mod tests { .. }`): names a path may start
    // with inside it.
    let children: BTreeSet<String> = tokens
        .windows(2)
        .filter(|pair| ident(pair.first()) == Some("mod"))
        .filter_map(|pair| ident(pair.get(1)).map(str::to_owned))
        .collect();
    let mut named = Vec::new();
    // Inline modules (`mod tests {`): the module a token is in, by brace depth.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut at = 0;
    while at < tokens.len() {
        let mut here = module.clone();
        here.extend(inline.iter().map(|(name, _)| name.clone()));
        match &tokens[at] {
            Token::Open => {
                depth += 1;
                at += 1;
            }
            Token::Close => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                at += 1;
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some(name), Some(Token::Open)) =
                    (ident(tokens.get(at + 1)), tokens.get(at + 2))
                {
                    inline.push((name.to_owned(), depth));
                }
                at += 1;
            }
            Token::Ident(word) if word == "use" => {
                at += 1;
                let mut paths = Vec::new();
                use_tree(&tokens, &mut at, &[], &mut paths);
                named.extend(paths.iter().filter_map(|p| absolute(p, &here, &children)));
            }
            Token::Ident(first) => {
                // A path in code: `crate::metrics::Snapshot`, `super::super::jobs::X`.
                let after_sep = at > 0 && tokens[at - 1] == Token::PathSep;
                let mut path = vec![first.clone()];
                at += 1;
                while tokens.get(at) == Some(&Token::PathSep) {
                    match ident(tokens.get(at + 1)) {
                        Some(name) => path.push(name.to_owned()),
                        None => break,
                    }
                    at += 2;
                }
                if !after_sep && path.len() > 1 {
                    named.extend(absolute(&path, &here, &children));
                }
            }
            _ => at += 1,
        }
    }
    Source { module, named }
}

/// Every .rs file under src/, by module path; main.rs and src/cli/ are the binary's crate.
fn sources() -> BTreeMap<PathBuf, Source> {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(&src).unwrap().to_path_buf());
            }
        }
    }
    let mut sources = BTreeMap::new();
    for file in files {
        let mut parts: Vec<String> = file
            .with_extension("")
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|last| last == "mod") {
            parts.pop();
        }
        let krate = if parts == ["main"] || parts.first().is_some_and(|p| p == "cli") {
            "bin"
        } else {
            "lib"
        };
        if parts == ["main"] || parts == ["lib"] {
            parts.clear();
        }
        let mut module = vec![krate.to_owned()];
        module.extend(parts);
        let text = std::fs::read_to_string(src.join(&file)).unwrap();
        sources.insert(Path::new("src").join(&file), read_source(module, &text));
    }
    sources
}

/// The file-level graph: for each file, the files it names (itself left out).
fn graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let sources = sources();
    let by_module: BTreeMap<&ModPath, &PathBuf> = sources
        .iter()
        .map(|(file, source)| (&source.module, file))
        .collect();
    sources
        .iter()
        .map(|(file, source)| {
            let targets = source
                .named
                .iter()
                .filter_map(|path| {
                    (1..=path.len())
                        .rev()
                        .find_map(|len| by_module.get(&path[..len].to_vec()).copied())
                })
                .filter(|target| *target != file)
                .cloned()
                .collect();
            (file.clone(), targets)
        })
        .collect()
}

/// Whether `to` is the root of a module `from` is inside (src/a/mod.rs or src/a.rs for
/// src/a/b.rs and src/a/b/c.rs).
fn to_own_root(from: &Path, to: &Path) -> bool {
    let dir = if to.file_name().is_some_and(|name| name == "mod.rs") {
        to.parent().map(Path::to_path_buf)
    } else {
        Some(to.with_extension(""))
    };
    dir.is_some_and(|dir| from.starts_with(dir))
}

/// The graph without the arrows to a file's own module roots.
fn without_own_roots(
    graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    graph
        .iter()
        .map(|(from, to)| {
            let down = to
                .iter()
                .filter(|to| !to_own_root(from, to))
                .cloned()
                .collect();
            (from.clone(), down)
        })
        .collect()
}

/// The strongly connected components with more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a PathBuf) {
        let n = state.index.len();
        state.index.insert(node, n);
        state.low.insert(node, n);
        state.stack.push(node);
        state.on_stack.insert(node);
        for next in &state.graph[node] {
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[next].min(state.low[node]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.index[next].min(state.low[node]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(top);
                component.push(top.clone());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

/// One cycle through `from` inside its component, as `a -> b -> a` (breadth first: the shortest).
fn cycle_through(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>, from: &PathBuf) -> String {
    let mut came_from: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        for next in &graph[node] {
            if next == from {
                let mut path = vec![node];
                while let Some(previous) = came_from.get(path.last().unwrap()) {
                    path.push(previous);
                }
                path.reverse();
                let mut names: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
                names.insert(0, from.display().to_string());
                names.dedup();
                names.push(from.display().to_string());
                return names.join(" -> ");
            }
            if next != from && !came_from.contains_key(next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    unreachable!("{} is in a circle", from.display())
}

#[test]
fn no_file_of_src_imports_a_file_that_imports_it() {
    let all = graph();
    let arrows: usize = all.values().map(BTreeSet::len).sum();
    let graph = without_own_roots(&all);
    let to_roots = arrows - graph.values().map(BTreeSet::len).sum::<usize>();
    // The reader itself: a graph this size with its known arrows, or it reads nothing.
    assert!(
        graph.len() > 90 && arrows > 300,
        "{} files, {arrows} arrows",
        graph.len()
    );
    let ledger_mod = PathBuf::from("src/ledger/mod.rs");
    assert!(graph[&PathBuf::from("src/service.rs")].contains(&ledger_mod));
    assert!(graph[&PathBuf::from("src/ledger/sqlite/writer/mod.rs")]
        .contains(&PathBuf::from("src/ledger/sqlite/jobs.rs")));
    let circles = circles(&graph);
    println!(
        "{} files, {arrows} arrows ({to_roots} to a file's own module root), {} circles",
        graph.len(),
        circles.len()
    );
    let report: Vec<String> = circles
        .iter()
        .map(|files| {
            let inside: usize = files
                .iter()
                .map(|file| graph[file].iter().filter(|to| files.contains(to)).count())
                .sum();
            format!(
                "{} files, {inside} arrows among them, e.g. {}",
                files.len(),
                cycle_through(&graph, &files[0])
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "{} import circles among {} files and {arrows} arrows ({to_roots} of them to a file's own \
         module root, left out):\n{}",
        report.len(),
        graph.len(),
        report.join("\n")
    );
}

#[test]
fn no_backend_imports_the_ledgers_root() {
    let graph = graph();
    let root = PathBuf::from("src/ledger/mod.rs");
    let importers: Vec<_> = graph
        .iter()
        .filter(|(file, to)| {
            (file.starts_with("src/ledger/sqlite") || file.starts_with("src/ledger/postgres"))
                && to.contains(&root)
        })
        .map(|(file, _)| file.display().to_string())
        .collect();
    assert!(
        importers.is_empty(),
        "backends importing ledger/mod.rs: {importers:?}"
    );
}

/// One module-file style: a module with files of its own has its root in `mod.rs`, never in a
/// `name.rs` beside its `name/` (a directory of assets, without Rust files, is no module).
#[test]
fn every_module_with_files_has_its_root_in_mod_rs() {
    let beside: Vec<String> = sources()
        .keys()
        .filter_map(|file| file.parent())
        .filter(|dir| Path::new(ROOT).join(dir.with_extension("rs")).is_file())
        .map(|dir| dir.with_extension("rs").display().to_string())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(
        beside.is_empty(),
        "roots beside their module's directory (make them mod.rs): {beside:?}"
    );
}

#[test]
fn an_arrow_to_a_files_own_module_root_is_told_from_one_to_a_sibling() {
    let own = |from: &str, to: &str| to_own_root(Path::new(from), Path::new(to));
    assert!(own(
        "src/ledger/postgres/hold.rs",
        "src/ledger/postgres/mod.rs"
    ));
    assert!(own("src/ledger/sqlite/open.rs", "src/ledger/mod.rs"));
    assert!(own("src/rollup/flush.rs", "src/rollup/mod.rs"));
    assert!(!own("src/rollup/mod.rs", "src/ledger/mod.rs"));
    assert!(!own(
        "src/ledger/postgres/role.rs",
        "src/ledger/postgres/connection.rs"
    ));
    assert!(!own("src/hold/mod.rs", "src/worker/mod.rs"));
    assert!(!own("src/ledger/mod.rs", "src/ledger/sqlite/mod.rs"));
}

#[test]
fn the_reader_sees_use_trees_paths_in_code_and_inline_modules() {
    let source = read_source(
        vec!["lib".into(), "a".into(), "b".into()],
        "use crate::{x::{self, y as z}, w};\n\
         mod kid;\n\
         // crate::in_a_comment\n\
         fn f() { let s = \"crate::in_a_string\"; kid::go(); crate::v::V::new(); let c = '{'; }\n\
         mod tests { use super::super::sibling::X; }\n",
    );
    let named: Vec<String> = source.named.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        [
            "lib::x::self",
            "lib::x::y",
            "lib::w",
            "lib::a::b::kid::go",
            "lib::v::V::new",
            "lib::a::sibling::X"
        ]
    );
}

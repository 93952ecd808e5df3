//! The runtime's modules depend on each other one way only (ARCHITECTURE.md, "Dependency
//! order"): this reads the `src/` of `capataz-runtime` and of `capataz` (the binary's modules,
//! whose `crate::<module>` paths name the runtime's modules re-exported under the same names),
//! with `capataz-admin` as the one module `admin`, collects each top-level module's
//! `crate::<module>` paths (code only, not comments) and fails on any cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules named right after `crate::` in `code`: `crate::a::B`, and each item of
/// `crate::{a, b::{C, D}}` at the top level of the braces.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        // `$crate::` and `some_crate::` are other paths.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.insert(ident(rest));
            continue;
        };
        let mut depth = 0;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                c if c.is_whitespace() => {}
                _ if item_start && depth == 0 => {
                    found.insert(ident(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

/// Each top-level module of `src` and the top-level modules its files name.
fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let first = relative.components().next().expect("a file name");
            let top = first.as_os_str().to_string_lossy();
            let top = top.strip_suffix(".rs").unwrap_or(&top).to_owned();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code: String = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let deps = graph.entry(top.clone()).or_default();
            deps.extend(crate_paths(&code).into_iter().filter(|m| *m != top));
        }
    }
    graph
}

/// The modules a whole crate's files name (its own top-level modules left out): a crate that its
/// dependents see as one module, such as `capataz-admin` (`admin`).
fn crate_as_module(src: &Path) -> BTreeSet<String> {
    let own = module_graph(src);
    let mut deps = BTreeSet::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                let code: String = text
                    .lines()
                    .filter(|line| !line.trim_start().starts_with("//"))
                    .collect::<Vec<_>>()
                    .join("\n");
                deps.extend(crate_paths(&code));
            }
        }
    }
    deps.retain(|m| !own.contains_key(m));
    deps
}

/// The runtime's modules (`capataz-runtime`), the binary's (`capataz`) and the admin API
/// (`capataz-admin`, as `admin`): one namespace, since the binary and the admin API name the
/// runtime's modules by the names it has always had.
fn runtime_graph() -> Graph {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut graph = module_graph(&crates.join("capataz-runtime/src"));
    for (module, deps) in module_graph(&crates.join("capataz/src")) {
        assert!(!graph.contains_key(&module), "{module} is in two crates");
        graph.insert(module, deps);
    }
    graph.insert(
        "admin".to_owned(),
        crate_as_module(&crates.join("capataz-admin/src")),
    );
    graph
}

/// The modules reachable from `from`.
fn reachable(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(module) = stack.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

/// The strongly connected groups of more than one module: the cycles.
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reachable(graph, m))).collect();
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for (module, from) in &reach {
        if !from.contains(*module) || groups.iter().any(|g| g.contains(*module)) {
            continue;
        }
        let group: BTreeSet<String> = from
            .iter()
            .filter(|other| reach.get(other).is_some_and(|r| r.contains(*module)))
            .cloned()
            .collect();
        groups.push(group);
    }
    groups
}

#[test]
fn crate_paths_reads_single_and_grouped_imports() {
    let code = "use crate::config::Config;\nuse crate::{alerts::{A, B}, health, metrics::X};\n\
                let x = crate::timefmt::now(); $crate::ignored; other_crate::nope;";
    let found: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(found, ["alerts", "config", "health", "metrics", "timefmt"]);
}

#[test]
fn the_runtime_modules_have_no_cycle() {
    let graph = runtime_graph();
    assert!(
        graph.contains_key("health")
            && graph.contains_key("server")
            && graph["admin"].contains("supervisor"),
        "{graph:?}"
    );
    let bad: Vec<String> = cycles(&graph)
        .into_iter()
        .map(|group| {
            let edges: Vec<String> = group
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|d| group.contains(*d))
                        .map(move |d| format!("{m} -> {d}"))
                })
                .collect();
            format!("{group:?}: {}", edges.join(", "))
        })
        .collect();
    assert!(bad.is_empty(), "module cycles: {bad:#?}");
    // The edges the renovation removed stay removed. (The request path below the proxy,
    // `upstream`, `balance`, `body` and `instruments`, is the crate `capataz-upstream` now:
    // Cargo keeps it from importing the health runtime; and Cargo keeps `capataz-runtime` from
    // importing the admin API and the binary's modules, `capataz-admin` from importing the
    // binary's.)
    for (from, to) in [
        ("health", "metrics"),
        ("admin", "server"),
        ("supervisor", "server"),
        ("supervisor", "admin"),
        ("proxy", "health"),
    ] {
        assert!(!graph[from].contains(to), "{from} imports {to}");
    }
}

#[test]
fn the_crates_split_from_the_runtime_have_no_module_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (name, module) in [
        ("capataz-upstream", "upstream"),
        ("capataz-discovery", "etcd"),
        ("capataz-runtime", "health"),
        ("capataz-admin", "routes"),
    ] {
        let graph = module_graph(&crates.join(name).join("src"));
        assert!(graph.contains_key(module), "{name}: {graph:?}");
        let bad = cycles(&graph);
        assert!(bad.is_empty(), "{name}: module cycles: {bad:#?}");
    }
    // The HTTP/1.1 client knows no body type of the proxy.
    let graph = module_graph(&crates.join("capataz-upstream/src"));
    assert!(!graph["upstream"].contains("body"), "upstream imports body");
}

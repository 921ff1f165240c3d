//! The crate's top-level modules form a layered graph without cycles.
//!
//! Reads `src/`, takes every `crate::<module>` path (in `use` items and in code, doc links
//! included) and builds the graph "module A refers to module B". The test fails on a cycle and prints it, and it
//! checks the intended order bottom to top, so a new dependency that points upward is caught
//! even before it closes a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top: a module may refer only to modules listed before it.
const LAYERS: &[&str] = &[
    "probe",
    "clock",
    "size",
    "generation",
    "error",
    "sync",
    "trace",
    "config",
    "memory",
    "event",
    "ipc_event",
    "stream",
    "device",
    "kernel",
    "comm",
    "runtime",
    "bindings",
];

/// Modules outside the layering: the loom models test several layers at once.
const EXEMPT: &[&str] = &["lib", "loom_tests"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let p = entry.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`src/stream/engine.rs` -> `stream`).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// Identifiers following `crate::` in `text`.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        // `runtime_core::` or `my_crate::` are not `crate::`.
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !ident.is_empty() {
            out.insert(ident);
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| top_module(&src, f)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top_module(&src, f);
        let text = std::fs::read_to_string(f).expect("read a source file");
        let edges = g.entry(from.clone()).or_default();
        for to in crate_refs(&text) {
            if to != from && modules.contains(&to) {
                edges.insert(to);
            }
        }
    }
    g
}

fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).expect("on the path");
                let mut cycle = path[start..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys().filter(|n| !EXEMPT.contains(&n.as_str())) {
        let mut path = Vec::new();
        if let Some(c) = visit(n, g, &mut state, &mut path) {
            return Some(c);
        }
    }
    None
}

#[test]
fn top_level_modules_have_no_cycle() {
    let mut g = graph();
    for e in EXEMPT {
        g.remove(*e);
    }
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn every_dependency_points_down_the_layers() {
    let g = graph();
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut upward = Vec::new();
    for (from, tos) in &g {
        if EXEMPT.contains(&from.as_str()) {
            continue;
        }
        let Some(rf) = rank(from) else {
            panic!("module {from} is not in LAYERS; place it in the layer order");
        };
        for to in tos {
            let rt = rank(to).unwrap_or_else(|| panic!("module {to} is not in LAYERS"));
            if rt >= rf {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(upward.is_empty(), "dependencies pointing up: {upward:?}");
}

#[test]
fn the_checker_sees_references_and_cycles() {
    let refs =
        crate_refs("use crate::memory::Buffer; x = crate::clock::now_ns(); runtime_core::event");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        vec!["clock".to_string(), "memory".to_string()]
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(find_cycle(&g).map(|c| c.len()), Some(3));
}

/// The bindings are layered as ARCHITECTURE.md's table of `crates/runtime-py/src` says: every
/// file is in the table, and uses only files of the rows above its own.
#[test]
fn the_bindings_follow_their_layer_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("## The bindings (`crates/runtime-py/src`)")
        .nth(1)
        .expect("the bindings section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut row_of = std::collections::HashMap::new();
    for (row, line) in section.lines().filter(|l| l.starts_with("| `")).enumerate() {
        let first = line.split('|').nth(1).unwrap();
        for name in first.split('`').skip(1).step_by(2) {
            row_of.insert(name.trim_end_matches(".rs").to_string(), row);
        }
    }
    let src = root.join("crates/runtime-py/src");
    let mut wrong = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let me = p.file_stem().unwrap().to_string_lossy().to_string();
        let Some(&my_row) = row_of.get(&me) else {
            wrong.push(format!("{me}.rs is not in the table"));
            continue;
        };
        let code = std::fs::read_to_string(&p).unwrap();
        let mut used = std::collections::BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + 7..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(0)];
                used.extend(
                    inner
                        .split(',')
                        .map(|x| x.trim().split("::").next().unwrap().to_string()),
                );
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                used.insert(name);
            }
        }
        for u in used {
            if let Some(&row) = row_of.get(&u) {
                if u != me && row >= my_row {
                    wrong.push(format!("{me}.rs uses {u}.rs, which is not above it"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

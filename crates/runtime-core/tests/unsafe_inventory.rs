//! ARCHITECTURE.md's inventory of `unsafe` is the truth: every source file of the workspace
//! with `unsafe` code is listed, with the number of `unsafe` blocks, impls, fns, traits and
//! extern blocks it has. A new `unsafe` anywhere fails this test until the inventory (and
//! its soundness argument) says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `unsafe` keywords that open unsafe code, outside comments.
fn count_unsafe(code: &str) -> usize {
    code.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .map(|l| {
            [
                "unsafe {",
                "unsafe impl",
                "unsafe fn",
                "unsafe extern",
                "unsafe trait",
            ]
            .iter()
            .map(|k| l.matches(k).count())
            .sum::<usize>()
        })
        .sum()
}

#[test]
fn every_unsafe_is_in_the_architecture_inventory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found = BTreeMap::new();
    for krate in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let n = count_unsafe(&std::fs::read_to_string(&f).unwrap());
            if n > 0 {
                let rel = f.strip_prefix(&root).unwrap().display().to_string();
                found.insert(rel, n);
            }
        }
    }
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut listed = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3 && cells[1].starts_with("`crates/") {
            let file = cells[1].trim_matches('`').to_string();
            let n: usize = cells[2]
                .parse()
                .unwrap_or_else(|_| panic!("count of {file}"));
            listed.insert(file, n);
        }
    }
    assert!(
        !listed.is_empty(),
        "no inventory table found in ARCHITECTURE.md"
    );
    let mut wrong = Vec::new();
    for (f, n) in &found {
        match listed.get(f) {
            None => wrong.push(format!("{f}: {n} unsafe, not listed")),
            Some(m) if m != n => wrong.push(format!("{f}: {n} unsafe, listed as {m}")),
            _ => {}
        }
    }
    for f in listed.keys().filter(|f| !found.contains_key(*f)) {
        wrong.push(format!("{f}: listed, but has no unsafe"));
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's unsafe inventory is stale: {wrong:#?}"
    );
}

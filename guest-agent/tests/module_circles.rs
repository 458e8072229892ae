//! The agent's files import one another in layers: no circle between the modules of
//! `src/` (each top-level file or directory is one module; comments and test code aside),
//! so that each can be read, and changed, after the ones it uses. The same rule as
//! `module-circles.py` applies to the VMM's top-level modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The `crate::<module>` names `text` uses, comments and the `#[cfg(test)] mod` aside.
fn uses(text: &str, mods: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let code = match code.find("#[cfg(test)]\nmod ") {
        Some(i) => &code[..i],
        None => &code[..],
    };
    let mut out = BTreeSet::new();
    // `crate::name` and every name inside `crate::{a, b::c}`.
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(|p| p.trim().split("::").next().unwrap_or(""))
                .collect(),
            None => vec![rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")],
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| mods.contains(*n))
                .map(String::from),
        );
    }
    out
}

/// Every `.rs` file under `dir` that is not test code, with its text.
fn sources(dir: &Path, out: &mut Vec<(std::path::PathBuf, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The import graph between the top-level modules of `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods = BTreeSet::new();
    for e in std::fs::read_dir(src).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match name.strip_suffix(".rs") {
            Some(m) if m != "lib" && m != "main" => {
                mods.insert(m.to_string());
            }
            None if path.is_dir() => {
                mods.insert(name);
            }
            _ => {}
        }
    }
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in files {
        let rel = path.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.strip_suffix(".rs").unwrap_or(&top).to_string();
        if !mods.contains(&top) {
            continue;
        }
        let to = uses(&text, &mods);
        edges
            .entry(top.clone())
            .or_default()
            .extend(to.into_iter().filter(|t| *t != top));
    }
    edges
}

/// The circles of `edges`: each a module that reaches itself, with the path back.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in edges.keys() {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    found.push(path.clone());
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    found
}

#[test]
fn the_agents_modules_import_one_another_in_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    assert!(
        edges.get("agent").is_some_and(|e| e.contains("publish")),
        "the scan sees the imports: {edges:?}"
    );
    assert_eq!(circles(&edges), Vec::<Vec<String>>::new(), "{edges:?}");
}

#[test]
fn the_check_finds_a_circle_and_reads_grouped_imports() {
    let mods: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        uses(
            "use crate::{a, b::X};\n// crate::c\nfn f() { crate::a::g() }\n#[cfg(test)]\nmod tests { use crate::c; }",
            &mods
        ),
        ["a", "b"].iter().map(|s| s.to_string()).collect()
    );
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("a".into()).or_default().insert("b".into());
    e.entry("b".into()).or_default().insert("c".into());
    assert!(circles(&e).is_empty());
    e.entry("c".into()).or_default().insert("a".into());
    assert_eq!(circles(&e).len(), 3, "a, b and c each reach themselves");
}

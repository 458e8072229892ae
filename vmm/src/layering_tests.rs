//! Keeps the top-level modules of this crate layered: no import circle between them (the
//! project's rule; `/work/shared/tools/module-circles.py` is the same check as a script).
//!
//! Data flow: the test reads every non-test source file under `vmm/src`, drops comments and
//! the `#[cfg(test)] mod` that ends a file, collects each top-level module's `crate::NAME`
//! references (plain paths and `use crate::{a, b::c}` groups) as edges, and fails naming the
//! modules of every circle and their edges inside it. Test files (`tests.rs`, `*_tests.rs`,
//! anything under a `tests/` folder) may reach anywhere. A second test keeps the client crate
//! (and the binary's completion and man page generators) out of the library's manifest and
//! sources: the binary, which uses them, is the cli/ package.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules: each `.rs` file but the crate roots, and each folder.
fn modules(src: &Path) -> BTreeSet<String> {
    let mut mods = BTreeSet::new();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            mods.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                mods.insert(stem.to_string());
            }
        }
    }
    mods
}

/// The non-test `.rs` files under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// `text` without `//` comments and without the test module that ends a file.
fn production_code(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// The names `code` reaches with `crate::NAME` or inside `crate::{...}`.
fn referenced(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let body = &group[..group.find(';').unwrap_or(group.len())];
            for part in body.split([',', ' ', '\n', '\t']) {
                let head = part.split("::").next().unwrap_or("");
                out.insert(ident(head.trim_matches(|c| c == '{' || c == '}')));
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

/// The edges between top-level modules of the crate rooted at `src`.
fn graph(src: &Path) -> Graph {
    let mods = modules(src);
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges = Graph::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if !mods.contains(&top) {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for to in referenced(&code) {
            if mods.contains(&to) && to != top {
                edges.entry(top.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// Every set of modules that reach each other (a circle), with its edges inside the set.
fn circles(edges: &Graph) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for (m, r) in &reaches {
        if !r.contains(*m) || found.iter().any(|c| c.contains(m)) {
            continue;
        }
        let circle: Vec<String> = reaches
            .iter()
            .filter(|(n, rn)| rn.contains(*m) && r.contains(**n))
            .map(|(n, _)| (*n).clone())
            .collect();
        found.push(circle);
    }
    found
}

#[test]
fn no_import_circle_between_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    // The check sees the graph at all: the run loop's module reaches the exit handler.
    assert!(edges.get("vcpu").is_some_and(|e| e.contains("exit")));
    let found = circles(&edges);
    let text: Vec<String> = found
        .iter()
        .flat_map(|c| {
            c.iter().map(|m| {
                let inside: Vec<&String> = edges[m].iter().filter(|n| c.contains(n)).collect();
                format!("{m} -> {inside:?}")
            })
        })
        .collect();
    assert!(
        found.is_empty(),
        "import circles between top-level modules of vmm/src: {found:?}\n{}",
        text.join("\n")
    );
}

/// The names of the packages a manifest's library links: the keys of its `[dependencies]` and
/// `[build-dependencies]` tables (plain or `[target.'cfg(..)'.dependencies]`), in order.
fn linked_packages(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut linked = false;
    for line in manifest.lines().map(str::trim) {
        if let Some(table) = line.strip_prefix('[') {
            let table = table.trim_end_matches(']');
            linked = table == "dependencies"
                || table == "build-dependencies"
                || (table.starts_with("target.")
                    && (table.ends_with(".dependencies")
                        || table.ends_with(".build-dependencies")));
            continue;
        }
        let key = line.split(['=', '.']).next().unwrap_or("").trim();
        if linked && !key.is_empty() && !key.starts_with('#') {
            names.push(key.to_string());
        }
    }
    names
}

/// The server library links neither the client crate (the binary's `ctl`, `top` and `host`
/// subcommands and its run-directory registration live in the cli/ package, beside it) nor
/// the generators of the binary's shell completions and man pages; and no source file of
/// the library names the client crate.
#[test]
fn the_library_is_free_of_the_client_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let linked = linked_packages(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap());
    assert!(
        linked.iter().any(|p| p == "ppa-vmm-api"),
        "the manifest reader found no ppa-vmm-api among {linked:?}"
    );
    for banned in ["ppa-vmm-client", "clap_complete", "clap_mangen"] {
        assert!(
            !linked.iter().any(|p| p == banned),
            "vmm/Cargo.toml links {banned}; it belongs to the binary's package (cli/)"
        );
    }
    let src = dir.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let users: Vec<String> = files
        .iter()
        .filter(|f| {
            production_code(&std::fs::read_to_string(f).unwrap()).contains("ppa_vmm_client")
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(
        users.is_empty(),
        "library files naming ppa_vmm_client: {users:?}"
    );
}

#[test]
fn the_manifest_reader_sees_linked_tables_only() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\na = { workspace = true }\n\
                    b.workspace = true\n# c = \"1\"\n\n[dev-dependencies]\nd = \"1\"\n\n\
                    [target.'cfg(unix)'.dependencies]\ne = \"1\"\n[build-dependencies]\nf = \"1\"\n\
                    [[test]]\nname = \"g\"\n";
    assert_eq!(linked_packages(manifest), ["a", "b", "e", "f"]);
}

#[test]
fn the_parser_sees_paths_groups_and_skips_comments_and_tests() {
    let code = production_code(
        "use crate::a::X;\nuse crate::{b::{Y, Z}, c};\n// crate::d\nfn f() { crate::e::g() }\n\
         #[cfg(test)]\nmod tests {\n    use crate::f;\n}\n",
    );
    let got: Vec<String> = referenced(&code).into_iter().collect();
    // `Z` comes from inside a nested group; it names no module, so it never becomes an edge.
    assert_eq!(got, ["Z", "a", "b", "c", "e"]);
}

#[test]
fn circles_are_found_and_layers_pass() {
    let g = |pairs: &[(&str, &str)]| -> Graph {
        let mut e = Graph::new();
        for (a, b) in pairs {
            e.entry(a.to_string()).or_default().insert(b.to_string());
        }
        e
    };
    assert!(circles(&g(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    let found = circles(&g(&[
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("d", "e"),
    ]));
    assert_eq!(found, [["a", "b", "c"]]);
}

//! The generated files stay what the code generates: `dist/` (completions, man pages, JSON
//! Schemas) and README.md's usage block. `PPA_REGENERATE=1 cargo test -p ppa-vmm-cli --bin ppa-vmm
//! cli::` rewrites them; without it a difference fails with the file named.

use std::path::{Path, PathBuf};

use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn regenerate() -> bool {
    std::env::var_os("PPA_REGENERATE").is_some_and(|v| v == "1")
}

/// The README's usage block, between its two markers.
const USAGE_START: &str = "<!-- usage: generated from clap (cli/src/cli.rs); PPA_REGENERATE=1 cargo test -p ppa-vmm-cli --bin ppa-vmm cli:: -->\n";
const USAGE_END: &str = "<!-- end of usage -->\n";

#[test]
fn dist_is_what_the_code_generates() {
    let dist = repo().join("dist");
    let files = dist_files().unwrap();
    let mut stale = Vec::new();
    for (path, text) in &files {
        let file = dist.join(path);
        if regenerate() {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, text).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            stale.push(file.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date (PPA_REGENERATE=1 cargo test -p ppa-vmm-cli --bin ppa-vmm cli:: rewrites them): {stale:?}"
    );
    // Nothing is shipped that is not generated.
    for sub in ["completions", "man", "schemas"] {
        for e in std::fs::read_dir(dist.join(sub)).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(&dist).unwrap().to_path_buf();
            assert!(
                files.iter().any(|(f, _)| *f == rel),
                "{} is not generated",
                p.display()
            );
        }
    }
}

#[test]
fn readme_usage_is_what_clap_says() {
    let path = repo().join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(USAGE_START).expect("the usage start marker") + USAGE_START.len();
    let end = start
        + readme[start..]
            .find(USAGE_END)
            .expect("the usage end marker");
    let block: String = usage_synopsis()
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    let want = format!("\n{block}\n");
    if regenerate() {
        std::fs::write(
            &path,
            format!("{}{want}{}", &readme[..start], &readme[end..]),
        )
        .unwrap();
    } else {
        assert_eq!(
            readme[start..end],
            want,
            "README.md's usage block is out of date"
        );
    }
}

/// The `bench-defaults` blocks of README.md and docs/operations.md: the sentence of
/// [`bench_defaults_text`], from the code's defaults.
const BENCH_START: &str = "<!-- bench-defaults: generated from cli/src/cli.rs; PPA_REGENERATE=1 cargo test -p ppa-vmm-cli --bin ppa-vmm cli:: -->\n";
const BENCH_END: &str = "<!-- end of bench-defaults -->\n";

#[test]
fn the_bench_defaults_the_docs_give_are_the_codes() {
    for rel in ["README.md", "docs/operations.md"] {
        let path = repo().join(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        let start = text
            .find(BENCH_START)
            .unwrap_or_else(|| panic!("{rel}: no start marker"))
            + BENCH_START.len();
        let end = start + text[start..].find(BENCH_END).expect("the end marker");
        let want = bench_defaults_text();
        if regenerate() {
            std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..])).unwrap();
        } else {
            assert_eq!(
                text[start..end],
                want,
                "{rel}'s bench defaults are out of date"
            );
        }
    }
    // And the help the man page and completions carry says the same numbers.
    let bench = cli_command();
    let bench = bench.find_subcommand("bench").unwrap();
    let help = |name: &str| {
        bench
            .get_arguments()
            .find(|a| a.get_id() == name)
            .and_then(|a| a.get_help())
            .map(ToString::to_string)
            .unwrap()
    };
    assert_eq!(
        help("rounds"),
        "Rounds of alternated runs (default: overhead 45, socket 5, limit 5, net 5, disk 5, start 10, stops 3)"
    );
    assert_eq!(
        help("exits"),
        "Exits per run (default: overhead 8,000, net 20,000; socket refuses it, the others ignore it)"
    );
}

#[test]
fn the_usage_names_every_option() {
    let usage = usage_synopsis();
    for sub in Cli::command().get_subcommands() {
        for a in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = a.get_long() {
                if long != "help" {
                    assert!(
                        usage.contains(&format!("--{long}")),
                        "{} --{long}",
                        sub.get_name()
                    );
                }
            }
        }
    }
    // Issue 28: README's usage lacked these.
    for f in [
        "--client-timeout",
        "--idle-timeout",
        "--initrd",
        "--cmdline",
    ] {
        assert!(usage.contains(f), "{f}");
    }
}

fn schema(kind: SchemaKind) -> serde_json::Value {
    serde_json::from_str(&kind.schema()).unwrap()
}

#[test]
fn the_request_schema_has_every_command() {
    let s = schema(SchemaKind::Request);
    let mut cmds: Vec<&str> = s["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["properties"]["cmd"]["const"].as_str().unwrap())
        .collect();
    // The schema lists the commands in the enum's order, COMMANDS in the docs' order.
    let mut all = ppa_vmm_api::COMMANDS.to_vec();
    cmds.sort_unstable();
    all.sort_unstable();
    assert_eq!(cmds, all);
    assert!(s["properties"]["id"].is_object());
}

#[test]
fn the_config_schema_has_every_key_and_no_other() {
    let s = schema(SchemaKind::Config);
    assert_eq!(s["additionalProperties"], serde_json::json!(false));
    let props = s["properties"].as_object().unwrap();
    assert!(!props.contains_key("config"), "no nested config files");
    // Every flag of `run` but --config is a key.
    let run = Cli::command();
    let run = run.find_subcommand("run").unwrap();
    for a in run.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        if long == "config" || long == "help" {
            continue;
        }
        assert!(props.contains_key(&long.replace('-', "_")), "{long}");
    }
    assert_eq!(
        props.len(),
        run.get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l != "config" && l != "help"))
            .count()
    );
}

#[test]
fn the_report_and_response_schemas_name_their_members() {
    let r = schema(SchemaKind::Report);
    for k in ["vm", "vcpus", "groups"] {
        assert!(r["properties"][k].is_object(), "{k}");
    }
    let resp = schema(SchemaKind::Response);
    for k in ["id", "ok", "result", "error"] {
        assert!(resp["properties"][k].is_object(), "{k}");
    }
    let kinds = resp["$defs"]["ErrorKind"].to_string();
    assert!(
        kinds.contains("too-many-clients") && kinds.contains("bad-limit"),
        "{kinds}"
    );
}

#[test]
fn completions_and_man_pages_name_every_subcommand() {
    let bash = completions(clap_complete::Shell::Bash);
    let pages = man_pages().unwrap();
    for sub in Cli::command().get_subcommands() {
        assert!(bash.contains(sub.get_name()), "{}", sub.get_name());
        let page = format!("ppa-vmm-{}.1", sub.get_name());
        assert!(pages.iter().any(|(n, _)| *n == page), "{page}");
    }
    assert!(bash.contains("--client-timeout"));
    let run = &pages.iter().find(|(n, _)| n == "ppa-vmm-run.1").unwrap().1;
    assert!(run.contains("client\\-timeout"), "{run:.400}");
}

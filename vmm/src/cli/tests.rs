//! The generated files stay what the code generates: `dist/` (completions, man pages, JSON
//! Schemas) and README.md's usage block. `PPA_REGENERATE=1 cargo test -p ppa-vmm --lib cli::`
//! rewrites them; without it a difference fails with the file named.

use std::path::{Path, PathBuf};

use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn regenerate() -> bool {
    std::env::var_os("PPA_REGENERATE").is_some_and(|v| v == "1")
}

/// The README's usage block, between its two markers.
const USAGE_START: &str = "<!-- usage: generated from clap (vmm/src/cli.rs); PPA_REGENERATE=1 cargo test -p ppa-vmm --lib cli:: -->\n";
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
        "out of date (PPA_REGENERATE=1 cargo test -p ppa-vmm --lib cli:: rewrites them): {stale:?}"
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
    let cmds: Vec<&str> = s["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["properties"]["cmd"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(cmds, ppa_vmm_api::COMMANDS);
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

/// Checks `v` against `schema` (the subset of JSON Schema that schemars writes: `$ref`,
/// `type`, `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
/// `oneOf`, `anyOf`, `allOf`, `minimum`, `unevaluatedProperties` over one `oneOf`): the first
/// mismatch, as a path and a reason.
fn validate(root: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let err = |why: String| Err(format!("{at}: {why}"));
    if let Some(Value::String(r)) = schema.get("$ref") {
        let name = r.trim_start_matches("#/$defs/");
        return validate(root, &root["$defs"][name], v, at);
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            _ => false,
        });
        if !ok {
            return err(format!("{v} is not {types:?}"));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            return err(format!("{v} is not {c}"));
        }
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        if !e.contains(v) {
            return err(format!("{v} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            return err(format!("{n} < {min}"));
        }
    }
    if let Some(Value::Array(all)) = schema.get("allOf") {
        for s in all {
            validate(root, s, v, at)?;
        }
    }
    for (key, need) in [("oneOf", 1usize), ("anyOf", 0)] {
        if let Some(Value::Array(alts)) = schema.get(key) {
            let n = alts
                .iter()
                .filter(|s| validate(root, s, v, at).is_ok())
                .count();
            if (need == 1 && n != 1) || n == 0 {
                return err(format!("{n} of the {key} alternatives match {v:.200}"));
            }
        }
    }
    if let (Some(Value::Array(items)), Some(s)) = (
        v.as_array().map(|a| Value::Array(a.clone())),
        schema.get("items"),
    ) {
        for (i, item) in items.iter().enumerate() {
            validate(root, s, item, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(obj) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(req)) = schema.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    return err(format!("no `{r}`"));
                }
            }
        }
        if schema.get("unevaluatedProperties") == Some(&Value::Bool(false)) {
            // The members this schema and its matching alternative evaluate.
            let branch = schema["oneOf"]
                .as_array()
                .and_then(|alts| alts.iter().find(|s| validate(root, s, v, at).is_ok()));
            for k in obj.keys() {
                let known = |s: Option<&Value>| {
                    s.and_then(|s| s.get("properties"))
                        .and_then(Value::as_object)
                        .is_some_and(|p| p.contains_key(k))
                };
                if !known(Some(schema)) && !known(branch) {
                    return err(format!("`{k}` is not evaluated"));
                }
            }
        }
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(root, s, val, &format!("{at}.{k}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return err(format!("`{k}` is not allowed"))
                }
                None => {}
            }
        }
    }
    Ok(())
}

use serde_json::Value;

fn check(kind: SchemaKind, v: &Value) -> Result<(), String> {
    let s = schema(kind);
    validate(&s, &s, v, "$")
}

/// The schemas accept what the VMM writes and refuse what it refuses.
#[test]
fn the_schemas_accept_real_messages_and_refuse_bad_ones() {
    let vm = crate::api::tests_support::handle(2);
    let stats = serde_json::to_value(crate::api::handler::fresh_stats(&vm)).unwrap();
    check(SchemaKind::Stats, &stats).unwrap();
    let mut bad = stats.clone();
    bad["vcpus"][0]["wall_ns"] = Value::from("soon");
    assert!(check(SchemaKind::Stats, &bad).is_err());
    let mut h = crate::api::handler::Handler::new(vm.clone(), 0);
    for line in [
        r#"{"id":1,"cmd":"version"}"#,
        r#"{"id":"x","cmd":"threads"}"#,
        r#"{"cmd":"vcpu","vcpu":9}"#,
        r#"{"cmd":"nope"}"#,
        r#"{"id":2,"cmd":"set-limit","group":"vm","limit":"150"}"#,
    ] {
        let resp: Value = serde_json::from_str(&h.handle_line(line.as_bytes()).line()).unwrap();
        check(SchemaKind::Response, &resp).unwrap_or_else(|e| panic!("{resp}: {e}"));
    }
    let threads: Value =
        serde_json::from_str(&h.handle_line(br#"{"cmd":"threads"}"#).line()).unwrap();
    check(SchemaKind::Threads, &threads["result"]).unwrap();
    for ok in [
        serde_json::json!({"id": 1, "cmd": "set-limit", "group": "vm", "limit": "50%"}),
        serde_json::json!({"cmd": "histogram", "name": "guest_run", "format": "text"}),
        serde_json::json!({"id": [1, {"a": null}], "cmd": "subscribe", "events": ["vm-exit"]}),
    ] {
        check(SchemaKind::Request, &ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in [
        serde_json::json!({"cmd": "set-limit", "group": "vm", "limit": 150}),
        serde_json::json!({"cmd": "frobnicate"}),
        serde_json::json!({"cmd": "vcpu"}),
        serde_json::json!({"cmd": "stats", "verbose": true}),
    ] {
        assert!(check(SchemaKind::Request, &bad).is_err(), "{bad}");
    }
    let cfg = serde_json::json!({"vcpus": 4, "workload": ["busy:ms=5"], "report": "json", "accounting": "full", "seccomp": "log"});
    check(SchemaKind::Config, &cfg).unwrap();
    assert!(crate::config::RunOptions::from_json(&cfg.to_string()).is_ok());
    for bad in [
        serde_json::json!({"cpus": 4}),
        serde_json::json!({"report": "xml"}),
        serde_json::json!({"vcpus": -1}),
        serde_json::json!({"config": "other.json"}),
    ] {
        assert!(check(SchemaKind::Config, &bad).is_err(), "{bad}");
        assert!(
            crate::config::RunOptions::from_json(&bad.to_string()).is_err(),
            "{bad}"
        );
    }
}

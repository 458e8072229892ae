//! The shipped JSON Schemas (`dist/schemas/`, generated from the serde types by the `ppa-vmm`
//! binary's `cli` module, whose test keeps them current) accept what this library's control
//! socket and config parser accept, and refuse what they refuse: real messages from a
//! [`Handler`] on a synthetic VM, checked by a small validator of the JSON Schema subset that
//! schemars writes.

use std::path::Path;

use serde_json::Value;

use crate::api::handler::{fresh_stats, Handler};
use crate::api::tests_support::handle;
use crate::config::RunOptions;

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

/// Checks `v` against the shipped schema `dist/schemas/{name}.schema.json`.
fn check(name: &str, v: &Value) -> Result<(), String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist/schemas")
        .join(format!("{name}.schema.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let s: Value = serde_json::from_str(&text).unwrap();
    validate(&s, &s, v, "$")
}

/// The schemas accept what the VMM writes and refuse what it refuses.
#[test]
fn the_schemas_accept_real_messages_and_refuse_bad_ones() {
    let vm = handle(2);
    let stats = serde_json::to_value(fresh_stats(&vm)).unwrap();
    check("stats", &stats).unwrap();
    let mut bad = stats.clone();
    bad["vcpus"][0]["wall_ns"] = Value::from("soon");
    assert!(check("stats", &bad).is_err());
    let mut h = Handler::new(vm.clone(), 0);
    for line in [
        r#"{"id":1,"cmd":"version"}"#,
        r#"{"id":"x","cmd":"threads"}"#,
        r#"{"cmd":"vcpu","vcpu":9}"#,
        r#"{"cmd":"nope"}"#,
        r#"{"id":2,"cmd":"set-limit","group":"vm","limit":"150"}"#,
    ] {
        let resp: Value = serde_json::from_str(&h.handle_line(line.as_bytes()).line()).unwrap();
        check("response", &resp).unwrap_or_else(|e| panic!("{resp}: {e}"));
    }
    let threads: Value =
        serde_json::from_str(&h.handle_line(br#"{"cmd":"threads"}"#).line()).unwrap();
    check("threads", &threads["result"]).unwrap();
    for ok in [
        serde_json::json!({"id": 1, "cmd": "set-limit", "group": "vm", "limit": "50%"}),
        serde_json::json!({"cmd": "histogram", "name": "guest_run", "format": "text"}),
        serde_json::json!({"id": [1, {"a": null}], "cmd": "subscribe", "events": ["vm-exit"]}),
    ] {
        check("request", &ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in [
        serde_json::json!({"cmd": "set-limit", "group": "vm", "limit": 150}),
        serde_json::json!({"cmd": "frobnicate"}),
        serde_json::json!({"cmd": "vcpu"}),
        serde_json::json!({"cmd": "stats", "verbose": true}),
    ] {
        assert!(check("request", &bad).is_err(), "{bad}");
    }
    let cfg = serde_json::json!({"vcpus": 4, "workload": ["busy:ms=5"], "report": "json", "accounting": "full", "seccomp": "log"});
    check("config", &cfg).unwrap();
    assert!(RunOptions::from_json(&cfg.to_string()).is_ok());
    for bad in [
        serde_json::json!({"cpus": 4}),
        serde_json::json!({"report": "xml"}),
        serde_json::json!({"vcpus": -1}),
        serde_json::json!({"config": "other.json"}),
    ] {
        assert!(check("config", &bad).is_err(), "{bad}");
        assert!(RunOptions::from_json(&bad.to_string()).is_err(), "{bad}");
    }
}

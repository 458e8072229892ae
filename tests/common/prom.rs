//! Prometheus from the tests' side: a plain HTTP GET of an exposition, promtool's check, a
//! real Prometheus server (Debian package `prometheus`, installed by scripts/setup.sh) that
//! scrapes our endpoints and answers PromQL, and the Grafana dashboards' expressions read
//! out of their JSON so that each can be asked of that server.
//!
//! Data flow: a test starts an endpoint (`ppa-vmm run --metrics-addr` or `ppa-vmm host
//! serve`), reads it with [`get`], checks it with [`promtool_accepts`] and [`exported`], then
//! starts a [`Prometheus`] on it and asks each of [`queries`] until it returns data.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Kills a child process when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ppa-vmm host serve` on the VMs of `run_dir`, with both compat sets, its exposition on
/// 127.0.0.1:`port`; killed when dropped.
pub fn host_serve(run_dir: &Path, port: u16) -> Killed {
    Killed(
        Command::new(super::vmm::bin())
            .args(["host", "serve", "--compat", "kubevirt,libvirt", "--run-dir"])
            .arg(run_dir)
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{port}"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A TCP port free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over HTTP/1.0 (no chunked encoding); returns (status line, body), or None when the
/// endpoint is not up or the answer is not HTTP.
pub fn get(port: u16, target: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// GET /metrics until it answers: polled every 50 ms, given up after 600 attempts.
pub fn metrics_when_up(port: u16) -> (String, String) {
    (0..600)
        .find_map(|_| {
            let r = get(port, "/metrics");
            if r.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            r
        })
        .unwrap_or_else(|| panic!("/metrics on port {port} did not come up"))
}

/// Percent-encodes a query parameter value.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The sample names and the families' types (`# TYPE` lines) of an exposition text.
pub fn exported(text: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let mut names = BTreeSet::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut it = t.split(' ');
            types.insert(
                it.next().unwrap().to_string(),
                it.next().unwrap().to_string(),
            );
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap();
            names.insert(line[..end].to_string());
        }
    }
    (names, types)
}

/// The value of the first sample of `name` in `text`.
pub fn sample_value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Every PromQL expression of a dashboard: panel targets (`expr`) and variable queries.
fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// The metric names an expression uses, found loosely: identifiers starting `ppa_` or
/// `process_` outside string literals (label values, regexes).
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                // Skip the literal, escapes included.
                while let Some((_, d)) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let word = &expr[i..end];
                if word.starts_with("ppa_") || word.starts_with("process_") {
                    names.push(word.to_string());
                }
            }
            _ => {}
        }
    }
    names
}

/// A dashboard's expressions (its JSON text `dashboard`) with its variables replaced, as
/// PromQL: `vars` are (`$name`, value) pairs, `$__rate_interval` becomes 15s, and a variable's
/// `label_values(SELECTOR, LABEL)` becomes its selector. Sorted, without repeats.
pub fn queries(dashboard: &str, vars: &[(&str, &str)]) -> Vec<String> {
    let dash: Value = serde_json::from_str(dashboard).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    exprs.sort();
    exprs.dedup();
    exprs
        .into_iter()
        .map(|e| {
            let mut e = match e.strip_prefix("label_values(") {
                Some(args) => args[..args.rfind(',').unwrap_or(args.len())].to_string(),
                None => e,
            };
            e = e.replace("$__rate_interval", "15s");
            for (name, value) in vars {
                e = e.replace(name, value);
            }
            e
        })
        .collect()
}

/// Asserts that every metric `dashboard`'s expressions `exprs` use is in the exposition
/// `text`, and that a `_bucket` name is a histogram's.
pub fn assert_dashboard_uses_only_exported(dashboard: &str, exprs: &[String], text: &str) {
    let (names, types) = exported(text);
    for expr in exprs {
        for name in metric_names(expr) {
            assert!(
                names.contains(&name),
                "{dashboard} uses {name}, which /metrics does not export (in {expr})"
            );
            if let Some(family) = name.strip_suffix("_bucket") {
                assert_eq!(
                    types.get(family).map(String::as_str),
                    Some("histogram"),
                    "{name} in {expr}"
                );
            }
        }
    }
}

/// Asserts that `promtool check metrics` accepts `text` without a word.
pub fn promtool_accepts(text: &str) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is needed (Debian package prometheus; scripts/setup.sh installs it): {e}"
            )
        });
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = p.wait_with_output().unwrap();
    assert!(
        o.status.success() && o.stdout.is_empty() && o.stderr.is_empty(),
        "promtool: {o:?}\n{text}"
    );
}

/// A Prometheus server scraping some endpoints every second; killed when dropped.
pub struct Prometheus {
    _child: Killed,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus with its config and data in `dir`, scraping 127.0.0.1:PORT/metrics
    /// for each of `targets` as job `ppa`.
    pub fn start(dir: &Path, targets: &[u16]) -> Prometheus {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        let list: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ppa\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("the Prometheus server is needed (Debian package prometheus; scripts/setup.sh installs it): {e}")
            });
        Prometheus {
            _child: Killed(child),
            port,
        }
    }

    /// The answer of the instant query `q`, or None while the server is not up.
    pub fn query(&self, q: &str) -> Option<Value> {
        let (_, body) = get(self.port, &format!("/api/v1/query?query={}", url_encode(q)))?;
        serde_json::from_str::<Value>(&body).ok()
    }

    /// The result of `q` once `accept` takes it: polled every 250 ms, given up after 240
    /// attempts (Prometheus scrapes every second).
    pub fn result_when(&self, q: &str, accept: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut last = Value::Null;
        for _ in 0..240 {
            last = self.query(q).unwrap_or(Value::Null);
            if let Some(r) = last["data"]["result"].as_array().filter(|r| accept(r)) {
                return r.clone();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("Prometheus gave no acceptable result for {q}: {last}");
    }

    /// Asserts that every expression of `exprs` parses and returns data once rates have two
    /// scrapes: each polled every 500 ms, given up after 120 attempts.
    pub fn assert_each_returns_data(&self, dashboard: &str, exprs: &[String]) {
        for expr in exprs {
            let mut last = Value::Null;
            let found = (0..120).any(|_| {
                last = self.query(expr).unwrap_or(Value::Null);
                assert_ne!(last["status"], "error", "{expr}: {last}");
                let some = last["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty());
                if !some {
                    std::thread::sleep(Duration::from_millis(500));
                }
                some
            });
            assert!(found, "no data for {dashboard}'s {expr}: {last}");
        }
    }
}

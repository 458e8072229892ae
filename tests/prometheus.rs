//! A real Prometheus server (Debian package `prometheus`, installed by scripts/setup.sh)
//! scrapes a running VMM's /metrics endpoint: per-vCPU series come back from its query API,
//! every expression of the Grafana dashboard (docs/grafana-dashboard.json) names only metrics
//! the endpoint really exports and returns data, promtool accepts the live text, and a scrape
//! flood is served from the render cache.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The dashboard, as shipped.
const DASHBOARD: &str = include_str!("../docs/grafana-dashboard.json");

/// Kills a child process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over HTTP/1.0 (no chunked encoding); returns (status line, body).
fn get(port: u16, target: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// Percent-encodes a query parameter value.
fn url_encode(s: &str) -> String {
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
fn exported(text: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
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
fn sample_value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Every PromQL expression of the dashboard: panel targets (`expr`) and variable queries.
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
fn metric_names(expr: &str) -> Vec<String> {
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

/// The dashboard's expressions with its variables replaced for this run, as PromQL (a
/// variable's `label_values(SELECTOR, LABEL)` becomes its selector).
fn queries(vm: &str) -> Vec<String> {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    exprs.sort();
    exprs.dedup();
    exprs
        .into_iter()
        .map(|e| {
            let e = match e.strip_prefix("label_values(") {
                Some(args) => args[..args.rfind(',').unwrap_or(args.len())].to_string(),
                None => e,
            };
            e.replace("$__rate_interval", "15s")
                .replace("$vcpu", "0")
                .replace("$vm", vm)
        })
        .collect()
}

fn promtool_accepts(text: &str) {
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

#[test]
fn metric_names_are_found_in_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le, reason) (rate(ppa_vm_exit_handling_duration_seconds_bucket{vm="ppa_not_a_metric",x=~'process_no'}[5m])))"#
        ),
        ["ppa_vm_exit_handling_duration_seconds_bucket"]
    );
    assert_eq!(
        metric_names("rate(process_cpu_seconds_total[1m]) / ppa_vm_vcpus"),
        ["process_cpu_seconds_total", "ppa_vm_vcpus"]
    );
    assert!(metric_names("sum(rate(node_cpu_seconds_total[1m]))").is_empty());
    // The shipped dashboard queries something in each of its panels and variables.
    let q = queries("x");
    assert!(q.contains(&r#"ppa_vcpu_info{vm="x"}"#.to_string()), "{q:?}");
    assert!(q.len() >= 20, "{q:?}");
    assert!(q.iter().all(|e| !metric_names(e).is_empty()), "{q:?}");
}

#[test]
fn prometheus_scrapes_per_vcpu_series() {
    common::require_kvm();
    let _g = common::serial();
    let tmp = common::vmm::temp_dir("prometheus");
    let dir = tmp.as_path();
    let vmm_port = free_port();
    let _vmm = Killed(
        Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
            .args(["run", "--vcpus", "2", "--workload", "mixed:ms=60000"])
            .args([
                "--name",
                "prom-test",
                "--report",
                "none",
                "--max-runtime",
                "120",
                // A limit, so that the limit panels have data.
                "--cpu-limit",
                "150%",
            ])
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{vmm_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Our own endpoint first: status, content type, and content.
    // Polled every 50 ms, given up after 600 attempts.
    let (status, body) = (0..600)
        .find_map(|_| {
            let r = get(vmm_port, "/metrics");
            if r.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            r
        })
        .expect("/metrics did not come up");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        body.contains("ppa_vcpu_used_seconds_total{vm=\"prom-test\",vcpu=\"1\"}"),
        "{body}"
    );
    assert!(get(vmm_port, "/").unwrap().0.contains("404"));
    promtool_accepts(&body);

    // Every metric the dashboard uses is exported; a `_bucket` is a histogram's.
    let (names, types) = exported(&body);
    for expr in queries("prom-test") {
        for name in metric_names(&expr) {
            assert!(
                names.contains(&name),
                "the dashboard uses {name}, which /metrics does not export (in {expr})"
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

    // A flood of scrapes is served from the render cache: at most one render per 100 ms.
    let t0 = Instant::now();
    let (_, before) = get(vmm_port, "/metrics").unwrap();
    let renders0 = sample_value(&before, "ppa_metrics_renders_total").expect("renders");
    let served = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let (served, stop) = (Arc::clone(&served), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if get(vmm_port, "/metrics").is_some_and(|(s, _)| s.contains("200")) {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // At least 1 s and 200 scrapes (given up after 60 s), checked every 10 ms.
    while (t0.elapsed() < Duration::from_secs(1) || served.load(Ordering::Relaxed) < 200)
        && t0.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    flood.into_iter().for_each(|t| t.join().unwrap());
    let (_, after) = get(vmm_port, "/metrics").unwrap();
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let renders = sample_value(&after, "ppa_metrics_renders_total").unwrap() - renders0;
    let served = served.load(Ordering::Relaxed);
    // The texts compared were rendered within [t0 - 100 ms, now]; renders are 100 ms apart.
    assert!(
        renders <= (elapsed_ms + 100) / 100 + 1,
        "{renders} renders in {elapsed_ms} ms"
    );
    assert!(
        renders < served,
        "{renders} renders for {served} scrapes: the cache served none"
    );

    let prom_port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ppa\n    static_configs:\n      - targets: ['127.0.0.1:{vmm_port}']\n"
        ),
    )
    .unwrap();
    let _prom = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("the Prometheus server is needed (Debian package prometheus; scripts/setup.sh installs it): {e}")
            }),
    );
    let query = |q: &str| -> Option<Value> {
        let (_, body) = get(prom_port, &format!("/api/v1/query?query={}", url_encode(q)))?;
        serde_json::from_str::<Value>(&body).ok()
    };
    // Polled every 250 ms, given up after 240 attempts (Prometheus scrapes every second).
    let series = (0..240)
        .find_map(|_| {
            let result = query(r#"ppa_vcpu_used_seconds_total{vm="prom-test"}"#)
                .and_then(|v| v["data"]["result"].as_array().cloned())
                .filter(|r| r.len() == 2);
            if result.is_none() {
                std::thread::sleep(Duration::from_millis(250));
            }
            result
        })
        .expect("Prometheus did not return two per-vCPU series");
    let mut vcpus: Vec<String> = series
        .iter()
        .map(|s| s["metric"]["vcpu"].as_str().unwrap().to_string())
        .collect();
    vcpus.sort();
    assert_eq!(vcpus, ["0", "1"]);
    for s in &series {
        assert_eq!(s["metric"]["job"], "ppa");
        let used: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(used > 0.0, "a vCPU that ran has used time: {s}");
    }

    // Every dashboard expression parses and returns data once rates have two scrapes.
    // Polled every 500 ms, given up after 120 attempts.
    for expr in queries("prom-test") {
        let mut last = Value::Null;
        let found = (0..120).any(|_| {
            last = query(&expr).unwrap_or(Value::Null);
            assert_ne!(last["status"], "error", "{expr}: {last}");
            let some = last["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty());
            if !some {
                std::thread::sleep(Duration::from_millis(500));
            }
            some
        });
        assert!(found, "no data for the dashboard's {expr}: {last}");
    }
}

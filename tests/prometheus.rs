//! A real Prometheus server (Debian package `prometheus`, installed by .ci/run) scrapes a
//! running VMM's /metrics endpoint and returns a per-vCPU series from its query API.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

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
                "90",
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
                panic!("the Prometheus server is needed (Debian package prometheus; .ci/run installs it): {e}")
            }),
    );
    let query = "/api/v1/query?query=ppa_vcpu_used_seconds_total%7Bvm%3D%22prom-test%22%7D";
    // Polled every 250 ms, given up after 240 attempts (Prometheus scrapes every second).
    let series = (0..240)
        .find_map(|_| {
            let result = get(prom_port, query)
                .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
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
}

//! A real Prometheus server (Debian package `prometheus`, installed by scripts/setup.sh)
//! scrapes a running VMM's /metrics endpoint: per-vCPU series come back from its query API,
//! every expression of the Grafana dashboard (docs/grafana-dashboard.json) names only metrics
//! the endpoint really exports and returns data, promtool accepts the live text, and a scrape
//! flood is served from the render cache. The same for `ppa-vmm host serve` over two VMs of
//! a run directory: series for each VM under its `vm` label, the `--compat` families, and
//! every expression of the host board (docs/grafana-host-dashboard.json) returning data.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::prom::{self, get, metric_names, promtool_accepts, sample_value, Killed, Prometheus};
use common::vmm::{bin, connect_when_up, temp_dir};

/// The single-VM dashboard, as shipped.
const DASHBOARD: &str = include_str!("../docs/grafana-dashboard.json");
/// The host board, as shipped.
const HOST_DASHBOARD: &str = include_str!("../docs/grafana-host-dashboard.json");

/// The single-VM dashboard's expressions for VM `vm`, its vCPU 0.
fn queries(vm: &str) -> Vec<String> {
    prom::queries(DASHBOARD, &[("$vcpu", "0"), ("$vm", vm)])
}

/// The host board's expressions with its `$vm` multi-select set to `vms` (as Grafana writes a
/// multi-value regex, `a|b`).
fn host_queries(vms: &str) -> Vec<String> {
    prom::queries(HOST_DASHBOARD, &[("$vm", vms)])
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
fn the_host_board_shows_every_vm_its_pressure_device_cpu_and_host_totals() {
    let q = host_queries("a|b");
    assert!(q.contains(&"ppa_vm_info".to_string()), "{q:?}");
    assert!(q.iter().all(|e| !metric_names(e).is_empty()), "{q:?}");
    let used: Vec<String> = q.iter().flat_map(|e| metric_names(e)).collect();
    for family in [
        // esxtop's columns per VM.
        "ppa_vcpu_used_seconds_total",
        "ppa_vcpu_guest_seconds_total",
        "ppa_vcpu_steal_seconds_total",
        "ppa_vcpu_limited_seconds_total",
        "ppa_vcpu_halted_seconds_total",
        "ppa_vcpu_idle_seconds_total",
        // Pressure.
        "ppa_vm_pressure_some_seconds_total",
        "ppa_vm_pressure_full_seconds_total",
        "ppa_vm_pressure_avg_ratio",
        // Device and service threads.
        "ppa_vm_host_cpu_seconds_total",
        "ppa_vmm_thread_cpu_seconds_total",
        // Host totals.
        "ppa_host_vms",
        "ppa_host_vm_up",
        "ppa_host_vcpus",
        "ppa_host_vcpu_used_seconds",
        "ppa_host_scrape_duration_seconds",
    ] {
        assert!(
            used.iter().any(|u| u == family),
            "{family} not on the board"
        );
    }
    // Every per-VM breakdown follows the $vm selection.
    for e in q.iter().filter(|e| e.contains("by (vm")) {
        assert!(e.contains(r#"vm=~"a|b""#), "{e}");
    }
}

#[test]
fn prometheus_scrapes_per_vcpu_series() {
    common::require_kvm();
    let _g = common::serial();
    let tmp = common::vmm::temp_dir("prometheus");
    let dir = tmp.as_path();
    // The VM's name is registered in a run directory of the test's own, not the host's.
    let run_dir = dir.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let vmm_port = prom::free_port();
    let _vmm = Killed(
        Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
            .args(["run", "--vcpus", "2", "--workload", "mixed:ms=60000"])
            .arg("--run-dir")
            .arg(&run_dir)
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
    // Our own endpoint first: status, content type, and content. The guest's families come
    // with its first publication into the PPA page, which can follow the endpoint's start
    // (CI, on a loaded host, scraped before it once): wait for it, 10 s at most.
    let (mut status, mut body) = prom::metrics_when_up(vmm_port);
    let waited = Instant::now();
    while !body.contains("ppa_guest_thread_cpu_seconds_total{")
        && waited.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
        (status, body) = prom::metrics_when_up(vmm_port);
    }
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        body.contains("ppa_vcpu_used_seconds_total{vm=\"prom-test\",vcpu=\"1\"}"),
        "{body}"
    );
    assert!(get(vmm_port, "/").unwrap().0.contains("404"));
    promtool_accepts(&body);

    // Every metric the dashboard uses is exported; a `_bucket` is a histogram's.
    prom::assert_dashboard_uses_only_exported(
        "docs/grafana-dashboard.json",
        &queries("prom-test"),
        &body,
    );

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

    let prometheus = Prometheus::start(dir, &[vmm_port]);
    let series = prometheus.result_when(r#"ppa_vcpu_used_seconds_total{vm="prom-test"}"#, |r| {
        r.len() == 2
    });
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
    prometheus.assert_each_returns_data("docs/grafana-dashboard.json", &queries("prom-test"));
}

/// A tiny VM named `name` registered in the run directory `dir`, its socket up.
fn start_in(dir: &std::path::Path, name: &str, args: &[&str]) -> Killed {
    let child = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--memory-mib",
            "16",
            "--prefault",
            "false",
        ])
        .args(["--report", "none", "--max-runtime", "60", "--name", name])
        .args(args)
        .arg("--run-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let vm = Killed(child);
    drop(connect_when_up(&dir.join(format!("{name}.sock"))));
    vm
}

/// The sorted (label `by`, label `id`) pairs of an instant query's result.
fn label_pairs(result: &[serde_json::Value], by: &str, id: &str) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = result
        .iter()
        .map(|s| {
            let l = |k: &str| s["metric"][k].as_str().unwrap_or("").to_string();
            (l(by), l(id))
        })
        .collect();
    pairs.sort();
    pairs
}

#[test]
fn prometheus_scrapes_every_vm_of_host_serve() {
    common::require_kvm();
    let _g = common::serial();
    let tmp = temp_dir("host-prometheus");
    let run = tmp.as_path().join("run");
    std::fs::create_dir(&run).unwrap();
    // a: two busy vCPUs held to half a CPU (steal, limited time, full pressure); b: one mixed.
    let _a = start_in(
        &run,
        "a",
        &[
            "--vcpus",
            "2",
            "--workload",
            "busy:ms=60000",
            "--cpu-limit",
            "50%",
        ],
    );
    let _b = start_in(&run, "b", &["--vcpus", "1", "--workload", "mixed:ms=60000"]);
    let port = prom::free_port();
    let _serve = prom::host_serve(&run, port);
    let (status, text) = prom::metrics_when_up(port);
    assert_eq!(status, "HTTP/1.1 200 OK");
    promtool_accepts(&text);
    for (vm, vcpu) in [("a", 0), ("a", 1), ("b", 0)] {
        let series = format!("ppa_vcpu_used_seconds_total{{vm=\"{vm}\",vcpu=\"{vcpu}\"}} ");
        assert!(text.contains(&series), "{series} missing:\n{text}");
    }
    assert!(text.contains("ppa_host_vms 2\n"), "{text}");
    prom::assert_dashboard_uses_only_exported(
        "docs/grafana-host-dashboard.json",
        &host_queries("a|b"),
        &text,
    );

    let prometheus = Prometheus::start(tmp.as_path(), &[port]);
    let vcpus: [(String, String); 3] =
        [("a", "0"), ("a", "1"), ("b", "0")].map(|(v, i)| (v.into(), i.into()));
    let used = prometheus.result_when("ppa_vcpu_used_seconds_total", |r| r.len() == 3);
    assert_eq!(label_pairs(&used, "vm", "vcpu"), vcpus);
    for s in &used {
        assert_eq!(s["metric"]["job"], "ppa");
        let v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(v > 0.0, "a vCPU that ran has used time: {s}");
    }
    // The compat families, one series per vCPU, under their own tools' labels.
    for (family, by, id) in [
        ("kubevirt_vmi_vcpu_seconds_total", "name", "id"),
        ("kubevirt_vmi_vcpu_delay_seconds_total", "name", "id"),
        ("libvirt_domain_vcpu_time_seconds_total", "domain", "vcpu"),
        ("libvirt_domain_vcpu_delay_seconds_total", "domain", "vcpu"),
    ] {
        let r = prometheus.result_when(family, |r| r.len() == 3);
        assert_eq!(label_pairs(&r, by, id), vcpus, "{family}");
    }
    // a's limit stalls both its busy vCPUs at once: full pressure accrues.
    prometheus.result_when(r#"ppa_vm_pressure_full_seconds_total{vm="a"} > 0"#, |r| {
        r.len() == 1
    });
    prometheus.assert_each_returns_data("docs/grafana-host-dashboard.json", &host_queries("a|b"));
}

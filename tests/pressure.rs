//! VM pressure on real runs (docs/accounting.md, "Pressure"): busy vCPUs that outnumber the
//! host's CPUs stall `some` nearly all the time, a capped vCPU stalls `full` for the part of
//! its time the limit holds it, an idle VM hardly at all, and a trigger fires once per window
//! while a stall lasts and never while idle. Run one at a time (`common::serial`): the figures
//! are about contention, and another test's load would be part of it.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use std::io::{BufRead, BufReader, Write};

use common::vmm::{bin, connect_when_up, temp_dir};
use ppa_vmm::config::RunOptions;
use ppa_vmm::vm::Vm;
use ppa_vmm_api::PressureReport;
use serde_json::{json, Value};

fn run(opts: RunOptions) -> ppa_vmm::vm::RunOutcome {
    common::require_kvm();
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

fn pressure(out: &ppa_vmm::vm::RunOutcome) -> PressureReport {
    out.report
        .vm
        .pressure
        .clone()
        .expect("the report has pressure")
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn busy_vcpus_that_outnumber_the_host_cpus_stall_some_nearly_all_the_time() {
    let _one = common::serial();
    let vcpus = (2 * host_cpus()).min(16);
    let out = run(RunOptions {
        vcpus: Some(vcpus),
        workload: vec!["busy:ms=21000".into()],
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let uptime_us = out.report.vm.uptime_ns / 1000;
    let some = p.vm.some.total_us as f64 / uptime_us as f64;
    assert!(some >= 0.9, "some {some:.3} of {uptime_us} us: {p:?}");
    assert!(p.vm.some.avg10 >= 75.0, "{p:?}");
    // Between the bounds the vCPUs' own stalls set.
    let stalls: Vec<u64> = out
        .report
        .vcpus
        .iter()
        .map(|v| (v.times.steal_ns + v.times.limited_ns) / 1000)
        .collect();
    let max = *stalls.iter().max().unwrap();
    let tick = 8_000 * 2;
    assert!(p.vm.some.total_us + tick >= max, "{p:?} vs {stalls:?}");
    assert!(p.vm.full.total_us <= *stalls.iter().min().unwrap() + tick);
}

#[test]
fn a_capped_busy_vcpu_is_fully_stalled_while_its_limit_holds_it() {
    let _one = common::serial();
    let out = run(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=1000".into()],
        cpu_limit: Some("25%".into()),
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let v = &out.report.vcpus[0].times;
    let wall_us = v.wall_ns / 1000;
    let full = p.vm.full.total_us as f64 / wall_us as f64;
    assert!((0.70..=0.80).contains(&full), "full {full:.3}: {p:?}");
    // One vCPU: some and full are its steal and limited time, less the first tick (the
    // tracker's base) and the part after the last one.
    assert_eq!(p.vm.some.total_us, p.vm.full.total_us);
    let stalled_us = (v.steal_ns + v.limited_ns) / 1000;
    let diff = stalled_us.abs_diff(p.vm.some.total_us);
    assert!(diff <= 30_000 + wall_us / 50, "{stalled_us} vs {p:?}");
}

#[test]
fn an_idle_vm_hardly_stalls() {
    let _one = common::serial();
    let out = run(RunOptions {
        vcpus: Some(2),
        workload: vec!["idle:ms=3000,publish=off".into()],
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let uptime_us = out.report.vm.uptime_ns / 1000;
    let some = p.vm.some.total_us as f64 / uptime_us as f64;
    // What stall there is, is the vCPUs' own: the run-queue wait of their wake-ups (every
    // 10 ms), which a loaded host makes long. On a quiet host that is well under 1 %.
    let steal_us: u64 = out
        .report
        .vcpus
        .iter()
        .map(|v| v.times.steal_ns / 1000)
        .sum();
    assert!(
        p.vm.some.total_us <= steal_us + 16_000,
        "{p:?} vs steal {steal_us} us"
    );
    let quiet = (steal_us as f64) < 0.005 * uptime_us as f64;
    assert!(
        !quiet || some < 0.01,
        "some {some:.4} with steal {steal_us} us: {p:?}"
    );
}

/// Starts a VM with a socket, subscribes a `some` trigger of 100 ms in 1 s, and collects its
/// events for `secs`.
fn trigger_events(args: &[&str], secs: u64) -> Vec<Value> {
    common::require_kvm();
    let d = temp_dir("pressure-trigger");
    let sock = d.as_path().join("api.sock");
    let mut child = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--report",
            "none",
            "--max-runtime",
            "60",
        ])
        .arg("--api-sock")
        .arg(&sock)
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut s = connect_when_up(&sock);
    let req = json!({"id": 1, "cmd": "subscribe", "events": ["pressure"],
        "pressure": {"kind": "some", "threshold_us": 100_000, "window_us": 1_000_000}});
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut r = BufReader::new(s);
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    let mut events = Vec::new();
    let mut line = String::new();
    while std::time::Instant::now() < until {
        match r.read_line(&mut line) {
            Ok(n) if n > 0 && line.ends_with('\n') => {
                let v: Value = serde_json::from_str(&line).unwrap();
                if v.get("event").is_some() {
                    events.push(v);
                } else {
                    assert_eq!(v["ok"], json!(true), "{v}");
                }
                line.clear();
            }
            _ => continue,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    events
}

#[test]
fn a_trigger_fires_once_per_window_while_the_stall_lasts_and_never_while_idle() {
    let _one = common::serial();
    // A busy vCPU held to 25 %: stalled 75 % of every window of 1 s.
    let events = trigger_events(&["--workload", "busy:ms=30000", "--cpu-limit", "25%"], 4);
    assert!((3..=5).contains(&events.len()), "{events:?}");
    let at: Vec<u64> = events
        .iter()
        .map(|e| e["uptime_ns"].as_u64().unwrap())
        .collect();
    for w in at.windows(2) {
        assert!(w[1] - w[0] >= 990_000_000, "at most one per window: {at:?}");
    }
    for e in &events {
        assert_eq!(
            (e["event"].as_str(), e["kind"].as_str()),
            (Some("pressure"), Some("some"))
        );
        assert!(e["stall_us"].as_u64().unwrap() > 100_000, "{e}");
    }
    // An idle VM: none.
    let events = trigger_events(&["--workload", "idle:ms=30000"], 3);
    assert!(events.is_empty(), "{events:?}");
}

//! Unit tests of every command on synthetic vCPUs (no KVM).

use super::*;
use crate::api::tests_support::handle;
use ppa_vmm_api::{HistogramJson, Level, Thresholds, VcpuTimes};
use serde_json::json;

fn call(h: &mut Handler, line: &str) -> Response {
    let r = h.handle_line(line.as_bytes()).line();
    assert!(r.ends_with('\n'), "one line: {r}");
    assert_eq!(r.matches('\n').count(), 1, "one line: {r}");
    serde_json::from_str(&r).unwrap_or_else(|e| panic!("{r}: {e}"))
}

fn ok(h: &mut Handler, line: &str) -> Value {
    let r = call(h, line);
    assert!(r.ok, "{line}: {r:?}");
    r.result.unwrap()
}

fn err(h: &mut Handler, line: &str) -> ErrorKind {
    let r = call(h, line);
    assert!(!r.ok, "{line} should fail: {r:?}");
    r.error.unwrap().kind
}

#[test]
fn version_and_ids() {
    let mut h = Handler::new(handle(1), 0);
    let r = call(&mut h, r#"{"id":"x-1","cmd":"version"}"#);
    assert_eq!(r.id, json!("x-1"));
    let v: VersionInfo = serde_json::from_value(r.result.unwrap()).unwrap();
    assert_eq!(v.api, ppa_vmm_api::API_VERSION);
    let (major, minor) = v.guest_abi.split_once('.').expect("major.minor");
    assert_eq!(
        major.parse::<u32>().unwrap(),
        ppa_guest_abi::BOOT_INFO_VERSION >> 16
    );
    assert_eq!(
        minor.parse::<u32>().unwrap(),
        ppa_guest_abi::BOOT_INFO_VERSION & 0xffff
    );
    assert_eq!(
        v.guest_abi, "1.5",
        "docs/control.md and docs/abi.md quote this version"
    );
}

#[test]
fn a_smuggled_second_cmd_does_nothing() {
    let mut h = Handler::new(handle(1), 0);
    let r = call(&mut h, r#"{"id":1,"cmd":"version","cmd":"shutdown"}"#);
    assert!(!r.ok, "{r:?}");
    assert_eq!(r.error.unwrap().kind, ErrorKind::BadRequest);
    assert_eq!(r.id, json!(1));
    assert!(!h.vm().shutdown_requested(), "the VM was not shut down");
}

#[test]
fn ids_are_echoed_as_written() {
    let mut h = Handler::new(handle(1), 0);
    for id in ["12345678901234567890123", "1.0", "1e2", r#""a\"b""#] {
        // `stats` has its own encoder; `version` and a failure take the common one.
        for rest in [
            r#""cmd":"stats""#,
            r#""cmd":"version""#,
            r#""cmd":"vcpu","vcpu":9"#,
        ] {
            let line = format!("{{\"id\":{id},{rest}}}");
            let r = h.handle_line(line.as_bytes()).line();
            assert!(r.starts_with(&format!("{{\"id\":{id},")), "{line} -> {r}");
        }
    }
}

#[test]
fn stats_parse_as_the_client_types() {
    let mut h = Handler::new(handle(3), 0);
    let r = call(&mut h, r#"{"id":7,"cmd":"stats"}"#);
    assert_eq!(r.id, json!(7));
    let s: Stats = serde_json::from_value(r.result.unwrap()).unwrap();
    assert_eq!(s.vcpus.len(), 3);
    assert_eq!(s.vm.vcpus, 3);
    assert_eq!(s.vm.state, VmState::Created);
    assert_eq!(s.vm.name, "test \"vm\"");
    assert_eq!(
        s.vcpus.iter().map(|v| v.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let one: VcpuTimes = serde_json::from_value(ok(&mut h, r#"{"cmd":"vcpu","vcpu":2}"#)).unwrap();
    assert_eq!(one.id, 2);
}

#[test]
fn stats_snapshot_is_reused_only_within_its_age() {
    let mut h = Handler::new(handle(1), 60_000_000_000);
    let a = ok(&mut h, r#"{"cmd":"stats"}"#);
    let b = ok(&mut h, r#"{"cmd":"stats"}"#);
    assert_eq!(a, b, "within the maximum age the snapshot is reused");
    // A command that changes what stats shows drops the snapshot.
    ok(&mut h, r#"{"cmd":"set-level","level":"full"}"#);
    let c: Stats = serde_json::from_value(ok(&mut h, r#"{"cmd":"stats"}"#)).unwrap();
    assert_eq!(c.vm.level, Level::Full);
}

#[test]
fn missing_vcpus_and_histograms_are_errors() {
    let mut h = Handler::new(handle(2), 0);
    assert_eq!(
        err(&mut h, r#"{"cmd":"vcpu","vcpu":2}"#),
        ErrorKind::NoSuchVcpu
    );
    assert_eq!(
        err(&mut h, r#"{"cmd":"reset","vcpu":9}"#),
        ErrorKind::NoSuchVcpu
    );
    assert_eq!(
        err(&mut h, r#"{"cmd":"histogram","name":"guest_run","vcpu":5}"#),
        ErrorKind::NoSuchVcpu
    );
    assert_eq!(
        err(&mut h, r#"{"cmd":"histogram","name":"latency"}"#),
        ErrorKind::NoSuchHistogram
    );
    assert_eq!(err(&mut h, r#"{"cmd":"nope"}"#), ErrorKind::UnknownCommand);
    assert_eq!(err(&mut h, "not json"), ErrorKind::BadJson);
}

#[test]
fn histograms_in_both_forms() {
    let vm = handle(2);
    // Give vCPU 1 three guest runs.
    for v in [100u64, 1000, 10_000] {
        vm.vcpus()[1].acct.meter.hist.guest_run.record(v);
    }
    let mut h = Handler::new(vm, 0);
    let r = ok(&mut h, r#"{"cmd":"histogram","name":"guest_run"}"#);
    assert_eq!(r["name"], json!("guest_run"));
    let hist: HistogramJson = serde_json::from_value(r["histogram"].clone()).unwrap();
    assert_eq!(hist.count, 3);
    assert_eq!(hist.sum, 11_100);
    let r = ok(&mut h, r#"{"cmd":"histogram","name":"guest_run","vcpu":0}"#);
    assert_eq!(r["histogram"]["count"], json!(0));
    let text = ok(
        &mut h,
        r#"{"cmd":"histogram","name":"guest_run","format":"text"}"#,
    );
    let text = text.as_str().unwrap();
    assert!(text.starts_with("# histogram guest_run"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(" vcpu 1 ")).count(),
        3,
        "{text}"
    );
}

#[test]
fn settings_change_and_report_the_new_values() {
    let vm = handle(1);
    let mut h = Handler::new(vm.clone(), 0);
    let r = ok(&mut h, r#"{"cmd":"set-level","level":"off"}"#);
    assert_eq!(r, json!({"level": "off", "previous": "basic"}));
    assert_eq!(vm.level(), Level::Off);
    let r = ok(&mut h, r#"{"cmd":"set-thresholds","guest_run_ns":5000}"#);
    let t: Thresholds = serde_json::from_value(r).unwrap();
    assert_eq!(t.guest_run_ns, 5000);
    ok(&mut h, r#"{"cmd":"set-thresholds","steal_window_ns":7}"#);
    let t = vm.thresholds();
    assert_eq!(
        (t.guest_run_ns, t.steal_window_ns),
        (5000, 7),
        "partial update"
    );
    // A bad request leaves the settings alone.
    assert_eq!(
        err(&mut h, r#"{"cmd":"set-thresholds","guest_run_ns":-1}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(vm.thresholds().guest_run_ns, 5000);
}

#[test]
fn pause_resume_shutdown_and_threads() {
    let vm = handle(2);
    let mut h = Handler::new(vm.clone(), 0);
    ok(&mut h, r#"{"cmd":"pause"}"#);
    assert!(vm.paused());
    ok(&mut h, r#"{"cmd":"resume"}"#);
    assert!(!vm.paused());
    let t: ppa_vmm_api::Threads =
        serde_json::from_value(ok(&mut h, r#"{"cmd":"threads"}"#)).unwrap();
    assert_eq!(t.vcpus.len(), 2);
    assert_eq!(t.vcpus[1].name, "vcpu1");
    assert_eq!(t.pid, std::process::id());
    ok(&mut h, r#"{"cmd":"shutdown"}"#);
    assert!(vm.shutdown_requested());
    assert_eq!(vm.state(), VmState::Stopping);
    assert_eq!(err(&mut h, r#"{"cmd":"pause"}"#), ErrorKind::InvalidState);
    assert_eq!(err(&mut h, r#"{"cmd":"resume"}"#), ErrorKind::InvalidState);
}

#[test]
fn reset_and_subscribe() {
    let mut h = Handler::new(handle(2), 0);
    assert_eq!(ok(&mut h, r#"{"cmd":"reset"}"#), json!({"reset": "all"}));
    assert_eq!(
        ok(&mut h, r#"{"cmd":"reset","vcpu":1}"#),
        json!({"reset": 1})
    );
    match h.handle_line(br#"{"id":1,"cmd":"subscribe","events":["vm-exit"]}"#) {
        Outcome::Subscribe(line, mask, None) => {
            assert_eq!(mask, kind_bit(EventKind::VmExit));
            assert!(line.contains("\"vm-exit\""), "{line}");
        }
        o => panic!("{o:?}"),
    }
    match h.handle_line(br#"{"cmd":"subscribe"}"#) {
        Outcome::Subscribe(_, mask, None) => {
            assert_eq!(
                mask,
                EventKind::ALL
                    .iter()
                    .map(|&k| kind_bit(k))
                    .fold(0, |a, b| a | b),
                "every kind that needs no argument by default"
            );
            assert_eq!(mask.count_ones(), 7);
            assert_ne!(mask & kind_bit(EventKind::GuestAlarm), 0);
            assert_eq!(mask & kind_bit(EventKind::Pressure), 0);
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn pressure_and_its_triggers() {
    let mut h = Handler::new(handle(2), 0);
    let p = ok(&mut h, r#"{"cmd":"pressure"}"#);
    assert_eq!(p["vm"]["some"]["total_us"], json!(0), "{p}");
    assert!(p["groups"].as_array().unwrap().is_empty());
    let t = r#""pressure":{"kind":"some","threshold_us":100000,"window_us":1000000}"#;
    // A trigger alone subscribes to `pressure`.
    match h.handle_line(format!(r#"{{"cmd":"subscribe",{t}}}"#).as_bytes()) {
        Outcome::Subscribe(line, mask, Some(trigger)) => {
            assert_ne!(mask & kind_bit(EventKind::Pressure), 0);
            assert_eq!(trigger.threshold_us, 100_000);
            assert!(line.contains("\"pressure\""), "{line}");
        }
        o => panic!("{o:?}"),
    }
    match h.handle_line(format!(r#"{{"cmd":"subscribe","events":["pressure"],{t}}}"#).as_bytes()) {
        Outcome::Subscribe(_, mask, Some(_)) => assert_eq!(mask, kind_bit(EventKind::Pressure)),
        o => panic!("{o:?}"),
    }
    // Bad values and a `pressure` subscription without a trigger: errors, no stream.
    for bad in [
        r#"{"cmd":"subscribe","events":["pressure"]}"#,
        r#"{"cmd":"subscribe","pressure":{"kind":"some","threshold_us":100,"window_us":100}}"#,
        r#"{"cmd":"subscribe","pressure":{"kind":"full","threshold_us":0,"window_us":600000}}"#,
        r#"{"cmd":"subscribe","pressure":{"kind":"full","threshold_us":700000,"window_us":600000}}"#,
        r#"{"cmd":"subscribe","pressure":{"kind":"full","threshold_us":1,"window_us":600000,"x":1}}"#,
    ] {
        match h.handle_line(bad.as_bytes()) {
            Outcome::Reply(line) => {
                assert!(line.contains("\"bad-request\""), "{bad}: {line}")
            }
            o => panic!("{bad}: {o:?}"),
        }
    }
}

#[test]
fn metrics_come_from_the_same_figures() {
    let mut h = Handler::new(handle(2), 0);
    let text = ok(&mut h, r#"{"cmd":"metrics"}"#);
    let text = text.as_str().unwrap();
    assert!(text.contains("vcpu=\"1\""), "{text}");
}

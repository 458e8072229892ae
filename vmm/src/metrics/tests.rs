//! Unit tests of the rendering, checked by promtool.

use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use ppa_vmm_api::{
    Level, LimitBackend, SplitKind, Threshold, Thresholds, VcpuMicroState, VmState, VmStats,
};

/// A VM name that needs every escape.
const VM_NAME: &str = "we\"ird\\vm\nname";
const VM_LABEL: &str = r#"vm="we\"ird\\vm\nname""#;

fn vcpu(id: usize, kvm_ns: Option<u64>, kvm_estimate: Option<u64>) -> VcpuTimes {
    let map = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    VcpuTimes {
        id,
        host_tid: 1000 + id as i32,
        wall_ns: 3_000_000_000 + id as u64,
        used_ns: 1_500_000_000,
        guest_ns: 1_200_000_000,
        kvm_ns,
        kvm_ns_estimate: kvm_estimate,
        guest_code_ns_estimate: kvm_estimate.map(|k| 1_200_000_000 - k),
        parks: 7,
        vmm_ns: 300_000_000,
        steal_ns: 250_000_001,
        halted_ns: 0,
        idle_ns: 1_000_000_000,
        limited_ns: 0,
        paused_ns: 250_000_000,
        split: SplitKind::Estimated,
        identity_error_ns: if id == 0 { -150_000 } else { 1 },
        state: VcpuMicroState::Guest,
        exits: map(&[("hlt", 3), ("io_out", 42)]),
        exit_ns: map(&[("hlt", 12_000), ("io_out", 999_999_999)]),
        kvm_stats: if id == 0 {
            map(&[("exits", 380), ("halt_exits", 2)])
        } else {
            BTreeMap::new()
        },
        host_cpus: Vec::new(),
        migrations: 5,
        thresholds: Threshold::ALL
            .iter()
            .map(|t| (t.to_string(), t.index() as u64))
            .collect(),
        kvm_run_wall_ns: 1_300_000_000,
        park_cpu_ns: 20_000,
        proc_ticks: None,
        overloads: 0,
    }
}

fn stats() -> Detailed {
    Detailed {
        vm: VmStats {
            name: VM_NAME.into(),
            pid: 4242,
            state: VmState::Running,
            vcpus: 2,
            uptime_ns: 3 * 86_400_000_000_000 + 123_456_789,
            level: Level::Basic,
            thresholds: Thresholds {
                exit_handling_ns: 50_000,
                ..Thresholds::default()
            },
            host_threads_ns: 42_000_000,
        },
        vcpus: vec![vcpu(0, None, Some(7_000_000)), vcpu(1, Some(3), None)],
        groups: Vec::new(),
    }
}

/// One parsed sample line.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Parses `name{l="v",...} value`, unescaping label values; panics on malformed text.
fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).expect("sample without a value");
    let name = line[..name_end].to_string();
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
        "bad metric name in {line:?}"
    );
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find("=\"").expect("label without =\"");
            let key = rest[..eq].to_string();
            let mut value = String::new();
            let mut chars = rest[eq + 2..].char_indices();
            let end = loop {
                match chars.next().expect("unterminated label value") {
                    (i, '"') => break eq + 2 + i + 1,
                    (_, '\\') => match chars.next().expect("dangling backslash").1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        c => panic!("bad escape \\{c} in {line:?}"),
                    },
                    (_, '\n') => panic!("raw newline in {line:?}"),
                    (_, c) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = &rest[end..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value_text = rest.strip_prefix(' ').expect("no space before the value");
    let value = value_text
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("value {value_text:?} of {line:?}: {e}"));
    Sample {
        name,
        labels,
        value,
    }
}

#[test]
fn seconds_are_exact_decimals() {
    assert_eq!(seconds(0), "0");
    assert_eq!(seconds(1_500_000_000), "1.5");
    assert_eq!(seconds(1), "0.000000001");
    assert_eq!(seconds(2_000_000_000), "2");
    // Three days and a nanosecond: every digit survives.
    assert_eq!(seconds(259_200_000_000_001), "259200.000000001");
    assert_eq!(seconds(u64::MAX), "18446744073.709551615");
    assert_eq!(seconds_signed(-150_000), "-0.00015");
    assert_eq!(seconds_signed(i64::MIN), "-9223372036.854775808");
    assert_eq!(seconds_signed(0), "0");
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape_label_value("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    assert_eq!(
        label_set(&[("vm", VM_NAME), ("vcpu", "0")]),
        format!("{{{VM_LABEL},vcpu=\"0\"}}")
    );
    assert_eq!(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
}

#[test]
fn specific_lines() {
    let text = render(&stats());
    let version = env!("CARGO_PKG_VERSION");
    let expect = [
        format!(
            "ppa_vm_info{{{VM_LABEL},version=\"{version}\",level=\"basic\",state=\"running\"}} 1"
        ),
        format!("ppa_vm_uptime_seconds{{{VM_LABEL}}} 259200.123456789"),
        format!("ppa_vm_vcpus{{{VM_LABEL}}} 2"),
        format!("ppa_vm_host_threads_seconds_total{{{VM_LABEL}}} 0.042"),
        format!("ppa_vm_threshold_seconds{{{VM_LABEL},threshold=\"exit_handling_ns\"}} 0.00005"),
        format!("ppa_vm_threshold_seconds{{{VM_LABEL},threshold=\"guest_run_ns\"}} 0"),
        format!("ppa_vcpu_info{{{VM_LABEL},vcpu=\"1\",state=\"guest\",split=\"estimated\"}} 1"),
        format!("ppa_vcpu_wall_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 3.000000001"),
        format!("ppa_vcpu_used_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 1.5"),
        format!("ppa_vcpu_guest_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 1.2"),
        format!("ppa_vcpu_vmm_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 0.3"),
        format!("ppa_vcpu_steal_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 0.250000001"),
        format!("ppa_vcpu_halted_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 0"),
        format!("ppa_vcpu_idle_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 1"),
        format!("ppa_vcpu_limited_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 0"),
        format!("ppa_vcpu_paused_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 0.25"),
        format!("ppa_vcpu_kvm_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 0.000000003"),
        format!("ppa_vcpu_kvm_estimated_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 0.007"),
        format!("ppa_vcpu_guest_code_estimated_seconds_total{{{VM_LABEL},vcpu=\"0\"}} 1.193"),
        format!("ppa_vcpu_exits_total{{{VM_LABEL},vcpu=\"0\",reason=\"io_out\"}} 42"),
        format!(
            "ppa_vcpu_exit_handling_seconds_total{{{VM_LABEL},vcpu=\"1\",reason=\"io_out\"}} 0.999999999"
        ),
        format!("ppa_vcpu_kvm_exits_total{{{VM_LABEL},vcpu=\"0\"}} 380"),
        format!("ppa_vcpu_migrations_total{{{VM_LABEL},vcpu=\"0\"}} 5"),
        format!("ppa_vcpu_parks_total{{{VM_LABEL},vcpu=\"1\"}} 7"),
        format!(
            "ppa_vcpu_threshold_exceeded_total{{{VM_LABEL},vcpu=\"0\",threshold=\"steal_window_ns\"}} 3"
        ),
        format!("ppa_vcpu_identity_error_seconds{{{VM_LABEL},vcpu=\"0\"}} -0.00015"),
        format!("ppa_vcpu_identity_error_seconds{{{VM_LABEL},vcpu=\"1\"}} 0.000000001"),
    ];
    let lines: BTreeSet<&str> = text.lines().collect();
    for e in &expect {
        assert!(lines.contains(e.as_str()), "missing line {e}\n---\n{text}");
    }
    // Optional figures appear only for the vCPUs that have them.
    let vcpu_of = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{prefix}{{")))
            .map(|l| parse_sample(l).labels[1].1.clone())
            .collect()
    };
    assert_eq!(vcpu_of("ppa_vcpu_kvm_seconds_total"), ["1"]);
    assert_eq!(vcpu_of("ppa_vcpu_kvm_estimated_seconds_total"), ["0"]);
    assert_eq!(vcpu_of("ppa_vcpu_kvm_exits_total"), ["0"]);
    assert!(
        text.contains("# HELP ppa_vcpu_kvm_estimated_seconds_total ESTIMATE "),
        "{text}"
    );
    assert!(text.ends_with('\n'));
}

#[test]
fn families_once_each_and_grouped() {
    let text = render(&stats());
    let mut help = BTreeMap::<&str, usize>::new();
    let mut kind = BTreeMap::<&str, &str>::new();
    let mut finished = BTreeSet::<String>::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("# HELP ") {
            let name = r.split(' ').next().unwrap();
            *help.entry(name).or_default() += 1;
            assert!(!r[name.len()..].trim().is_empty(), "empty HELP for {name}");
            if let Some(prev) = current.replace(name.to_string()) {
                finished.insert(prev);
            }
        } else if let Some(r) = line.strip_prefix("# TYPE ") {
            let mut it = r.split(' ');
            let name = it.next().unwrap();
            let t = it.next().unwrap();
            assert!(kind.insert(name, t).is_none(), "TYPE twice for {name}");
            assert_eq!(current.as_deref(), Some(name), "TYPE before its HELP");
            if t == "counter" {
                assert!(name.ends_with("_total"), "counter {name}");
            } else {
                assert_eq!(t, "gauge");
                assert!(!name.ends_with("_total"), "gauge {name}");
            }
        } else {
            let s = parse_sample(line);
            assert_eq!(current.as_deref(), Some(s.name.as_str()), "{line}");
            assert!(!finished.contains(&s.name), "{} split up", s.name);
        }
    }
    let every: Vec<&str> = vec![
        "ppa_vm_info",
        "ppa_vm_uptime_seconds",
        "ppa_vm_vcpus",
        "ppa_vm_host_threads_seconds_total",
        "ppa_vm_threshold_seconds",
        "ppa_vcpu_info",
        "ppa_vcpu_wall_seconds_total",
        "ppa_vcpu_used_seconds_total",
        "ppa_vcpu_guest_seconds_total",
        "ppa_vcpu_vmm_seconds_total",
        "ppa_vcpu_steal_seconds_total",
        "ppa_vcpu_halted_seconds_total",
        "ppa_vcpu_idle_seconds_total",
        "ppa_vcpu_limited_seconds_total",
        "ppa_vcpu_paused_seconds_total",
        "ppa_vcpu_kvm_seconds_total",
        "ppa_vcpu_kvm_estimated_seconds_total",
        "ppa_vcpu_guest_code_estimated_seconds_total",
        "ppa_vcpu_kvm_run_wall_seconds_total",
        "ppa_vcpu_park_cpu_seconds_total",
        "ppa_vcpu_exits_total",
        "ppa_vcpu_exit_handling_seconds_total",
        "ppa_vcpu_kvm_exits_total",
        "ppa_vcpu_migrations_total",
        "ppa_vcpu_parks_total",
        "ppa_vcpu_threshold_exceeded_total",
        "ppa_vcpu_identity_error_seconds",
        "ppa_vcpu_overloads_total",
    ];
    for name in &every {
        assert_eq!(help.get(name), Some(&1), "HELP of {name}");
        assert!(kind.contains_key(name), "TYPE of {name}");
    }
    assert_eq!(help.len(), every.len(), "unexpected families: {help:?}");
}

#[test]
fn every_sample_parses_and_is_unique() {
    let text = render(&stats());
    let mut seen = BTreeSet::new();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let s = parse_sample(line);
        assert!(s.value.is_finite(), "{line}");
        assert_eq!(s.labels[0], ("vm".to_string(), VM_NAME.to_string()));
        assert!(seen.insert((s.name, s.labels)), "duplicate series {line}");
        n += 1;
    }
    // 4 VM samples + 4 thresholds; per vCPU: info, 11 times, 2 + 2 exit figures, overloads,
    // migrations and parks, 4 thresholds, identity; then vCPU 0's two estimates and
    // kvm_exits, and vCPU 1's kvm_ns.
    assert_eq!(n, 8 + (1 + 11 + 4 + 2 + 4 + 1 + 1) * 2 + 3 + 1, "{text}");
    assert_eq!(parse_sample("a_total{x=\"1\"} 1.5").value, 1.5);
}

#[test]
fn no_vcpus_no_vcpu_families() {
    let mut s = stats();
    s.vcpus.clear();
    let text = render(&s);
    assert!(!text.contains("ppa_vcpu_"), "{text}");
    assert!(text.contains("# TYPE ppa_vm_uptime_seconds gauge"));
}

/// `promtool check metrics` (Debian package `prometheus`) must accept the output without
/// an error or a lint warning.
#[test]
fn promtool_accepts_the_output() {
    let mut s = stats();
    s.groups.push(GroupStats {
        name: "dataplane".into(),
        vcpus: vec![0, 1],
        backend: LimitBackend::Vmm,
        limit: "50%".into(),
        quota_ns: 50_000_000,
        period_ns: 100_000_000,
        periods: 12,
        throttled_periods: 11,
        used_ns: 600_000_000,
        limited_ns: 1_100_000_000,
        overshoot_max_ns: 40_000,
        overshoot: crate::accounting::histogram::HistogramSnapshot::empty(3).to_json(),
        kicks: ppa_vmm_api::LimitKicks {
            path: ppa_vmm_api::LimitKick::Timer,
            timer: 11,
            rearms: 2,
            limiter: 0,
        },
    });
    let text = render(&s);
    assert!(
        text.contains(
            "ppa_group_used_seconds_total{vm=\"we\\\"ird\\\\vm\\nname\",group=\"dataplane\",backend=\"vmm\"} 0.6"
        ),
        "{text}"
    );
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not on PATH: install the `prometheus` package \
             (apt-get install prometheus) to run this test"
        ),
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {} says:\n{said}\n---\n{text}",
        out.status
    );
}

//! Unit tests of the rendering, checked by promtool.

use super::families::FATAL_REASONS;
use super::text::{escape_help, escape_label_value, label_set, seconds, seconds_signed};
use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::accounting::histogram::{Histogram, HistogramSnapshot};
use crate::exit::ExitReason;
use ppa_vmm_api::{
    Level, LimitBackend, SplitKind, SplitSource, Threshold, Thresholds, VcpuMicroState, VmState,
};

/// A VM name that needs every escape.
const VM_NAME: &str = "we\"ird\\vm\nname";
const VM_LABEL: &str = r#"vm="we\"ird\\vm\nname""#;

/// A histogram with `values` recorded (3 fractional bits).
fn hist(values: &[u64]) -> HistogramSnapshot {
    let h = Histogram::new(3).unwrap();
    values.iter().for_each(|&v| h.record(v));
    h.snapshot()
}

/// vCPU `id`'s histograms: exit handling (by reason io_out and overall), guest runs and
/// wake-ups with a few known values.
fn hists(id: usize) -> HistSnapshots {
    let exits = [300, 1_500, 70_000];
    let mut by_reason = vec![HistogramSnapshot::empty(3); ExitReason::COUNT];
    by_reason[ExitReason::IoOut.index()] = hist(&exits);
    HistSnapshots {
        exit_handling: by_reason,
        exit_handling_all: hist(&exits),
        guest_run: hist(&[2_000_000 + id as u64, 5_000_000_000]),
        wakeup_latency: hist(&[]),
        // vCPU 1 measured its in-kernel exits (KVM's tracepoints).
        kvm_exit_handling: if id == 1 {
            vec![("npf".to_string(), hist(&[500, 1_500]))]
        } else {
            Vec::new()
        },
    }
}

fn vcpu(id: usize, kvm_ns: Option<u64>, kvm_estimate: Option<u64>) -> VcpuDetail {
    let map = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    // Every reason, as the accounting reports them; vCPU 1 ended with a shutdown.
    let mut exits: BTreeMap<String, u64> = ExitReason::ALL
        .iter()
        .map(|r| (r.name().to_string(), 0))
        .collect();
    exits.insert("hlt".into(), 3);
    exits.insert("io_out".into(), 42);
    let mut exit_ns = exits.clone();
    exit_ns.insert("hlt".into(), 12_000);
    exit_ns.insert("io_out".into(), 999_999_999);
    if id == 1 {
        exits.insert("shutdown".into(), 1);
    }
    let times = VcpuTimes {
        id,
        host_tid: 1000 + id as i32,
        wall_ns: 3_000_000_000 + id as u64,
        used_ns: 1_500_000_000,
        guest_ns: 1_200_000_000,
        kvm_ns,
        interrupted_ns: kvm_ns.map(|_| 2),
        kvm_ns_estimate: kvm_estimate,
        guest_code_ns_estimate: kvm_estimate.map(|k| 1_200_000_000 - k),
        parks: 7,
        vmm_ns: 300_000_000,
        steal_ns: 250_000_001,
        halted_ns: 0,
        idle_ns: 1_000_000_000,
        limited_ns: 0,
        paused_ns: 250_000_000,
        blocked_ns: 0,
        split: SplitKind::Estimated,
        split_source: SplitSource::None,
        records_lost: 0,
        records_preempted_ns: 0,
        records_on_cpu_ns: None,
        identity_error_ns: if id == 0 { -150_000 } else { 1 },
        state: if id == 0 {
            VcpuMicroState::Guest
        } else {
            VcpuMicroState::Finished
        },
        exits,
        exit_ns,
        kvm_ns_reason: None,
        interrupted_reason: None,
        kvm_exits: if id == 1 {
            map(&[("npf", 4)])
        } else {
            BTreeMap::new()
        },
        kvm_exit_ns: if id == 1 {
            map(&[("npf", 2_000)])
        } else {
            BTreeMap::new()
        },
        kvm_exits_to_user: 0,
        interrupts: if id == 1 {
            map(&[("local_timer", 9)])
        } else {
            BTreeMap::new()
        },
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
        kvm_run_cpu_ns: None,
        kvm_run_wall_ns: 1_300_000_000,
        park_cpu_ns: 20_000,
        proc_ticks: None,
        overloads: 0,
        cpus: None,
        last_cpu: None,
        steal_before_start_ns: 0,
        stamp_clock: None,
        stamp_clock_drifts: 0,
    };
    VcpuDetail {
        times,
        hist: hists(id),
    }
}

fn group() -> GroupStats {
    GroupStats {
        name: "dataplane".into(),
        vcpus: vec![0, 1],
        backend: LimitBackend::Vmm,
        limit: "50%".into(),
        quota_ns: 50_000_000,
        period_ns: 100_000_000,
        periods: 12,
        periods_ns: 1_200_000_000,
        throttled_periods: 11,
        used_ns: 600_000_000,
        stops: Default::default(),
        scope: Default::default(),
        devices_ns: 0,
        devices_limited_ns: 0,
        device_holds: 0,
        limited_ns: 1_100_000_000,
        turn_periods: 0,
        straddled_periods: 0,
        overshoot_max_ns: 40_000,
        overshoot: hist(&[900, 20_000, 40_000]).to_json(),
        kicks: ppa_vmm_api::LimitKicks {
            path: ppa_vmm_api::LimitKick::Timer,
            timer: 11,
            rearms: 2,
            limiter: 0,
            stages: Some(ppa_vmm_api::KickStages {
                to_handler: hist(&[50_000, 60_000]).to_json(),
                to_decision: hist(&[3_000, 4_000]).to_json(),
                spin: hist(&[40_000, 0]).to_json(),
                to_park: hist(&[11_000]).to_json(),
            }),
        },
    }
}

fn process() -> ProcessReading {
    ProcessReading {
        cpu_ns: 2_500_000_000,
        resident_bytes: Some(40 << 20),
        virtual_bytes: Some(400 << 20),
        open_fds: Some(21),
        max_fds: Some(1024),
        start_time_ns: Some(1_795_000_000_250_000_000),
        threads: 8,
        thread_cpu_ns: [10, 2_000_000_000, 30, 40, 50, 60, 0],
    }
}

pub(super) fn stats() -> Detailed {
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
            host_cpu_ns: ppa_vmm_api::HostCpuSplit {
                vcpu_stops: 0,
                vcpus: 4_500_000_000,
                devices: 300_000_000,
                service: 12_000_000,
            },
            pressure: Default::default(),
        },
        vcpus: vec![vcpu(0, None, Some(7_000_000)), vcpu(1, Some(3), None)],
        groups: vec![group()],
        devices: vec![super::devices_tests::device(), super::devices_tests::disk()],
        process: Some(process()),
        pressure_groups: vec![ppa_vmm_api::GroupPressure {
            name: "dataplane".into(),
            vcpus: vec![0, 1],
            pressure: Default::default(),
        }],
        guest: Some(super::guest_tests::guest()),
    }
}

/// One parsed sample line.
#[derive(Debug)]
pub(super) struct Sample {
    pub(super) name: String,
    labels: Vec<(String, String)>,
    pub(super) value: f64,
}

impl Sample {
    pub(super) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
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

/// Every sample of `text`.
pub(super) fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(parse_sample)
        .collect()
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
        label_set(&[("vm", VM_NAME), ("vcpu", "0")], None),
        format!("{{{VM_LABEL},vcpu=\"0\"}}")
    );
    assert_eq!(
        label_set(&[("vm", "a")], Some("+Inf")),
        "{vm=\"a\",le=\"+Inf\"}"
    );
    assert_eq!(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
}

#[test]
fn specific_lines() {
    let text = render(&stats());
    let version = env!("CARGO_PKG_VERSION");
    let expect = [
        format!("ppa_vm_info{{{VM_LABEL},pid=\"4242\"}} 1"),
        format!("ppa_vm_state{{{VM_LABEL},state=\"running\"}} 1"),
        format!("ppa_vm_state{{{VM_LABEL},state=\"paused\"}} 0"),
        format!("ppa_vm_accounting_level{{{VM_LABEL},level=\"basic\"}} 1"),
        format!("ppa_vm_accounting_level{{{VM_LABEL},level=\"full\"}} 0"),
        format!("ppa_vm_uptime_seconds{{{VM_LABEL}}} 259200.123456789"),
        format!("ppa_vm_vcpus{{{VM_LABEL}}} 2"),
        format!("ppa_vm_host_threads_seconds_total{{{VM_LABEL}}} 0.042"),
        format!("ppa_vm_threshold_seconds{{{VM_LABEL},threshold=\"exit_handling\"}} 0.00005"),
        format!("ppa_vm_threshold_seconds{{{VM_LABEL},threshold=\"guest_run\"}} 0"),
        format!("ppa_vcpu_info{{{VM_LABEL},vcpu=\"1\",host_tid=\"1001\"}} 1"),
        format!("ppa_vcpu_state{{{VM_LABEL},vcpu=\"0\",state=\"guest\"}} 1"),
        format!("ppa_vcpu_state{{{VM_LABEL},vcpu=\"1\",state=\"guest\"}} 0"),
        format!("ppa_vcpu_state{{{VM_LABEL},vcpu=\"1\",state=\"finished\"}} 1"),
        format!("ppa_vcpu_split{{{VM_LABEL},vcpu=\"1\",split=\"estimated\"}} 1"),
        format!("ppa_vcpu_split{{{VM_LABEL},vcpu=\"1\",split=\"exact\"}} 0"),
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
        format!("ppa_vcpu_exits_total{{{VM_LABEL},vcpu=\"0\",reason=\"mmio_read\"}} 0"),
        format!("ppa_vcpu_exits_total{{{VM_LABEL},vcpu=\"1\",reason=\"shutdown\"}} 1"),
        format!(
            "ppa_vcpu_exit_handling_seconds_total{{{VM_LABEL},vcpu=\"1\",reason=\"io_out\"}} 0.999999999"
        ),
        format!("ppa_vcpu_kvm_stat_exits_total{{{VM_LABEL},vcpu=\"0\"}} 380"),
        format!("ppa_vcpu_kvm_exits_total{{{VM_LABEL},vcpu=\"1\",reason=\"npf\"}} 4"),
        format!("ppa_vcpu_kvm_exit_seconds_total{{{VM_LABEL},vcpu=\"1\",reason=\"npf\"}} 0.000002"),
        format!("ppa_vcpu_interrupted_seconds_total{{{VM_LABEL},vcpu=\"1\"}} 0.000000002"),
        format!("ppa_vcpu_interrupts_total{{{VM_LABEL},vcpu=\"1\",kind=\"local_timer\"}} 9"),
        format!("ppa_vm_kvm_exit_handling_duration_seconds_count{{{VM_LABEL},reason=\"npf\"}} 2"),
        format!("ppa_vcpu_migrations_total{{{VM_LABEL},vcpu=\"0\"}} 5"),
        format!("ppa_vcpu_parks_total{{{VM_LABEL},vcpu=\"1\"}} 7"),
        format!(
            "ppa_vcpu_threshold_exceeded_total{{{VM_LABEL},vcpu=\"0\",threshold=\"steal_window\"}} 3"
        ),
        format!("ppa_vcpu_identity_error_seconds{{{VM_LABEL},vcpu=\"0\"}} -0.00015"),
        format!("ppa_vcpu_identity_error_seconds{{{VM_LABEL},vcpu=\"1\"}} 0.000000001"),
        // 300 ns, 1.5 µs and 70 µs: below 1.024 µs one, below 262.144 µs all three.
        format!(
            "ppa_vcpu_exit_handling_duration_seconds_bucket{{{VM_LABEL},vcpu=\"0\",le=\"0.000000256\"}} 0"
        ),
        format!(
            "ppa_vcpu_exit_handling_duration_seconds_bucket{{{VM_LABEL},vcpu=\"0\",le=\"0.000001024\"}} 1"
        ),
        format!(
            "ppa_vcpu_exit_handling_duration_seconds_bucket{{{VM_LABEL},vcpu=\"0\",le=\"0.000065536\"}} 2"
        ),
        format!(
            "ppa_vcpu_exit_handling_duration_seconds_bucket{{{VM_LABEL},vcpu=\"0\",le=\"0.000262144\"}} 3"
        ),
        format!(
            "ppa_vcpu_exit_handling_duration_seconds_bucket{{{VM_LABEL},vcpu=\"0\",le=\"+Inf\"}} 3"
        ),
        format!("ppa_vcpu_exit_handling_duration_seconds_sum{{{VM_LABEL},vcpu=\"0\"}} 0.0000718"),
        format!("ppa_vcpu_exit_handling_duration_seconds_count{{{VM_LABEL},vcpu=\"0\"}} 3"),
        // 5 s is above every finite bound.
        format!(
            "ppa_vcpu_guest_run_duration_seconds_bucket{{{VM_LABEL},vcpu=\"1\",le=\"1.073741824\"}} 1"
        ),
        format!(
            "ppa_vcpu_guest_run_duration_seconds_bucket{{{VM_LABEL},vcpu=\"1\",le=\"+Inf\"}} 2"
        ),
        format!("ppa_vcpu_guest_run_duration_seconds_sum{{{VM_LABEL},vcpu=\"1\"}} 5.002000001"),
        format!("ppa_vcpu_wakeup_latency_seconds_count{{{VM_LABEL},vcpu=\"1\"}} 0"),
        // Both vCPUs merged.
        format!(
            "ppa_vm_exit_handling_duration_seconds_bucket{{{VM_LABEL},reason=\"io_out\",le=\"0.000001024\"}} 2"
        ),
        format!("ppa_vm_exit_handling_duration_seconds_count{{{VM_LABEL},reason=\"io_out\"}} 6"),
        format!("ppa_vm_exit_handling_duration_seconds_count{{{VM_LABEL},reason=\"hlt\"}} 0"),
        format!(
            "ppa_group_overshoot_seconds_bucket{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",le=\"0.000001024\"}} 1"
        ),
        format!(
            "ppa_group_overshoot_seconds_bucket{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",le=\"0.000065536\"}} 3"
        ),
        format!("ppa_group_overshoot_seconds_sum{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\"}} 0.0000609"),
        format!("ppa_group_stops_total{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",by=\"timer\"}} 11"),
        format!("ppa_group_stops_total{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",by=\"limiter\"}} 0"),
        format!("ppa_group_timer_rearms_total{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\"}} 2"),
        format!("ppa_group_stop_stage_seconds_count{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",stage=\"to_handler\"}} 2"),
        format!("ppa_group_stop_stage_seconds_sum{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",stage=\"to_decision\"}} 0.000007"),
        format!("ppa_group_stop_stage_seconds_sum{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",stage=\"spin\"}} 0.00004"),
        format!("ppa_group_stop_stage_seconds_count{{{VM_LABEL},group=\"dataplane\",backend=\"vmm\",stage=\"to_park\"}} 1"),
        format!("process_cpu_seconds_total{{{VM_LABEL}}} 2.5"),
        format!("process_resident_memory_bytes{{{VM_LABEL}}} 41943040"),
        format!("process_open_fds{{{VM_LABEL}}} 21"),
        format!("process_max_fds{{{VM_LABEL}}} 1024"),
        format!("process_start_time_seconds{{{VM_LABEL}}} 1795000000.25"),
        format!("process_threads{{{VM_LABEL}}} 8"),
        format!("ppa_vmm_thread_cpu_seconds_total{{{VM_LABEL},kind=\"vcpu\"}} 2"),
        format!("ppa_vmm_thread_cpu_seconds_total{{{VM_LABEL},kind=\"limiter\"}} 0.00000005"),
    ];
    let lines: BTreeSet<&str> = text.lines().collect();
    for e in &expect {
        assert!(lines.contains(e.as_str()), "missing line {e}\n---\n{text}");
    }
    let build = samples(&text)
        .into_iter()
        .find(|s| s.name == "ppa_vmm_build_info")
        .expect("build info");
    assert_eq!(build.label("version"), Some(version));
    assert_eq!(build.label("api"), Some("1"));
    assert!(build.label("revision").is_some_and(|r| !r.is_empty()));
    // Optional figures appear only for the vCPUs that have them.
    let vcpu_of = |name: &str| -> Vec<String> {
        samples(&text)
            .into_iter()
            .filter(|s| s.name == name)
            .map(|s| s.label("vcpu").unwrap().to_string())
            .collect()
    };
    assert_eq!(vcpu_of("ppa_vcpu_kvm_seconds_total"), ["1"]);
    assert_eq!(vcpu_of("ppa_vcpu_kvm_estimated_seconds_total"), ["0"]);
    assert_eq!(vcpu_of("ppa_vcpu_kvm_stat_exits_total"), ["0"]);
    assert_eq!(vcpu_of("ppa_vcpu_kvm_exits_total"), ["1"]);
    assert_eq!(vcpu_of("ppa_vcpu_interrupted_seconds_total"), ["1"]);
    assert!(
        text.contains("# HELP ppa_vcpu_kvm_estimated_seconds_total ESTIMATE "),
        "{text}"
    );
    assert!(text.contains("# TYPE ppa_vcpu_wakeup_latency_seconds histogram\n"));
    assert!(text.ends_with('\n'));
}

/// Changing values are enum gauges (exactly one series at 1 per VM or vCPU), not labels of an
/// `_info` family, whose labels never change while the thread lives.
#[test]
fn changing_values_are_enum_gauges_not_info_labels() {
    let mut s = stats();
    s.vm.state = VmState::Paused;
    s.vm.level = Level::Full;
    s.vcpus[0].times.state = VcpuMicroState::Limited;
    s.vcpus[0].times.split = SplitKind::Mixed;
    let all = samples(&render(&s));
    let keys = |name: &str| -> BTreeSet<Vec<String>> {
        all.iter()
            .filter(|x| x.name == name)
            .map(|x| x.labels.iter().map(|(k, _)| k.clone()).collect())
            .collect()
    };
    assert_eq!(
        keys("ppa_vm_info"),
        BTreeSet::from([vec!["vm".into(), "pid".into()]])
    );
    assert_eq!(
        keys("ppa_vcpu_info"),
        BTreeSet::from([vec!["vm".into(), "vcpu".into(), "host_tid".into()]])
    );
    // (family, label, every value, the vCPU or "" for the VM, the current value)
    let enums: [(&str, &str, Vec<&str>, &str, &str); 5] = [
        (
            "ppa_vm_state",
            "state",
            VmState::NAMES.to_vec(),
            "",
            "paused",
        ),
        (
            "ppa_vm_accounting_level",
            "level",
            vec!["off", "basic", "full"],
            "",
            "full",
        ),
        (
            "ppa_vcpu_state",
            "state",
            VcpuMicroState::NAMES.to_vec(),
            "0",
            "limited",
        ),
        (
            "ppa_vcpu_state",
            "state",
            VcpuMicroState::NAMES.to_vec(),
            "1",
            "finished",
        ),
        (
            "ppa_vcpu_split",
            "split",
            SplitKind::NAMES.to_vec(),
            "0",
            "mixed",
        ),
    ];
    for (family, label, values, vcpu, current) in enums {
        let series: Vec<&Sample> = all
            .iter()
            .filter(|x| x.name == family && x.label("vcpu").unwrap_or("") == vcpu)
            .collect();
        let seen: Vec<&str> = series.iter().map(|x| x.label(label).unwrap()).collect();
        assert_eq!(seen, values, "{family} {vcpu}: one series per value");
        for x in series {
            let on = x.label(label) == Some(current);
            assert_eq!(
                x.value,
                if on { 1.0 } else { 0.0 },
                "{family} {vcpu}: {x:?}"
            );
        }
    }
}

/// No label value names a unit (`_ns`) that contradicts the seconds of the value.
#[test]
fn threshold_labels_have_no_unit_suffix() {
    let all = samples(&render(&stats()));
    let mut thresholds = BTreeSet::new();
    for s in &all {
        for (k, v) in &s.labels {
            assert!(!v.ends_with("_ns"), "{} has {k}={v:?}", s.name);
            if k == "threshold" {
                thresholds.insert(v.clone());
            }
        }
    }
    let expect: BTreeSet<String> = [
        "exit_handling",
        "guest_run",
        "wakeup_latency",
        "steal_window",
    ]
    .map(String::from)
    .into();
    assert_eq!(thresholds, expect);
}

/// Fatal exit reasons appear once a vCPU has one; the others always, zeros included.
#[test]
fn fatal_exit_reasons_only_once_seen() {
    let all = samples(&render(&stats()));
    for family in [
        "ppa_vcpu_exits_total",
        "ppa_vcpu_exit_handling_seconds_total",
    ] {
        for (vcpu, fatal_seen) in [("0", vec![]), ("1", vec!["shutdown"])] {
            let reasons: BTreeSet<&str> = all
                .iter()
                .filter(|s| s.name == family && s.label("vcpu") == Some(vcpu))
                .map(|s| s.label("reason").unwrap())
                .collect();
            let expect: BTreeSet<&str> = ExitReason::ALL
                .iter()
                .map(|r| r.name())
                .filter(|r| !FATAL_REASONS.iter().any(|f| f.name() == *r) || fatal_seen.contains(r))
                .collect();
            assert_eq!(reasons, expect, "{family} of vCPU {vcpu}");
        }
    }
    let vm_reasons: BTreeSet<&str> = all
        .iter()
        .filter(|s| s.name == "ppa_vm_exit_handling_duration_seconds_count")
        .map(|s| s.label("reason").unwrap())
        .collect();
    assert!(vm_reasons.contains("shutdown") && vm_reasons.contains("hlt"));
    assert!(!vm_reasons.contains("internal_error"), "{vm_reasons:?}");
}

#[test]
fn families_once_each_and_grouped() {
    let text = render(&stats());
    let mut help = BTreeMap::<&str, usize>::new();
    let mut kind = BTreeMap::<&str, &str>::new();
    let mut finished = BTreeSet::<String>::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("# HELP ") {
            let name = r.split(' ').next().unwrap();
            *help.entry(name).or_default() += 1;
            assert!(!r[name.len()..].trim().is_empty(), "empty HELP for {name}");
            if let Some((prev, _)) = current.replace((name.to_string(), String::new())) {
                finished.insert(prev);
            }
        } else if let Some(r) = line.strip_prefix("# TYPE ") {
            let mut it = r.split(' ');
            let name = it.next().unwrap();
            let t = it.next().unwrap();
            assert!(kind.insert(name, t).is_none(), "TYPE twice for {name}");
            let cur = current.as_mut().expect("TYPE before its HELP");
            assert_eq!(cur.0, name, "TYPE before its HELP");
            cur.1 = t.to_string();
            match t {
                "counter" => assert!(name.ends_with("_total"), "counter {name}"),
                "gauge" | "histogram" => assert!(!name.ends_with("_total"), "{t} {name}"),
                t => panic!("type {t} of {name}"),
            }
        } else {
            let s = parse_sample(line);
            let (family, t) = current.as_ref().expect("a sample before any family");
            let ok = if t == "histogram" {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| s.name == format!("{family}{suffix}"))
            } else {
                &s.name == family
            };
            assert!(ok, "{line} in family {family}");
            assert!(!finished.contains(family), "{family} split up");
        }
    }
    for d in FAMILIES {
        assert_eq!(help.get(d.name), Some(&1), "HELP of {}", d.name);
        assert_eq!(kind.get(d.name), Some(&d.kind.name()), "TYPE of {}", d.name);
    }
    assert_eq!(help.len(), FAMILIES.len(), "unexpected families: {help:?}");
}

#[test]
fn every_sample_parses_and_is_unique() {
    let text = render(&stats());
    let mut seen = BTreeSet::new();
    let mut n = 0;
    for s in samples(&text) {
        assert!(s.value.is_finite(), "{s:?}");
        assert_eq!(s.labels[0], ("vm".to_string(), VM_NAME.to_string()));
        assert!(
            seen.insert((s.name.clone(), s.labels.clone())),
            "duplicate series {s:?}"
        );
        n += 1;
    }
    // Every histogram has 12 finite buckets, +Inf, _sum and _count.
    let h = 15;
    // VM: build info, info, 5 states, 3 levels, uptime, vcpus, host threads, 2 pressure
    // totals, 6 averages and whether they are estimated, 4 thresholds, 6 + 1 (shutdown) exit
    // reason histograms, one in-kernel exit reason's histogram.
    let vm = 1 + 1 + 5 + 3 + 3 + 9 + 4 + 7 * h + h;
    // Per vCPU: info, 6 states, 4 splits, 10 times, 2 more times, 6 (+1) exits and exit
    // times, kvm exits (vCPU 0), migrations, parks, 4 thresholds, identity, overloads,
    // 3 histograms; vCPU 0 has two estimates, vCPU 1 kvm_ns, interrupted_ns, its in-kernel
    // exits and their time (one reason) and its interrupts (one kind).
    let vcpu = 1 + 6 + 4 + 10 + 2 + 1 + 1 + 4 + 1 + 1 + 3 * h;
    let vcpus = 2 * vcpu + (6 + 6) + (7 + 7) + 1 + 2 + 1 + 1 + 2 + 1;
    // The group: 9 figures, its histogram, stops by 2 paths and re-arms, 4 stop stages'
    // histograms, 2 pressure totals and whether they are estimated, the stops' cost in 2 parts
    // and their count; the process: 7 figures and 7 thread kinds.
    let group = 9 + h + 2 + 1 + 4 * h + 3 + 3;
    let process = 7 + 7;
    // Host CPU by 3 parts; the device: 3 statuses, 6 kinds of work, its thread's CPU and 4
    // states, and per queue (2) 8 counts (6, and the rate limiter's 2) and one drop reason.
    let devices = 3 + 3 + 6 + 1 + 4 + 2 * (8 + 1);
    // The disk: 3 statuses, 6 kinds of work, its thread's CPU and 4 states, one queue's 8
    // counts, 2 request types, the merged requests, 2 directions, one error status, one
    // service histogram.
    let disk = 3 + 6 + 1 + 4 + 8 + 2 + 1 + 2 + 1 + h;
    // The guest (guest_tests::guest): 2 CPUs × 7 modes, 11 thread series × (CPU, 8 delays,
    // 8 counts), 2 thread counts, 2 transient figures, the agent's CPU, 5 alarm kinds, lost,
    // refused and suppressed alarms, 2 reset generations.
    let guest = 14 + 11 * 17 + 2 + 2 + 1 + 5 + 3 + 2;
    assert_eq!(
        n,
        vm + vcpus + group + process + devices + disk + guest,
        "{text}"
    );
    assert_eq!(parse_sample("a_total{x=\"1\"} 1.5").value, 1.5);
}

/// Each part of the time split has its family (a part added to `TimeSplit` needs a row in
/// [`FAMILIES`], docs/control.md and the dashboard).
#[test]
fn every_time_split_part_has_a_family() {
    for part in ppa_vmm_api::TimeSplit::NAMES {
        let name = format!("ppa_vcpu_{part}_seconds_total");
        assert!(
            FAMILIES.iter().any(|d| d.name == name),
            "{name} is not declared"
        );
    }
}

#[test]
fn no_vcpus_no_vcpu_families() {
    let mut s = stats();
    s.vcpus.clear();
    s.process = None;
    let text = render(&s);
    assert!(!text.contains("ppa_vcpu_"), "{text}");
    assert!(!text.contains("ppa_vm_exit_handling_duration"), "{text}");
    assert!(!text.contains("process_"), "{text}");
    assert!(text.contains("# TYPE ppa_vm_uptime_seconds gauge"));
}

/// Every family, the exporter's own included, has a row in docs/control.md's table.
#[test]
fn every_family_is_documented() {
    let doc = include_str!("../../../docs/control.md");
    let section = doc
        .split("### Metric families")
        .nth(1)
        .expect("docs/control.md has a Metric families section");
    let section = section.split("\n## ").next().unwrap();
    let own = exporter::exporter_families();
    for d in FAMILIES.iter().chain(own) {
        let row = format!("| `{}` | {} |", d.name, d.kind.name());
        assert!(
            section.contains(&row),
            "docs/control.md's metric table lacks a row starting {row}"
        );
    }
}

/// Runs `promtool check metrics` (Debian package `prometheus`) on `text`; returns what it
/// said and whether it passed.
pub(super) fn promtool(text: &str) -> (bool, String) {
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
             (scripts/setup.sh, or apt-get install prometheus) to run this test"
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
    (out.status.success() && said.trim().is_empty(), said)
}

/// promtool must accept the output without an error or a lint warning.
#[test]
fn promtool_accepts_the_output() {
    let text = render(&stats());
    assert!(
        text.contains(
            "ppa_group_used_seconds_total{vm=\"we\\\"ird\\\\vm\\nname\",group=\"dataplane\",backend=\"vmm\"} 0.6"
        ),
        "{text}"
    );
    let (ok, said) = promtool(&text);
    assert!(ok, "promtool check metrics says:\n{said}\n---\n{text}");
}

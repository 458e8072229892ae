//! The samples of each family: from the VM's, each vCPU's, each limit's and the process's
//! figures to label sets and values (docs/control.md, "Metric families", says what each is).
//!
//! Data flow: [`super::render`] calls [`add_vm`], [`add_vcpu`] per vCPU, [`add_group`] per
//! limit and [`add_process`] on one [`Families`] collection, which writes the text.
//!
//! Two choices are made here:
//! - Exit reasons that end the vCPU (`shutdown`, `fail_entry`, `internal_error`,
//!   `system_event`, `other`; [`FATAL_REASONS`]) appear only once a vCPU has one: each happens
//!   at most once per vCPU, so a rate of them means nothing and five series of zeros per vCPU
//!   and family would only add cardinality. The reasons a running guest causes (`io_in`,
//!   `io_out`, `mmio_read`, `mmio_write`, `hlt`, `intr`) are always there, zeros included, so
//!   `rate()` sees their first increase.
//! - Threshold label values are the threshold's name without the `_ns` of its socket field
//!   (`exit_handling`, not `exit_handling_ns`): the values of these families are seconds.

use ppa_vmm_api::{
    GroupPressure, GroupStats, Level, Pressure, SplitKind, Threshold, VcpuMicroState, VcpuTimes,
    VmState,
};

use super::buckets::Buckets;
use super::process::{ProcessReading, ThreadKind};
use super::text::{Families, Seconds, SignedSeconds};
use super::{Detailed, VcpuDetail};
use crate::exit::ExitReason;

/// Exit reasons that end the vCPU: their series appear only once seen.
pub const FATAL_REASONS: [ExitReason; 5] = [
    ExitReason::Shutdown,
    ExitReason::FailEntry,
    ExitReason::InternalError,
    ExitReason::SystemEvent,
    ExitReason::Other,
];

/// Whether the series of exit `reason` with `count` exits are written.
fn reason_shown(reason: &str, count: u64) -> bool {
    count > 0 || !FATAL_REASONS.iter().any(|r| r.name() == reason)
}

/// The `threshold` label value of a threshold name (`exit_handling_ns` → `exit_handling`).
pub fn threshold_label(name: &str) -> &str {
    name.strip_suffix("_ns").unwrap_or(name)
}

/// Every accounting level, in order.
const LEVELS: [Level; 3] = [Level::Off, Level::Basic, Level::Full];

/// Adds one enum gauge: a sample per possible value, 1 for `current`, 0 for the others.
fn add_enum<'a>(
    f: &mut Families,
    name: &str,
    base: &[(&str, &str)],
    label: &str,
    values: impl IntoIterator<Item = &'a str>,
    current: &str,
) {
    let mut labels = base.to_vec();
    labels.push((label, ""));
    for v in values {
        *labels.last_mut().expect("pushed above") = (label, v);
        f.add(name, &labels, u8::from(v == current));
    }
}

/// Adds the VM-wide samples (build information included).
pub fn add_vm(f: &mut Families, stats: &Detailed) {
    let vm = stats.vm.name.as_str();
    let base: [(&str, &str); 1] = [("vm", vm)];
    let api = ppa_vmm_api::API_VERSION.to_string();
    let abi = format!(
        "{}.{}",
        ppa_guest_abi::BOOT_INFO_VERSION >> 16,
        ppa_guest_abi::BOOT_INFO_VERSION & 0xffff
    );
    f.add(
        "ppa_vmm_build_info",
        &[
            ("vm", vm),
            ("version", env!("CARGO_PKG_VERSION")),
            (
                "revision",
                option_env!("PPA_VMM_GIT_REVISION").unwrap_or("unknown"),
            ),
            ("api", &api),
            ("guest_abi", &abi),
        ],
        1,
    );
    let pid = stats.vm.pid.to_string();
    f.add("ppa_vm_info", &[("vm", vm), ("pid", &pid)], 1);
    add_enum(
        f,
        "ppa_vm_state",
        &base,
        "state",
        VmState::NAMES,
        stats.vm.state.as_str(),
    );
    add_enum(
        f,
        "ppa_vm_accounting_level",
        &base,
        "level",
        LEVELS.map(Level::name),
        stats.vm.level.name(),
    );
    f.add("ppa_vm_uptime_seconds", &base, Seconds(stats.vm.uptime_ns));
    f.add("ppa_vm_vcpus", &base, stats.vm.vcpus);
    f.add(
        "ppa_vm_host_threads_seconds_total",
        &base,
        Seconds(stats.vm.host_threads_ns),
    );
    add_pressure(f, vm, &stats.vm.pressure);
    for t in Threshold::ALL {
        f.add(
            "ppa_vm_threshold_seconds",
            &[("vm", vm), ("threshold", threshold_label(t.as_str()))],
            Seconds(t.of(&stats.vm.thresholds)),
        );
    }
    // Exit handling by reason, every vCPU merged.
    for r in ExitReason::ALL {
        let mut merged = Buckets::default();
        for v in &stats.vcpus {
            if let Some(h) = v.hist.exit_handling.get(r.index()) {
                merged.merge(&Buckets::of_snapshot(h));
            }
        }
        let exits: u64 = stats
            .vcpus
            .iter()
            .filter_map(|v| v.times.exits.get(r.name()))
            .sum();
        if reason_shown(r.name(), exits.max(merged.count)) && !stats.vcpus.is_empty() {
            f.add_histogram(
                "ppa_vm_exit_handling_duration_seconds",
                &[("vm", vm), ("reason", r.name())],
                &merged,
            );
        }
    }
    // In-kernel exit handling by hardware reason, every vCPU merged (reasons seen only).
    let mut by_reason: std::collections::BTreeMap<&str, Buckets> = Default::default();
    for v in &stats.vcpus {
        for (reason, h) in &v.hist.kvm_exit_handling {
            by_reason
                .entry(reason.as_str())
                .or_default()
                .merge(&Buckets::of_snapshot(h));
        }
    }
    for (reason, b) in by_reason {
        f.add_histogram(
            "ppa_vm_kvm_exit_handling_duration_seconds",
            &[("vm", vm), ("reason", reason)],
            &b,
        );
    }
}

/// Adds the samples of one vCPU.
pub fn add_vcpu(f: &mut Families, vm: &str, d: &VcpuDetail) {
    let v = &d.times;
    let id = v.id.to_string();
    let base: [(&str, &str); 2] = [("vm", vm), ("vcpu", &id)];
    let tid = v.host_tid.to_string();
    f.add(
        "ppa_vcpu_info",
        &[("vm", vm), ("vcpu", &id), ("host_tid", &tid)],
        1,
    );
    add_enum(
        f,
        "ppa_vcpu_state",
        &base,
        "state",
        VcpuMicroState::NAMES,
        v.state.as_str(),
    );
    add_enum(
        f,
        "ppa_vcpu_split",
        &base,
        "split",
        SplitKind::NAMES,
        v.split.as_str(),
    );
    add_vcpu_times(f, &base, v);
    add_vcpu_exits(f, vm, &id, v);
    f.add("ppa_vcpu_migrations_total", &base, v.migrations);
    f.add("ppa_vcpu_parks_total", &base, v.parks);
    for (threshold, n) in &v.thresholds {
        f.add(
            "ppa_vcpu_threshold_exceeded_total",
            &[
                ("vm", vm),
                ("vcpu", &id),
                ("threshold", threshold_label(threshold)),
            ],
            n,
        );
    }
    f.add(
        "ppa_vcpu_identity_error_seconds",
        &base,
        SignedSeconds(v.identity_error_ns),
    );
    f.add("ppa_vcpu_overloads_total", &base, v.overloads);
    let hists = [
        (
            "ppa_vcpu_exit_handling_duration_seconds",
            &d.hist.exit_handling_all,
        ),
        ("ppa_vcpu_guest_run_duration_seconds", &d.hist.guest_run),
        ("ppa_vcpu_wakeup_latency_seconds", &d.hist.wakeup_latency),
    ];
    for (name, h) in hists {
        f.add_histogram(name, &base, &Buckets::of_snapshot(h));
    }
}

/// One vCPU's times: each part of the split, the KVM_RUN wall and park CPU, the estimates.
fn add_vcpu_times(f: &mut Families, base: &[(&str, &str); 2], v: &VcpuTimes) {
    // Each part of the time split is the family ppa_vcpu_PART_seconds_total; kvm and
    // interrupted only where measured (null on the wire).
    for (part, ns) in v.split().named() {
        let measured = match part {
            "kvm" => v.kvm_ns.is_some(),
            "interrupted" => v.interrupted_ns.is_some(),
            _ => true,
        };
        if measured {
            f.add(&format!("ppa_vcpu_{part}_seconds_total"), base, Seconds(ns));
        }
    }
    let times = [
        ("ppa_vcpu_kvm_run_wall_seconds_total", v.kvm_run_wall_ns),
        ("ppa_vcpu_park_cpu_seconds_total", v.park_cpu_ns),
    ];
    for (name, ns) in times {
        f.add(name, base, Seconds(ns));
    }
    let optional = [
        ("ppa_vcpu_kvm_estimated_seconds_total", v.kvm_ns_estimate),
        (
            "ppa_vcpu_guest_code_estimated_seconds_total",
            v.guest_code_ns_estimate,
        ),
    ];
    for (name, ns) in optional {
        if let Some(ns) = ns {
            f.add(name, base, Seconds(ns));
        }
    }
}

/// One vCPU's exits: by reason (count and handling time), KVM's count, the in-kernel exits
/// and the host interrupts.
fn add_vcpu_exits(f: &mut Families, vm: &str, id: &str, v: &VcpuTimes) {
    let base: [(&str, &str); 2] = [("vm", vm), ("vcpu", id)];
    for (reason, n) in &v.exits {
        if !reason_shown(reason, *n) {
            continue;
        }
        f.add(
            "ppa_vcpu_exits_total",
            &[("vm", vm), ("vcpu", id), ("reason", reason)],
            n,
        );
    }
    for (reason, ns) in &v.exit_ns {
        if !reason_shown(reason, v.exits.get(reason).copied().unwrap_or(0)) {
            continue;
        }
        f.add(
            "ppa_vcpu_exit_handling_seconds_total",
            &[("vm", vm), ("vcpu", id), ("reason", reason)],
            Seconds(*ns),
        );
    }
    if let Some(n) = v.kvm_stats.get("exits") {
        f.add("ppa_vcpu_kvm_stat_exits_total", &base, n);
    }
    for (reason, n) in &v.kvm_exits {
        let labels = [("vm", vm), ("vcpu", id), ("reason", reason.as_str())];
        f.add("ppa_vcpu_kvm_exits_total", &labels, n);
        let ns = v.kvm_exit_ns.get(reason).copied().unwrap_or(0);
        f.add("ppa_vcpu_kvm_exit_seconds_total", &labels, Seconds(ns));
    }
    for (kind, n) in &v.interrupts {
        f.add(
            "ppa_vcpu_interrupts_total",
            &[("vm", vm), ("vcpu", id), ("kind", kind)],
            n,
        );
    }
}

/// The VM's pressure: totals in seconds, averages as ratios.
fn add_pressure(f: &mut Families, vm: &str, p: &Pressure) {
    let base = [("vm", vm)];
    let us = |t: u64| Seconds(t.saturating_mul(1000));
    f.add(
        "ppa_vm_pressure_some_seconds_total",
        &base,
        us(p.some.total_us),
    );
    f.add(
        "ppa_vm_pressure_full_seconds_total",
        &base,
        us(p.full.total_us),
    );
    for (kind, line) in [("some", &p.some), ("full", &p.full)] {
        for (window, pct) in [
            ("10s", line.avg10),
            ("60s", line.avg60),
            ("300s", line.avg300),
        ] {
            let labels = [("vm", vm), ("kind", kind), ("window", window)];
            f.add("ppa_vm_pressure_avg_ratio", &labels, pct / 100.0);
        }
    }
    f.add("ppa_vm_pressure_estimated", &base, u64::from(p.estimated));
}

/// One vCPU group's pressure totals.
pub fn add_group_pressure(f: &mut Families, vm: &str, g: &GroupPressure) {
    let labels = [("vm", vm), ("group", g.name.as_str())];
    let us = |t: u64| Seconds(t.saturating_mul(1000));
    let p = &g.pressure;
    f.add(
        "ppa_group_pressure_some_seconds_total",
        &labels,
        us(p.some.total_us),
    );
    f.add(
        "ppa_group_pressure_full_seconds_total",
        &labels,
        us(p.full.total_us),
    );
    f.add(
        "ppa_group_pressure_estimated",
        &labels,
        u64::from(p.estimated),
    );
}

/// Adds the samples of one CPU limit.
pub fn add_group(f: &mut Families, vm: &str, g: &GroupStats) {
    let labels = [
        ("vm", vm),
        ("group", g.name.as_str()),
        ("backend", g.backend.as_str()),
    ];
    f.add("ppa_group_quota_seconds", &labels, Seconds(g.quota_ns));
    f.add("ppa_group_period_seconds", &labels, Seconds(g.period_ns));
    f.add("ppa_group_periods_total", &labels, g.periods);
    f.add(
        "ppa_group_throttled_periods_total",
        &labels,
        g.throttled_periods,
    );
    f.add("ppa_group_turn_periods_total", &labels, g.turn_periods);
    f.add(
        "ppa_group_straddled_periods_total",
        &labels,
        g.straddled_periods,
    );
    f.add("ppa_group_used_seconds_total", &labels, Seconds(g.used_ns));
    for (part, ns) in [
        ("cpu", g.stops.cpu_ns),
        ("kvm_estimate", g.stops.kvm_ns_estimate),
    ] {
        let with_part = [labels[0], labels[1], labels[2], ("part", part)];
        f.add("ppa_group_stop_cost_seconds_total", &with_part, Seconds(ns));
    }
    f.add("ppa_group_stop_cost_stops_total", &labels, g.stops.count);
    f.add(
        "ppa_group_limited_seconds_total",
        &labels,
        Seconds(g.limited_ns),
    );
    f.add(
        "ppa_group_overshoot_max_seconds",
        &labels,
        Seconds(g.overshoot_max_ns),
    );
    f.add_histogram(
        "ppa_group_overshoot_seconds",
        &labels,
        &Buckets::of_json(&g.overshoot),
    );
    for (by, n) in [("timer", g.kicks.timer), ("limiter", g.kicks.limiter)] {
        let with_by = [labels[0], labels[1], labels[2], ("by", by)];
        f.add("ppa_group_stops_total", &with_by, n);
    }
    f.add("ppa_group_timer_rearms_total", &labels, g.kicks.rearms);
    for (stage, h) in g.kicks.stages.iter().flat_map(|s| s.named()) {
        let with_stage = [labels[0], labels[1], labels[2], ("stage", stage)];
        f.add_histogram(
            "ppa_group_stop_stage_seconds",
            &with_stage,
            &Buckets::of_json(h),
        );
    }
}

/// Adds the process's own figures.
pub fn add_process(f: &mut Families, vm: &str, p: &ProcessReading) {
    let base: [(&str, &str); 1] = [("vm", vm)];
    f.add("process_cpu_seconds_total", &base, Seconds(p.cpu_ns));
    let optional = [
        ("process_resident_memory_bytes", p.resident_bytes),
        ("process_virtual_memory_bytes", p.virtual_bytes),
        ("process_open_fds", p.open_fds),
        ("process_max_fds", p.max_fds),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            f.add(name, &base, v);
        }
    }
    if let Some(ns) = p.start_time_ns {
        f.add("process_start_time_seconds", &base, Seconds(ns));
    }
    f.add("process_threads", &base, p.threads);
    for (kind, ns) in ThreadKind::ALL.iter().zip(p.thread_cpu_ns) {
        f.add(
            "ppa_vmm_thread_cpu_seconds_total",
            &[("vm", vm), ("kind", kind.as_str())],
            Seconds(ns),
        );
    }
}

//! Prometheus metrics: the VMM's figures in the text exposition format (version 0.0.4), with
//! OpenMetrics-style names (base units, counters ending in `_total`).
//!
//! This module owns the mapping from [`Detailed`] (the VM's figures and every vCPU's whole `VcpuTimes`,
//! defined field by field in docs/accounting.md) to metric families, and the text encoding:
//! number formatting and label escaping. It does no I/O and touches no KVM state.
//!
//! Data flow: a reader (never a vCPU thread) takes a [`Detailed`] snapshot and calls [`render`];
//! whoever serves the text (an HTTP endpoint, a file, a socket command) sends it with
//! [`CONTENT_TYPE`]. [`render`] collects every sample into its family first, then writes each
//! family once (one `# HELP` and `# TYPE` block, its samples after it), as the format requires.
//! Families without a sample (e.g. `ppa_vcpu_kvm_seconds_total` on hosts where `kvm_ns` is
//! null) are left out.
//!
//! Every sample carries the label `vm` (the VM's name, user-given, so escaped); per-vCPU
//! samples add `vcpu` (its index). Times are nanoseconds in [`Detailed`] and seconds here, written
//! as the exact decimal `ns / 1e9` (up to nine fractional digits, trailing zeros dropped), so no
//! precision is lost before the scraper parses them.

use std::fmt::Write as _;

use ppa_vmm_api::{GroupStats, Threshold, VcpuTimes, VmStats};

/// Content type to serve it with over HTTP.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metric type of a family (the `# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One metric family while it is being collected: its samples as `{labels}` and value text.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(String, String)>,
}

/// The families of one rendering, in output order.
struct Families(Vec<Family>);

impl Families {
    /// Declares a family; its position in the output is the order of declaration.
    fn declare(&mut self, name: &'static str, kind: Kind, help: &'static str) {
        debug_assert!(
            self.0.iter().all(|f| f.name != name),
            "{name} declared twice"
        );
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"));
        self.0.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
    }

    /// Adds a sample to the declared family `name`. `labels` are (name, raw value) pairs.
    fn add(&mut self, name: &str, labels: &[(&str, &str)], value: String) {
        let family = self
            .0
            .iter_mut()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("metric family {name} is not declared"));
        family.samples.push((label_set(labels), value));
    }

    /// The exposition text: each family with samples, once.
    fn render(&self) -> String {
        let mut out = String::new();
        for f in self.0.iter().filter(|f| !f.samples.is_empty()) {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.name());
            for (labels, value) in &f.samples {
                let _ = writeln!(out, "{}{labels} {value}", f.name);
            }
        }
        out
    }
}

/// `{name="value",...}` with each value escaped.
fn label_set(labels: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(name);
        s.push_str("=\"");
        s.push_str(&escape_label_value(value));
        s.push('"');
    }
    s.push('}');
    s
}

/// Escapes a label value: backslash, double quote and line feed, as the format requires.
fn escape_label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Escapes `# HELP` text: backslash and line feed (a double quote stays as it is there).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Nanoseconds as exact decimal seconds: `1_500_000_000` → `1.5`, `0` → `0`.
fn seconds(ns: u64) -> String {
    let whole = ns / 1_000_000_000;
    let frac = ns % 1_000_000_000;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Signed nanoseconds as exact decimal seconds.
fn seconds_signed(ns: i64) -> String {
    let magnitude = seconds(ns.unsigned_abs());
    if ns < 0 {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

/// The families, declared in output order: VM-wide first, then per vCPU.
fn declare_all(f: &mut Families) {
    use Kind::{Counter, Gauge};
    f.declare(
        "ppa_vm_info",
        Gauge,
        "Always 1; labels give the VMM version, the accounting level and the VM state.",
    );
    f.declare(
        "ppa_vm_uptime_seconds",
        Gauge,
        "Time since the vCPUs were started.",
    );
    f.declare("ppa_vm_vcpus", Gauge, "Number of vCPUs.");
    f.declare(
        "ppa_vm_host_threads_seconds_total",
        Counter,
        "CPU time of every non-vCPU thread of the VMM process.",
    );
    f.declare(
        "ppa_vm_threshold_seconds",
        Gauge,
        "Threshold in force, by name; 0 means off.",
    );
    f.declare(
        "ppa_vcpu_info",
        Gauge,
        "Always 1; labels give the vCPU micro-state at the read and how guest/vmm time was split.",
    );
    f.declare(
        "ppa_vcpu_wall_seconds_total",
        Counter,
        "Monotonic time elapsed since the vCPU thread started or was reset.",
    );
    f.declare(
        "ppa_vcpu_used_seconds_total",
        Counter,
        "On-CPU time of the vCPU thread (guest + vmm).",
    );
    f.declare(
        "ppa_vcpu_guest_seconds_total",
        Counter,
        "On-CPU time inside KVM_RUN: guest code plus in-kernel exit handling.",
    );
    f.declare(
        "ppa_vcpu_vmm_seconds_total",
        Counter,
        "On-CPU time in the VMM outside KVM_RUN.",
    );
    f.declare(
        "ppa_vcpu_steal_seconds_total",
        Counter,
        "Time runnable but waiting for a host CPU (schedstat run_delay).",
    );
    f.declare(
        "ppa_vcpu_halted_seconds_total",
        Counter,
        "Time blocked inside KVM_RUN (in-kernel HLT).",
    );
    f.declare(
        "ppa_vcpu_idle_seconds_total",
        Counter,
        "Time parked because the guest asked to idle.",
    );
    f.declare(
        "ppa_vcpu_limited_seconds_total",
        Counter,
        "Time parked because a CPU limit was exhausted.",
    );
    f.declare(
        "ppa_vcpu_paused_seconds_total",
        Counter,
        "Time parked because an operator paused the VM.",
    );
    f.declare(
        "ppa_vcpu_blocked_seconds_total",
        Counter,
        "Time off CPU and not runnable outside parks and halts (asleep in the kernel).",
    );
    f.declare(
        "ppa_vcpu_kvm_seconds_total",
        Counter,
        "Measured in-kernel exit handling time (only where the host can split it out).",
    );
    f.declare(
        "ppa_vcpu_kvm_estimated_seconds_total",
        Counter,
        "ESTIMATE of the in-kernel exit handling inside guest time: KVM's exit count times the measured round-trip cost.",
    );
    f.declare(
        "ppa_vcpu_guest_code_estimated_seconds_total",
        Counter,
        "ESTIMATE of guest code time: guest time minus the estimated in-kernel exit handling.",
    );
    f.declare(
        "ppa_vcpu_kvm_run_wall_seconds_total",
        Counter,
        "Wall time inside KVM_RUN (timed accounting levels), steal and halted time included.",
    );
    f.declare(
        "ppa_vcpu_park_cpu_seconds_total",
        Counter,
        "On-CPU time around parks (part of vmm time).",
    );
    f.declare(
        "ppa_vcpu_exits_total",
        Counter,
        "Exits to userspace, by reason.",
    );
    f.declare(
        "ppa_vcpu_exit_handling_seconds_total",
        Counter,
        "Userspace exit handling wall time, by reason (parks excluded).",
    );
    f.declare(
        "ppa_vcpu_kvm_exits_total",
        Counter,
        "Every exit KVM counted, in-kernel ones included (KVM statistic exits).",
    );
    f.declare(
        "ppa_vcpu_migrations_total",
        Counter,
        "Host CPU changes seen between consecutive KVM_RUN entries.",
    );
    f.declare(
        "ppa_vcpu_parks_total",
        Counter,
        "Parks of the vCPU thread (idle, limited, paused).",
    );
    f.declare(
        "ppa_vcpu_threshold_exceeded_total",
        Counter,
        "Occurrences above each threshold, by threshold name.",
    );
    f.declare(
        "ppa_vcpu_identity_error_seconds",
        Gauge,
        "Signed error of the accounting identity: wall - (used + steal + halted + idle + limited + paused + blocked).",
    );
    f.declare(
        "ppa_vcpu_overloads_total",
        Counter,
        "Runaway and overload detections of the vCPU.",
    );
    f.declare(
        "ppa_group_quota_seconds",
        Gauge,
        "CPU time a limit allows per period (group vm: the VM-wide limit); 0 when removed.",
    );
    f.declare("ppa_group_period_seconds", Gauge, "Period of the limit.");
    f.declare(
        "ppa_group_periods_total",
        Counter,
        "Periods completed since the limit was set.",
    );
    f.declare(
        "ppa_group_throttled_periods_total",
        Counter,
        "Periods in which the limit stopped a member.",
    );
    f.declare(
        "ppa_group_used_seconds_total",
        Counter,
        "CPU time the members used in completed periods.",
    );
    f.declare(
        "ppa_group_limited_seconds_total",
        Counter,
        "Time the members spent stopped by the limit (their limited time, summed; cgroup backend: the cgroup's throttled time).",
    );
    f.declare(
        "ppa_group_overshoot_max_seconds",
        Gauge,
        "Largest overshoot of a period (used - quota).",
    );
}

/// Adds the samples of one vCPU.
fn add_vcpu(f: &mut Families, vm: &str, v: &VcpuTimes) {
    let id = v.id.to_string();
    let base: [(&str, &str); 2] = [("vm", vm), ("vcpu", &id)];
    f.add(
        "ppa_vcpu_info",
        &[
            ("vm", vm),
            ("vcpu", &id),
            ("state", v.state.as_str()),
            ("split", v.split.as_str()),
        ],
        "1".into(),
    );
    // Each part of the time split is the family ppa_vcpu_PART_seconds_total.
    for (part, ns) in v.split().named() {
        f.add(
            &format!("ppa_vcpu_{part}_seconds_total"),
            &base,
            seconds(ns),
        );
    }
    let times = [
        ("ppa_vcpu_kvm_run_wall_seconds_total", v.kvm_run_wall_ns),
        ("ppa_vcpu_park_cpu_seconds_total", v.park_cpu_ns),
    ];
    for (name, ns) in times {
        f.add(name, &base, seconds(ns));
    }
    let optional = [
        ("ppa_vcpu_kvm_seconds_total", v.kvm_ns),
        ("ppa_vcpu_kvm_estimated_seconds_total", v.kvm_ns_estimate),
        (
            "ppa_vcpu_guest_code_estimated_seconds_total",
            v.guest_code_ns_estimate,
        ),
    ];
    for (name, ns) in optional {
        if let Some(ns) = ns {
            f.add(name, &base, seconds(ns));
        }
    }
    for (reason, n) in &v.exits {
        f.add(
            "ppa_vcpu_exits_total",
            &[("vm", vm), ("vcpu", &id), ("reason", reason)],
            n.to_string(),
        );
    }
    for (reason, ns) in &v.exit_ns {
        f.add(
            "ppa_vcpu_exit_handling_seconds_total",
            &[("vm", vm), ("vcpu", &id), ("reason", reason)],
            seconds(*ns),
        );
    }
    if let Some(n) = v.kvm_stats.get("exits") {
        f.add("ppa_vcpu_kvm_exits_total", &base, n.to_string());
    }
    f.add("ppa_vcpu_migrations_total", &base, v.migrations.to_string());
    f.add("ppa_vcpu_parks_total", &base, v.parks.to_string());
    for (threshold, n) in &v.thresholds {
        f.add(
            "ppa_vcpu_threshold_exceeded_total",
            &[("vm", vm), ("vcpu", &id), ("threshold", threshold)],
            n.to_string(),
        );
    }
    f.add(
        "ppa_vcpu_identity_error_seconds",
        &base,
        seconds_signed(v.identity_error_ns),
    );
    f.add("ppa_vcpu_overloads_total", &base, v.overloads.to_string());
}

/// What the metrics are rendered from: the VM's figures and every vCPU's full record (the
/// control socket's `stats` carries only summaries; metrics want the estimates, KVM exits,
/// migrations and thresholds too).
#[derive(Debug, Clone)]
pub struct Detailed {
    /// The VM.
    pub vm: VmStats,
    /// Every vCPU.
    pub vcpus: Vec<VcpuTimes>,
    /// Every CPU limit.
    pub groups: Vec<GroupStats>,
}

/// Renders `stats` in the Prometheus text exposition format 0.0.4 (serve it with
/// [`CONTENT_TYPE`]). Each family appears once, with `# HELP` and `# TYPE`; families without
/// a sample are left out.
pub fn render(stats: &Detailed) -> String {
    let mut f = Families(Vec::new());
    declare_all(&mut f);
    let vm = stats.vm.name.as_str();
    let base: [(&str, &str); 1] = [("vm", vm)];
    f.add(
        "ppa_vm_info",
        &[
            ("vm", vm),
            ("version", env!("CARGO_PKG_VERSION")),
            ("level", stats.vm.level.name()),
            ("state", stats.vm.state.as_str()),
        ],
        "1".into(),
    );
    f.add("ppa_vm_uptime_seconds", &base, seconds(stats.vm.uptime_ns));
    f.add("ppa_vm_vcpus", &base, stats.vm.vcpus.to_string());
    f.add(
        "ppa_vm_host_threads_seconds_total",
        &base,
        seconds(stats.vm.host_threads_ns),
    );
    for t in Threshold::ALL {
        f.add(
            "ppa_vm_threshold_seconds",
            &[("vm", vm), ("threshold", t.as_str())],
            seconds(t.of(&stats.vm.thresholds)),
        );
    }
    for v in &stats.vcpus {
        add_vcpu(&mut f, vm, v);
    }
    for g in &stats.groups {
        let labels = [
            ("vm", vm),
            ("group", g.name.as_str()),
            ("backend", g.backend.as_str()),
        ];
        f.add("ppa_group_quota_seconds", &labels, seconds(g.quota_ns));
        f.add("ppa_group_period_seconds", &labels, seconds(g.period_ns));
        f.add("ppa_group_periods_total", &labels, g.periods.to_string());
        f.add(
            "ppa_group_throttled_periods_total",
            &labels,
            g.throttled_periods.to_string(),
        );
        f.add("ppa_group_used_seconds_total", &labels, seconds(g.used_ns));
        f.add(
            "ppa_group_limited_seconds_total",
            &labels,
            seconds(g.limited_ns),
        );
        f.add(
            "ppa_group_overshoot_max_seconds",
            &labels,
            seconds(g.overshoot_max_ns),
        );
    }
    f.render()
}

#[cfg(test)]
mod tests;

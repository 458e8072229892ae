//! `bench overhead`'s in-kernel exit workload: CPUIDs of the tiny guest (`exits:kind=cpuid`),
//! which VMX and SVM hosts' KVM handles in the kernel without ever returning to the VMM. Each
//! is two tracepoint records at level full (`kvm_exit`, `kvm_entry`), so this is where their
//! cost shows: the guest's CPUID rate at basic, and at full without and with the kernel's
//! tracepoints, alternated in rounds and taken by their medians. Throughput is the guest's own
//! (its iterations over its rdtsc time). A host where CPUID is not a KVM exit (this project's
//! PVM development hosts: KVM's `exits` statistic does not move) gets the reason instead.

use serde::Serialize;

use super::{median, vm_of};
use ppa_vmm::accounting::Level;
use ppa_vmm::vm::VmError;

/// The in-kernel exit workload's figures, or why there are none.
#[derive(Debug, Clone, Serialize)]
pub struct KernelExits {
    /// CPUIDs per run.
    pub exits_per_run: u64,
    /// In-kernel exits per second at basic (None: the host has no such exit).
    pub basic_exits_per_s: Option<f64>,
    /// At full without the kernel's tracepoints.
    pub full_notrace_exits_per_s: Option<f64>,
    /// At full with them.
    pub full_exits_per_s: Option<f64>,
    /// full / full without tracepoints.
    pub trace_over_notrace: Option<f64>,
    /// full without tracepoints / basic.
    pub full_notrace_over_basic: Option<f64>,
    /// Why the figures are null (one sentence), else null.
    pub note: Option<String>,
}

impl KernelExits {
    /// The human lines.
    pub fn to_text(&self) -> String {
        match (
            self.basic_exits_per_s,
            self.full_notrace_exits_per_s,
            self.full_exits_per_s,
        ) {
            (Some(b), Some(n), Some(f)) => format!(
                "in-kernel exits (CPUID), {} per run\n{:<28} {b:>12.0} exits/s\n\
                 {:<28} {n:>12.0} exits/s   of basic  {:.4}\n\
                 {:<28} {f:>12.0} exits/s   tracepoints {:.4} of without\n",
                self.exits_per_run,
                "ppa-vmm basic",
                "ppa-vmm full, no tracepoints",
                n / b,
                "ppa-vmm full",
                f / n,
            ),
            _ => format!(
                "in-kernel exits: {}\n",
                self.note.as_deref().unwrap_or("not measured")
            ),
        }
    }
}

/// The guest's CPUID rate in one run, or None when CPUID did not exit to KVM (its `exits`
/// statistic grew by less than the CPUIDs made).
fn rate(n: u64, level: Level, trace: bool) -> Result<Option<f64>, VmError> {
    let out = vm_of(
        format!("exits:n={n},kind=cpuid"),
        level,
        trace,
        super::Place::default(),
    )?
    .run()?;
    let v = &out.report.vcpus[0];
    let kvm_exits = v.times.kvm_stats.get("exits").copied().unwrap_or(0);
    if kvm_exits < n {
        return Ok(None);
    }
    let tiny = v.tiny();
    let get = |k: &str| tiny.and_then(|t| t.guest_reported.get(k).copied());
    let (Some(iterations), Some(elapsed)) = (get("iterations"), get("elapsed_ns")) else {
        return Ok(None);
    };
    Ok(Some(iterations as f64 * 1e9 / elapsed.max(1) as f64))
}

/// Runs the workload at basic, full without and full with tracepoints, `rounds` times each
/// in rotating order, `n` CPUIDs a run.
pub fn measure(n: u64, rounds: usize) -> Result<KernelExits, VmError> {
    let none = |note: &str| KernelExits {
        exits_per_run: n,
        basic_exits_per_s: None,
        full_notrace_exits_per_s: None,
        full_exits_per_s: None,
        trace_over_notrace: None,
        full_notrace_over_basic: None,
        note: Some(note.to_string()),
    };
    if rate(n.min(1000), Level::Basic, false)?.is_none() {
        return Ok(none(
            "CPUID is not an exit to KVM on this host (KVM's exits statistic did not count \
             them), so it has no in-kernel exit workload to measure",
        ));
    }
    let configs = [
        (Level::Basic, false),
        (Level::Full, false),
        (Level::Full, true),
    ];
    let mut rates: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds.max(1) {
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            std::thread::sleep(std::time::Duration::from_millis(100));
            let (level, trace) = configs[i];
            match rate(n, level, trace)? {
                Some(r) => rates[i].push(r),
                None => return Ok(none("a run's CPUIDs did not all exit to KVM")),
            }
        }
    }
    let [basic, notrace, full] = rates.map(median);
    Ok(KernelExits {
        exits_per_run: n,
        basic_exits_per_s: Some(basic),
        full_notrace_exits_per_s: Some(notrace),
        full_exits_per_s: Some(full),
        trace_over_notrace: Some(full / notrace),
        full_notrace_over_basic: Some(notrace / basic),
        note: None,
    })
}

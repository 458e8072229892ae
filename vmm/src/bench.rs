//! Self-measurement of the whole system (`ppa-vmm bench`, spec section 9).
//!
//! `overhead`: MMIO-exit throughput of (a) a raw KVM_RUN loop with no VMM logic, (b) ppa-vmm at
//! accounting off, (c) basic, (d) full without the kernel's tracepoints, (e) full with them (the
//! default). Each round runs the five on the same tiny-guest image and `exits:n=N` workload, one
//! after the other, in an order that rotates each round, with a short pause between runs, so
//! slow drifts of the host and the teardown of the previous VM affect all alike. Throughput is
//! exits divided by the vCPU's wall time; the figure of each configuration is its median over
//! the rounds. Then, where the host has an exit that KVM handles in the kernel (`bench/kernel.rs`:
//! CPUID on VMX and SVM), the same for `exits:kind=cpuid` at basic and at full with and without
//! the tracepoints: what two records per in-kernel exit cost. Results are ratios measured side
//! by side in one run, never absolute targets.

use serde::Serialize;

mod hogs;
pub mod kernel;
pub mod limit;
pub mod net;
pub mod socket;
pub mod start;

use crate::accounting::Level;
use crate::config::RunOptions;
use crate::vm::{Vm, VmError};

/// Options of `bench overhead`.
#[derive(Debug, Clone, Copy)]
pub struct OverheadOptions {
    /// Exits per run.
    pub exits: u64,
    /// Rounds (each runs all four configurations).
    pub rounds: usize,
}

/// Result of `bench overhead`; `verdict` is last, as spec section 9 asks.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadResult {
    /// Exits per run.
    pub exits_per_run: u64,
    /// Rounds.
    pub rounds: usize,
    /// Raw KVM_RUN loop.
    pub raw_exits_per_s: f64,
    /// ppa-vmm, accounting off.
    pub off_exits_per_s: f64,
    /// ppa-vmm, accounting basic.
    pub basic_exits_per_s: f64,
    /// ppa-vmm, accounting full with the kernel's tracepoints (the default).
    pub full_exits_per_s: f64,
    /// ppa-vmm, accounting full without them (`kernel_trace` false).
    pub full_notrace_exits_per_s: f64,
    /// off / raw (target >= 0.95).
    pub off_over_raw: f64,
    /// basic / off (target >= 0.985, aim 0.99).
    pub basic_over_off: f64,
    /// full / off (no target: it includes the tracepoints' records, whose cost is the
    /// kernel's; see `full_notrace_over_off`).
    pub full_over_off: f64,
    /// full without tracepoints / off (target >= 0.97, aim 0.99): the VMM's own cost of level
    /// full.
    pub full_notrace_over_off: f64,
    /// full / full without tracepoints: what the tracepoints cost on this workload.
    pub trace_over_notrace: f64,
    /// The in-kernel exit workload, where the host has one.
    pub kernel_exits: kernel::KernelExits,
    /// `pass`, or `fail: ...` naming the ratios under target.
    pub verdict: String,
}

/// A one-vCPU VM of `workload` at `level`, with the kernel's tracepoints or not.
fn vm_of(workload: String, level: Level, trace: bool) -> Result<Vm, VmError> {
    let opts = RunOptions {
        vcpus: Some(1),
        workload: vec![workload],
        accounting: Some(level),
        kernel_trace: Some(trace),
        ..Default::default()
    };
    let (config, _) = opts.into_config()?;
    Vm::try_from(config)
}

fn vm(exits: u64, level: Level, trace: bool) -> Result<Vm, VmError> {
    vm_of(format!("exits:n={exits},kind=mmio"), level, trace)
}

fn ppa_rate(exits: u64, level: Level, trace: bool) -> Result<f64, VmError> {
    let out = vm(exits, level, trace)?.run()?;
    let v = &out.report.vcpus[0];
    let total: u64 = v.times.exits.values().sum();
    Ok(total as f64 * 1e9 / v.times.wall_ns.max(1) as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs `bench overhead`.
pub fn overhead(o: OverheadOptions) -> Result<OverheadResult, VmError> {
    let mut rates: [Vec<f64>; 5] = Default::default();
    let configs = [
        None,
        Some((Level::Off, true)),
        Some((Level::Basic, true)),
        Some((Level::Full, true)),
        Some((Level::Full, false)),
    ];
    for round in 0..o.rounds.max(1) {
        // Rotate the order each round, and let the host finish tearing down the previous VM
        // (freed memory, shadow pages) before the next starts, so no configuration always runs
        // in the wake of the same other one.
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            std::thread::sleep(std::time::Duration::from_millis(100));
            let rate = match configs[i] {
                None => {
                    let exit_gpa = ppa_guest_abi::DOORBELL_GPA + ppa_guest_abi::doorbell::EXIT;
                    let (n, ns) = vm(o.exits, Level::Off, false)?.run_raw(exit_gpa)?;
                    n as f64 * 1e9 / ns.max(1) as f64
                }
                Some((level, trace)) => ppa_rate(o.exits, level, trace)?,
            };
            rates[i].push(rate);
        }
    }
    let [raw, off, basic, full, full_notrace] = rates.map(median);
    let (off_over_raw, basic_over_off, full_over_off) = (off / raw, basic / off, full / off);
    let full_notrace_over_off = full_notrace / off;
    let kernel_exits = kernel::measure(o.exits, o.rounds)?;
    let mut misses = Vec::new();
    for (name, v, target) in [
        ("off/raw", off_over_raw, 0.95),
        ("basic/off", basic_over_off, 0.985),
        ("full-notrace/off", full_notrace_over_off, 0.97),
    ] {
        if v < target {
            misses.push(format!("{name} {v:.3} < {target}"));
        }
    }
    Ok(OverheadResult {
        exits_per_run: o.exits,
        rounds: o.rounds,
        raw_exits_per_s: raw,
        off_exits_per_s: off,
        basic_exits_per_s: basic,
        full_exits_per_s: full,
        full_notrace_exits_per_s: full_notrace,
        off_over_raw,
        basic_over_off,
        full_over_off,
        full_notrace_over_off,
        trace_over_notrace: full / full_notrace,
        kernel_exits,
        verdict: if misses.is_empty() {
            "pass".to_string()
        } else {
            format!("fail: {}", misses.join(", "))
        },
    })
}

impl OverheadResult {
    /// The human table.
    pub fn to_text(&self) -> String {
        format!(
            "MMIO exit throughput, {} exits per run, median of {} alternated rounds\n\
             {:<28} {:>12.0} exits/s\n{:<28} {:>12.0} exits/s   off/raw   {:.4} (>= 0.95)\n\
             {:<28} {:>12.0} exits/s   basic/off {:.4} (>= 0.985)\n\
             {:<28} {:>12.0} exits/s   full/off  {:.4} (>= 0.97)\n\
             {:<28} {:>12.0} exits/s   full/off  {:.4}   tracepoints {:.4} of without\n\
             {}verdict: {}\n",
            self.exits_per_run,
            self.rounds,
            "raw KVM_RUN loop",
            self.raw_exits_per_s,
            "ppa-vmm accounting off",
            self.off_exits_per_s,
            self.off_over_raw,
            "ppa-vmm basic",
            self.basic_exits_per_s,
            self.basic_over_off,
            "ppa-vmm full, no tracepoints",
            self.full_notrace_exits_per_s,
            self.full_notrace_over_off,
            "ppa-vmm full",
            self.full_exits_per_s,
            self.full_over_off,
            self.trace_over_notrace,
            self.kernel_exits.to_text(),
            self.verdict
        )
    }
}

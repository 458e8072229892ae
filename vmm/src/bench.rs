//! Self-measurement of the whole system (`ppa-vmm bench`, spec section 9).
//!
//! `overhead`: MMIO-exit throughput of (a) a raw KVM_RUN loop with no VMM logic, (b) ppa-vmm at
//! accounting off, (c) basic, (d) full. Each round runs the four on the same tiny-guest image and
//! `exits:n=N` workload, one after the other, in an order that rotates each round, with a short
//! pause between runs, so slow drifts of the host and the teardown of the previous VM affect all
//! four alike. Throughput is exits divided by the vCPU's wall time; the figure
//! of each configuration is its median over the rounds. Results are ratios measured side by side
//! in one run, never absolute targets.

use serde::Serialize;

mod hogs;
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
    /// ppa-vmm, accounting full.
    pub full_exits_per_s: f64,
    /// off / raw (target >= 0.95).
    pub off_over_raw: f64,
    /// basic / off (target >= 0.985, aim 0.99).
    pub basic_over_off: f64,
    /// full / off (target >= 0.97, aim 0.99).
    pub full_over_off: f64,
    /// `pass`, or `fail: ...` naming the ratios under target.
    pub verdict: String,
}

fn vm(exits: u64, level: Level) -> Result<Vm, VmError> {
    let opts = RunOptions {
        vcpus: Some(1),
        workload: vec![format!("exits:n={exits},kind=mmio")],
        accounting: Some(level),
        ..Default::default()
    };
    let (config, _) = opts.into_config()?;
    Vm::try_from(config)
}

fn ppa_rate(exits: u64, level: Level) -> Result<f64, VmError> {
    let out = vm(exits, level)?.run()?;
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
    let mut rates: [Vec<f64>; 4] = Default::default();
    let configs = [
        None,
        Some(Level::Off),
        Some(Level::Basic),
        Some(Level::Full),
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
                    let (n, ns) = vm(o.exits, Level::Off)?.run_raw(exit_gpa)?;
                    n as f64 * 1e9 / ns.max(1) as f64
                }
                Some(level) => ppa_rate(o.exits, level)?,
            };
            rates[i].push(rate);
        }
    }
    let [raw, off, basic, full] = rates.map(median);
    let (off_over_raw, basic_over_off, full_over_off) = (off / raw, basic / off, full / off);
    let mut misses = Vec::new();
    for (name, v, target) in [
        ("off/raw", off_over_raw, 0.95),
        ("basic/off", basic_over_off, 0.985),
        ("full/off", full_over_off, 0.97),
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
        off_over_raw,
        basic_over_off,
        full_over_off,
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
             {:<22} {:>12.0} exits/s\n{:<22} {:>12.0} exits/s   off/raw   {:.4} (>= 0.95)\n\
             {:<22} {:>12.0} exits/s   basic/off {:.4} (>= 0.985)\n\
             {:<22} {:>12.0} exits/s   full/off  {:.4} (>= 0.97)\nverdict: {}\n",
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
            "ppa-vmm full",
            self.full_exits_per_s,
            self.full_over_off,
            self.verdict
        )
    }
}

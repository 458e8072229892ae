//! The tiny payload's part of the final report: each vCPU's workload, doorbell counts and the
//! measurements the guest reported (its own rdtsc view), as JSON fields of the vCPU and as the
//! report's second table.
//!
//! Data flow: after the run, `TinyBoot::vcpu_report` builds a [`TinyVcpuReport`] per vCPU from
//! the tiny devices' board; the report flattens it into the vCPU's JSON object (keys
//! `workload`, `doorbells`, `guest_reported`, unchanged since the first report format) and calls
//! [`text`] for its table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ppa_guest_abi::report::NAMES as REPORT_NAMES;
use serde::Serialize;

use super::workload::VcpuWorkload;
use crate::devices::tiny::{Doorbell, TinyVcpu};

/// What the tiny payload reports about one vCPU.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct TinyVcpuReport {
    /// Its workload spec.
    pub workload: String,
    /// Doorbell and workload-port accesses by kind (`unhandled` includes accesses no device
    /// claimed).
    pub doorbells: BTreeMap<&'static str, u64>,
    /// What the guest measured itself (only keys it reported).
    pub guest_reported: BTreeMap<&'static str, u64>,
}

impl TinyVcpuReport {
    /// The report of a vCPU running `workload`, from its device state and the accesses no
    /// device claimed.
    pub fn new(workload: &VcpuWorkload, state: Option<&TinyVcpu>, unclaimed: u64) -> Self {
        let count = |d: Doorbell| state.map_or(0, |s| s.doorbell(d));
        let doorbells = Doorbell::ALL
            .iter()
            .map(|&d| {
                let extra = if d == Doorbell::Unhandled {
                    unclaimed
                } else {
                    0
                };
                (d.name(), count(d) + extra)
            })
            .collect();
        let guest_reported = REPORT_NAMES
            .iter()
            .enumerate()
            .filter_map(|(k, name)| Some((*name, state?.reported(k)?)))
            .collect();
        TinyVcpuReport {
            workload: workload.to_string(),
            doorbells,
            guest_reported,
        }
    }

    /// Workload doorbell and port accesses.
    pub fn work_exits(&self) -> u64 {
        self.doorbells.get("workload_mmio").copied().unwrap_or(0)
            + self.doorbells.get("workload_pio").copied().unwrap_or(0)
    }
}

/// One row of the table: a vCPU's id, its report and its exit-handling p99 (ns), if any.
pub struct Row<'a> {
    /// vCPU index.
    pub id: usize,
    /// Its tiny report.
    pub tiny: &'a TinyVcpuReport,
    /// p99 of its exit handling, ns.
    pub exit_p99_ns: Option<u64>,
}

/// The table of what each guest measured itself with rdtsc.
pub fn text(rows: &[Row<'_>]) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}  (the guest's own rdtsc view)",
        "VCPU", "SPIN ms", "RAN ms", "LOST ms", "GAPS", "WORK EX", "EXIT p99"
    );
    for r in rows {
        let rep = &r.tiny.guest_reported;
        let g = |k| {
            rep.get(k)
                .map_or("-".to_string(), |&n| format!("{:.2}", ms(n)))
        };
        let gaps = rep.get("gaps").map_or("-".to_string(), |n| n.to_string());
        let p99 = r
            .exit_p99_ns
            .map_or("-".to_string(), |p| format!("{:.1}us", p as f64 / 1e3));
        let _ = writeln!(
            out,
            "{:>4} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}",
            r.id,
            g("spin_ns"),
            g("ran_ns"),
            g("lost_ns"),
            gaps,
            r.tiny.work_exits(),
            p99
        );
        if let Some(bytes) = rep.get("touched_bytes") {
            let _ = writeln!(
                out,
                "     memtouch: {} MiB at {:#x} written and read back, {} words wrong",
                bytes >> 20,
                rep.get("touch_base").copied().unwrap_or(0),
                rep.get("touch_errors").copied().unwrap_or(0)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::tiny::workload::Workload;

    #[test]
    fn counts_include_unclaimed_accesses_and_only_reported_keys() {
        let w = VcpuWorkload {
            workload: Workload::Busy { ms: 5 },
            publish: true,
        };
        let r = TinyVcpuReport::new(&w, None, 3);
        assert_eq!(r.workload, "busy:ms=5");
        assert_eq!(r.doorbells["unhandled"], 3);
        assert_eq!(r.doorbells.len(), Doorbell::COUNT);
        assert!(r.guest_reported.is_empty());
        let t = text(&[Row {
            id: 0,
            tiny: &r,
            exit_p99_ns: Some(23_000),
        }]);
        assert!(t.contains("(the guest's own rdtsc view)"));
        assert!(t.lines().nth(1).unwrap().ends_with("23.0us"));
    }
}

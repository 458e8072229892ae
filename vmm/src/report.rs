//! The final report: what each vCPU published, as JSON (spec section 7) or as a text table.
//!
//! Data flow: after the vCPU threads are joined, `Vm::run` calls [`Report::build`] with the
//! shared per-vCPU state; the binary serialises the report (`serde_json`) or prints
//! [`Report::to_text`]. The report only reads atomics, so it could equally be built while the
//! vCPUs run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ppa_guest_abi::report::NAMES as REPORT_NAMES;
use serde::Serialize;

use crate::exit::ExitReason;
use crate::vcpu::{Doorbell, RegsDump, VcpuEnd, VcpuShared};
use crate::workload::Workload;

/// VM facts fixed at build time.
#[derive(Debug, Clone, Serialize)]
pub struct VmInfo {
    /// vCPU count.
    pub vcpus: usize,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// `tiny` or the image path.
    pub image: String,
    /// TSC frequency given to the guest.
    pub tsc_khz: u64,
}

/// Per-VM part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct VmReport {
    /// Build-time facts.
    #[serde(flatten)]
    pub info: VmInfo,
    /// Time from the first vCPU start to the last join.
    pub uptime_ns: u64,
    /// `completed` (every vCPU exited with 0), `failed`, or `timeout`.
    pub end: &'static str,
}

/// A failed vCPU's cause.
#[derive(Debug, Clone, Serialize)]
pub struct FailureReport {
    /// One sentence.
    pub reason: String,
    /// Registers at failure, when available.
    pub regs: Option<RegsDump>,
}

/// Per-vCPU part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct VcpuReport {
    /// vCPU index.
    pub id: usize,
    /// Host thread id of its thread.
    pub host_tid: i32,
    /// Its workload spec.
    pub workload: String,
    /// `exited`, `failed`, `error` or `stopped`.
    pub end: &'static str,
    /// The code the guest exited with, when it did.
    pub exit_code: Option<u64>,
    /// Why it failed, when it did.
    pub failure: Option<FailureReport>,
    /// Wall time of the thread's run loop.
    pub wall_ns: u64,
    /// Userspace exits by reason (every reason, zeros included).
    pub exits: BTreeMap<&'static str, u64>,
    /// Doorbell and workload-port accesses by kind.
    pub doorbells: BTreeMap<&'static str, u64>,
    /// What the guest measured itself (only keys it reported).
    pub guest_reported: BTreeMap<&'static str, u64>,
}

/// The final report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The VM.
    pub vm: VmReport,
    /// Each vCPU.
    pub vcpus: Vec<VcpuReport>,
    /// vCPU groups (none until CPU limits exist).
    pub groups: Vec<serde_json::Value>,
}

fn vcpu_report(s: &VcpuShared, workload: &Workload) -> VcpuReport {
    let c = &s.counters;
    let exits = ExitReason::ALL
        .iter()
        .map(|r| (r.name(), c.exits[r.index()].get()))
        .collect();
    let doorbells = Doorbell::ALL
        .iter()
        .map(|d| (d.name(), c.doorbells[*d as usize].get()))
        .collect();
    let mask = c.reported_mask.load(std::sync::atomic::Ordering::Acquire);
    let guest_reported = REPORT_NAMES
        .iter()
        .enumerate()
        .filter(|(k, _)| mask & (1 << k) != 0)
        .map(|(k, name)| (*name, c.reported[k].get()))
        .collect();
    let (end, exit_code, failure) = match s.end() {
        Some(VcpuEnd::Exited(code)) => ("exited", Some(*code), None),
        Some(VcpuEnd::Failed { failure, regs }) => (
            "failed",
            None,
            Some(FailureReport {
                reason: failure.to_string(),
                regs: regs.as_deref().cloned(),
            }),
        ),
        Some(VcpuEnd::Error(msg)) => (
            "error",
            None,
            Some(FailureReport {
                reason: msg.clone(),
                regs: None,
            }),
        ),
        Some(VcpuEnd::Stopped) | None => ("stopped", None, None),
    };
    VcpuReport {
        id: s.id,
        host_tid: s.host_tid(),
        workload: workload.to_string(),
        end,
        exit_code,
        failure,
        wall_ns: s.wall_ns(),
        exits,
        doorbells,
        guest_reported,
    }
}

impl Report {
    /// Builds the report from the vCPUs' published state.
    pub fn build(
        info: &VmInfo,
        workloads: &[Workload],
        vcpus: &[std::sync::Arc<VcpuShared>],
        uptime_ns: u64,
        timed_out: bool,
    ) -> Report {
        let vcpus: Vec<VcpuReport> = vcpus
            .iter()
            .zip(workloads)
            .map(|(s, w)| vcpu_report(s, w))
            .collect();
        let all_ok = vcpus.iter().all(|v| v.exit_code == Some(0));
        let end = match (timed_out, all_ok) {
            (true, _) => "timeout",
            (false, true) => "completed",
            (false, false) => "failed",
        };
        Report {
            vm: VmReport {
                info: info.clone(),
                uptime_ns,
                end,
            },
            vcpus,
            groups: Vec::new(),
        }
    }

    /// 0 when every vCPU exited with code 0, else 1.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.vm.end != "completed")
    }

    /// A table for people: one row per vCPU, then failures.
    pub fn to_text(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut out = String::new();
        let vm = &self.vm;
        let _ = writeln!(
            out,
            "VM: {} vCPUs, {} MiB, image {}, TSC {} kHz, uptime {:.1} ms, {}",
            vm.info.vcpus,
            vm.info.memory_mib,
            vm.info.image,
            vm.info.tsc_khz,
            ms(vm.uptime_ns),
            vm.end
        );
        let _ = writeln!(
            out,
            "{:>4} {:>8} {:<40} {:>7} {:>10} {:>9} {:>10} {:>10} {:>10}",
            "VCPU", "TID", "WORKLOAD", "END", "WALL ms", "EXITS", "WORKLOAD", "SPIN ms", "LOST ms"
        );
        for v in &self.vcpus {
            let total: u64 = v.exits.values().sum();
            let work = v.doorbells["workload_mmio"] + v.doorbells["workload_pio"];
            let g = |k| {
                v.guest_reported
                    .get(k)
                    .map_or("-".to_string(), |&n| format!("{:.2}", ms(n)))
            };
            let end = match v.exit_code {
                Some(c) => format!("exit {c}"),
                None => v.end.to_string(),
            };
            let _ = writeln!(
                out,
                "{:>4} {:>8} {:<40} {:>7} {:>10.2} {:>9} {:>10} {:>10} {:>10}",
                v.id,
                v.host_tid,
                v.workload,
                end,
                ms(v.wall_ns),
                total,
                work,
                g("spin_ns"),
                g("lost_ns")
            );
        }
        for v in &self.vcpus {
            if let Some(f) = &v.failure {
                let _ = writeln!(out, "vCPU {} {}: {}", v.id, v.end, f.reason);
                if let Some(r) = &f.regs {
                    let _ = writeln!(
                        out,
                        "  rip={} rsp={} rflags={} cs={} ss={} cr0={} cr3={} cr4={} efer={}",
                        r.rip, r.rsp, r.rflags, r.cs, r.ss, r.cr0, r.cr3, r.cr4, r.efer
                    );
                }
            }
        }
        out
    }
}

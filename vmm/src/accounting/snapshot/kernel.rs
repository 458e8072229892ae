//! What KVM's and the interrupt tracepoints measured of a vCPU (level full), as figures of
//! spec section 4: `kvm_ns`, `interrupted_ns`, the in-kernel exits by reason, the interrupts
//! by kind, or, where a figure is null, the one sentence that says why. A pure function of
//! two meter readings (a sample and its baseline), unit-tested with the snapshot's tests.

use std::collections::BTreeMap;

use super::super::meter::{MeterReading, TraceState};
use super::super::switches::pairing::IRQ_KIND_NAMES;
use super::hists::kvm_slot_name;

/// The figures (deltas since the baseline).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFigures {
    /// KVM's exit handling inside KVM_RUN, where KVM's tracepoints fire.
    pub kvm_ns: Option<u64>,
    /// Host interrupts while the thread was current, where the interrupt tracepoints are on.
    pub interrupted_ns: Option<u64>,
    /// Of interrupted_ns, the part in `vmm` intervals (out of vmm_ns).
    pub irq_vmm_ns: u64,
    /// Why kvm_ns is null.
    pub kvm_ns_reason: Option<String>,
    /// Why interrupted_ns is null.
    pub interrupted_reason: Option<String>,
    /// In-kernel exits by reason name.
    pub kvm_exits: BTreeMap<String, u64>,
    /// Their handling time by reason name.
    pub kvm_exit_ns: BTreeMap<String, u64>,
    /// VM exits that reached userspace.
    pub kvm_exits_to_user: u64,
    /// Interrupts by kind (kinds with at least one).
    pub interrupts: BTreeMap<String, u64>,
    /// KVM_RUN intervals whose time KVM's tracepoints split.
    pub kvm_runs: u64,
}

/// Why a figure of tracepoints in `state` is null (`why`: the reason the vCPU thread left).
fn reason(state: TraceState, what: &str, why: Option<&str>) -> Option<String> {
    Some(match state {
        TraceState::Firing => return None,
        TraceState::NotOpened => format!(
            "{what} is measured at level full only, and this vCPU has not run at level full"
        ),
        TraceState::Unknown => {
            format!("{what} waits for a KVM_RUN of this vCPU that enters the guest")
        }
        TraceState::Unavailable | TraceState::Silent => {
            why.map_or_else(|| format!("{what} cannot be measured here"), str::to_string)
        }
    })
}

/// The figures of `cur` since `base`; `why`: the meter's reasons (KVM's, the interrupts').
pub fn figures(
    cur: &MeterReading,
    base: &MeterReading,
    why: (Option<&str>, Option<&str>),
) -> KernelFigures {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let kvm_on = cur.kvm_trace == TraceState::Firing;
    let irq_on = cur.irq_trace == TraceState::Firing;
    let irq_vmm_ns = if irq_on {
        d(cur.irq_vmm, base.irq_vmm)
    } else {
        0
    };
    let mut f = KernelFigures {
        kvm_ns: kvm_on.then(|| d(cur.kvm_full, base.kvm_full)),
        interrupted_ns: irq_on.then(|| d(cur.irq_run, base.irq_run) + irq_vmm_ns),
        irq_vmm_ns,
        kvm_ns_reason: reason(cur.kvm_trace, "kvm_ns", why.0),
        interrupted_reason: reason(cur.irq_trace, "interrupted_ns", why.1),
        kvm_exits_to_user: d(cur.kvm_to_user, base.kvm_to_user),
        kvm_runs: d(cur.kvm_runs, base.kvm_runs),
        ..KernelFigures::default()
    };
    for &(code, n, ns) in &cur.kvm_exits {
        let (bn, bns) = base
            .kvm_exits
            .iter()
            .find(|(c, _, _)| *c == code)
            .map_or((0, 0), |&(_, n, ns)| (n, ns));
        if n > bn {
            let name = kvm_slot_name(code);
            f.kvm_exits.insert(name.clone(), n - bn);
            f.kvm_exit_ns.insert(name, d(ns, bns));
        }
    }
    for (k, name) in IRQ_KIND_NAMES.iter().enumerate() {
        let n = d(cur.interrupts[k], base.interrupts[k]);
        if n > 0 {
            f.interrupts.insert((*name).to_string(), n);
        }
    }
    f
}

//! What `ppa-vmm bench` (the cli/ package) measures or uses of the library's insides that no
//! other public API shows: the kernel's part of a kick-timer stop, and the scheduling helpers
//! the VMM's own threads use. The modules they come from (`vcpu`, `hypervisor`, `sched`) stay
//! private to the crate; this module names the few items the benchmarks need, and nothing
//! else calls it.

use crate::accounting::histogram::HistogramSnapshot;

pub use crate::sched::{allowed_cpus, raise_priority};

/// The kernel's part of a timer stop without KVM: `samples` firings of a timer made as a
/// vCPU's kick timer is, delivering the hypervisor's kick signal to the calling thread while it
/// spins in user space; from the armed-for time to the signal handler, per firing (details at
/// the vCPU module's `signal_path`).
pub fn kick_signal_path(samples: usize) -> std::io::Result<HistogramSnapshot> {
    crate::vcpu::signal_path(crate::hypervisor::kvm::kick::kick_signal(), samples)
}

/// Gives `config` a VM limit of `quota_ns` per `period_ns` without the checks of a limit
/// given as text (`bench stops` measures the guest's share of quotas below the smallest the
/// VMM accepts, `limits::MIN_QUOTA_NS`, to show where that least comes from).
pub fn set_vm_limit_unchecked(config: &mut crate::config::VmConfig, quota_ns: u64, period_ns: u64) {
    let limit = crate::limits::Limit {
        quota_ns,
        period_ns,
    };
    config.limits.vm = Some((
        limit,
        format!("{}us/{}us", quota_ns / 1000, period_ns / 1000),
    ));
}

/// The smallest quota per busy member a limit may give (`limits::MIN_QUOTA_NS`).
pub const MIN_QUOTA_NS: u64 = crate::limits::MIN_QUOTA_NS;

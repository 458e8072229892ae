//! Measures the in-kernel cost of one exit round trip on this host, before the guest starts.
//!
//! guest_ns (on-CPU inside KVM_RUN) includes KVM's own exit and entry paths wherever the host
//! cannot split them out (PVM has no kvm_entry/kvm_exit tracepoints). To let a reader tell guest
//! code time from that part, the VM measures it: vCPU 0 runs a two-instruction stub (a store
//! to an unclaimed doorbell register, then a jump back) and the VMM times each KVM_RUN with the
//! vDSO clock. The median is `kvm_exit_cost_ns`; the vCPU's real registers are set afterwards.

use kvm_ioctls::VcpuFd;
use ppa_guest_abi::DOORBELL_GPA;

use crate::kick::now_ns;

/// Guest-physical address of the stub (in the boot area, below the boot-info records).
pub const STUB_GPA: u64 = 0xB000;
/// The stub: `mov [rax], ecx` then `jmp` back to it.
pub const STUB: [u8; 4] = [0x89, 0x08, 0xeb, 0xfc];
/// The unclaimed doorbell register the stub writes.
pub const STUB_TARGET: u64 = DOORBELL_GPA + 0x800;

/// The measured in-kernel cost of one exit round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ExitCost {
    /// Median over back-to-back round trips.
    pub hot_ns: u64,
    /// Median over round trips that follow a 200 µs sleep of the thread, like the first
    /// KVM_RUN after a park (cold caches, state reloaded).
    pub after_park_ns: u64,
}

/// Measures [`ExitCost`] on `fd` with `rounds` hot and `rounds / 10` cold round trips, or None
/// if KVM refused. The caller has written [`STUB`] at [`STUB_GPA`] and resets the registers
/// afterwards.
pub fn exit_cost(fd: &mut VcpuFd, rounds: usize) -> Option<ExitCost> {
    let mut regs = fd.get_regs().ok()?;
    regs.rip = STUB_GPA;
    regs.rax = STUB_TARGET;
    fd.set_regs(&regs).ok()?;
    let hot_ns = median_run_ns(fd, rounds, None)?;
    let after_park_ns = median_run_ns(
        fd,
        (rounds / 10).max(1),
        Some(std::time::Duration::from_micros(200)),
    )?;
    Some(ExitCost {
        hot_ns,
        after_park_ns,
    })
}

fn median_run_ns(
    fd: &mut VcpuFd,
    rounds: usize,
    sleep: Option<std::time::Duration>,
) -> Option<u64> {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        if let Some(d) = sleep {
            std::thread::sleep(d);
        }
        let t0 = now_ns();
        let ok = matches!(
            fd.run(),
            Ok(kvm_ioctls::VcpuExit::MmioWrite(STUB_TARGET, _))
        );
        let t1 = now_ns();
        if !ok {
            return None;
        }
        samples.push(t1 - t0);
    }
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied()
}

/// Runs the stub once on `fd` from the calling thread, then restores the vCPU's registers.
///
/// A vCPU's first KVM_RUN on a thread does one-time work in the kernel that can sleep (MMU root
/// allocation under a VM-wide lock; a synchronize_rcu when the vCPU changes threads). Done by
/// every vCPU thread before its wall clock starts, that time stays out of its accounting and
/// the vCPUs do not all collide on those locks at the start. The caller has written [`STUB`]
/// at [`STUB_GPA`]. Returns None if KVM refused (the registers may then be unchanged or not).
pub fn warm_up(fd: &mut VcpuFd) -> Option<()> {
    let saved = fd.get_regs().ok()?;
    let mut regs = saved;
    regs.rip = STUB_GPA;
    regs.rax = STUB_TARGET;
    fd.set_regs(&regs).ok()?;
    let exited = matches!(
        fd.run(),
        Ok(kvm_ioctls::VcpuExit::MmioWrite(STUB_TARGET, _))
    );
    // Complete that MMIO exit (KVM finishes it on the next KVM_RUN, which immediate_exit turns
    // into an immediate return) before the registers are put back.
    fd.set_kvm_immediate_exit(1);
    let _ = fd.run();
    fd.set_kvm_immediate_exit(0);
    fd.set_regs(&saved).ok()?;
    exited.then_some(())
}

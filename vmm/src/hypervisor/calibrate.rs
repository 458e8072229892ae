//! Measures the in-kernel cost of one exit round trip on this host, on a scratch VM of its own.
//!
//! guest_ns (on-CPU inside KVM_RUN) includes the hypervisor's own exit and entry paths wherever
//! the host cannot split them out (PVM has no kvm_entry/kvm_exit tracepoints). To let a reader
//! tell guest code time from that part, the VMM measures it before it builds the real VM: a
//! scratch VM with 64 KiB of memory and one vCPU, started at CPL 3 in long mode, runs a
//! two-instruction stub (a store to an address with no memory behind it, then a jump back) and
//! each run is timed with the vDSO clock. The median is `kvm_exit_cost_ns`. The scratch VM shares
//! nothing with the real one, so no payload has to leave room for the stub in its own layout.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::{
    ExitCost, ExitEvent, Hypervisor, MemorySlot, Vcpu, Vm, WarmUpStub, LONG_PARK_NS, SHORT_PARK_NS,
};
use crate::arch::x86_64::cpl3::{entry_regs, tss, Cpl3Layout};
use crate::arch::x86_64::regs::Fpu;
use crate::sync::now_ns;

/// The stub: `mov [rax], ecx` then `jmp` back to it.
pub const STUB: [u8; 4] = [0x89, 0x08, 0xeb, 0xfc];

/// The scratch VM's layout: tables, then the stub, all inside 64 KiB of RAM.
const LAYOUT: Cpl3Layout = Cpl3Layout {
    pml4: 0x6000,
    pdpt: 0x7000,
    pd: 0x8000,
    gdt: 0x1000,
    tss: 0x2000,
};
/// Where the stub goes in the scratch VM.
const STUB_GPA: u64 = 0xC000;
/// The address with no memory behind it that the stub writes (inside the identity map).
const STUB_TARGET: u64 = 0xD000_0800;
/// RAM of the scratch VM.
const RAM: u64 = 0x1_0000;

/// Measures [`ExitCost`] with `rounds` hot and `rounds / 10` cold round trips on a scratch VM of
/// `hv`, or None if anything in the hypervisor refused (the VMM then reports no estimate).
pub fn exit_cost<H: Hypervisor>(hv: &H, rounds: usize) -> Option<ExitCost> {
    let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).ok()?;
    for (gpa, table) in LAYOUT.page_tables(4) {
        let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
        memory.write_slice(&bytes, GuestAddress(gpa)).ok()?;
    }
    memory
        .write_slice(&LAYOUT.gdt(), GuestAddress(LAYOUT.gdt))
        .ok()?;
    memory.write_slice(&tss(), GuestAddress(LAYOUT.tss)).ok()?;
    memory.write_slice(&STUB, GuestAddress(STUB_GPA)).ok()?;
    let host = memory.get_host_address(GuestAddress(0)).ok()?;

    let vm = hv.create_vm().ok()?;
    let slot = MemorySlot {
        slot: 0,
        gpa: 0,
        size: RAM,
        host_addr: host as u64,
    };
    // SAFETY: `memory` owns the mapping and is declared before `vm`, so it is dropped after
    // `vm` and its vCPU; nothing else uses it.
    unsafe { vm.map_memory(&slot) }.ok()?;
    let mut vcpu = vm.create_vcpu(0).ok()?;
    vcpu.set_sregs(&LAYOUT.special_regs()).ok()?;
    vcpu.set_fpu(&Fpu::default()).ok()?;
    let mut regs = entry_regs(STUB_GPA, RAM - 8, 0);
    regs.rax = STUB_TARGET;
    vcpu.set_regs(&regs).ok()?;
    let hot_ns = median_run_ns(&mut vcpu, rounds, None)?;
    let after_park_ns = median_run_ns(
        &mut vcpu,
        (rounds / 10).max(1),
        Some(std::time::Duration::from_nanos(SHORT_PARK_NS)),
    )?;
    // Five long sleeps (40 ms, once per host: the run directory keeps the figures).
    let after_long_park_ns = median_run_ns(
        &mut vcpu,
        (rounds / 40).max(1),
        Some(std::time::Duration::from_nanos(LONG_PARK_NS)),
    )?;
    Some(ExitCost {
        hot_ns,
        after_park_ns,
        after_long_park_ns,
    })
}

fn median_run_ns<V: Vcpu>(
    vcpu: &mut V,
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
            vcpu.run(),
            Ok(ExitEvent::MmioWrite {
                addr: STUB_TARGET,
                ..
            })
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

/// Runs `stub` once on `vcpu` and puts its registers back: what `Vcpu::warm_up` does on a
/// backend that runs guest code (see there). Returns false if the run did not exit at the
/// stub's target or the registers could not be restored.
pub fn run_stub<V: Vcpu>(vcpu: &mut V, stub: WarmUpStub) -> bool {
    let Ok(saved) = vcpu.regs() else {
        return false;
    };
    let mut regs = saved;
    regs.rip = stub.rip;
    regs.rax = stub.target;
    if vcpu.set_regs(&regs).is_err() {
        return false;
    }
    let exited = matches!(
        vcpu.run(),
        Ok(ExitEvent::MmioWrite { addr, .. }) if addr == stub.target
    );
    // Complete that MMIO exit before the registers are put back.
    vcpu.complete_pending();
    vcpu.set_regs(&saved).is_ok() && exited
}

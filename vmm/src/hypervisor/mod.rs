//! The hypervisor seam: what the VMM needs from a hypervisor, as traits, with KVM behind them.
//!
//! Data flow: a [`Hypervisor`] (KVM: [`kvm::Kvm`], opened on `/dev/kvm`) creates a [`Vm`]; the
//! VM builder maps guest memory into it ([`Vm::map_memory`]), creates one [`Vcpu`] per vCPU,
//! interrupt lines ([`Vm::irq_line`], irqfd on KVM) and exit-free notifications
//! ([`Vm::register_ioevent`], ioeventfd on KVM) for devices. Each vCPU thread then owns its
//! [`Vcpu`]: [`Vcpu::run`] enters the guest and returns an [`ExitEvent`], the VMM's own type, so
//! everything above this module (exit handling, devices, accounting) is free of KVM's types and
//! can be tested with [`fake`]'s scripted exits. Other threads stop a running vCPU through its
//! [`Kicker`].
//!
//! The run loop (`vcpu::run`) is generic over [`Vcpu`] (static dispatch): nothing on the exit
//! path goes through a lock, an allocation or a trait object of this module.

use std::sync::Arc;

use serde::Serialize;
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use crate::arch::x86_64::regs::{CpuidEntry, Fpu, Msr, Regs, SpecialRegs};

pub mod calibrate;
#[cfg(any(test, feature = "fake-hypervisor"))]
pub mod fake;
pub mod kvm;
pub mod stats;
pub mod timer_signal;

pub use stats::VcpuStats;

/// The error number of a failed hypervisor call.
pub type Errno = vmm_sys_util::errno::Error;

/// Why the hypervisor refused a request while a VM was being built or inspected.
#[derive(Debug, Error)]
pub enum HvError {
    /// The hypervisor's device node does not exist.
    #[error("the KVM device {0} does not exist (where a host has KVM, kvm_intel, kvm_amd or kvm_pvm creates /dev/kvm)")]
    Missing(std::path::PathBuf),
    /// No permission to open the device node.
    #[error("no permission to open {0}: run as root or join the group that owns it (kvm)")]
    Access(std::path::PathBuf),
    /// Another failure opening the device node.
    #[error("cannot open {path}")]
    Open {
        /// Path.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: Errno,
    },
    /// A call failed.
    #[error("the hypervisor refused to {step}")]
    Call {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: Errno,
    },
}

impl HvError {
    /// An [`HvError::Call`] maker for `map_err`.
    pub fn call(step: &'static str) -> impl FnOnce(Errno) -> HvError {
        move |source| HvError::Call { step, source }
    }
}

/// Why a vCPU could not run (not the guest's doing).
#[derive(Debug, Error)]
#[error("the hypervisor failed to run the vCPU")]
pub struct RunError(#[source] pub Errno);

/// One return from the guest, in the VMM's own terms.
#[derive(Debug)]
pub enum ExitEvent<'a> {
    /// Port read: fill `data`.
    IoIn {
        /// Port.
        port: u16,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// Port write.
    IoOut {
        /// Port.
        port: u16,
        /// Bytes written.
        data: &'a [u8],
    },
    /// MMIO read: fill `data`.
    MmioRead {
        /// Guest-physical address.
        addr: u64,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// MMIO write.
    MmioWrite {
        /// Guest-physical address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// HLT reached userspace (no in-kernel irqchip).
    Hlt,
    /// Shutdown (triple fault).
    Shutdown,
    /// Interrupted: a kick, another signal, or `immediate_exit`.
    Intr,
    /// An exit that ends the vCPU, as the hypervisor reported it.
    Fatal(FatalExit),
    /// An exit this VMM does not expect from its guests.
    Other(&'static str),
}

/// An exit after which the vCPU cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatalExit {
    /// VM entry failed.
    FailEntry {
        /// Hardware reason.
        reason: u64,
        /// Host CPU.
        cpu: u32,
    },
    /// The hypervisor could not handle something (emulation failure, ...).
    InternalError {
        /// The hypervisor's suberror code.
        suberror: u32,
    },
    /// The guest raised a system event (reset, shutdown, crash request).
    SystemEvent {
        /// Event type.
        kind: u32,
    },
}

impl std::fmt::Display for FatalExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FatalExit::FailEntry { reason, cpu } => write!(
                f,
                "VM entry failed with hardware reason {reason:#x} on host CPU {cpu}"
            ),
            FatalExit::InternalError { suberror } => {
                write!(f, "KVM reported an internal error (suberror {suberror})")
            }
            FatalExit::SystemEvent { kind } => write!(f, "the guest raised system event {kind}"),
        }
    }
}

impl ExitEvent<'_> {
    /// The guest address (MMIO) or port (PIO) of an I/O exit.
    pub fn address(&self) -> Option<u64> {
        match self {
            ExitEvent::IoIn { port, .. } | ExitEvent::IoOut { port, .. } => Some(u64::from(*port)),
            ExitEvent::MmioRead { addr, .. } | ExitEvent::MmioWrite { addr, .. } => Some(*addr),
            _ => None,
        }
    }
}

/// Register state of a vCPU as text, for an operator reading a failure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RegsDump {
    /// Instruction pointer.
    pub rip: String,
    /// Stack pointer.
    pub rsp: String,
    /// Flags.
    pub rflags: String,
    /// RAX.
    pub rax: String,
    /// RDI.
    pub rdi: String,
    /// CR0.
    pub cr0: String,
    /// CR3.
    pub cr3: String,
    /// CR4.
    pub cr4: String,
    /// EFER.
    pub efer: String,
    /// CS selector.
    pub cs: String,
    /// SS selector.
    pub ss: String,
    /// The registers are in the CPU's reset state (CS 0xf000, RIP 0xfff0), not where the
    /// guest stopped: KVM on AMD SVM resets a vCPU after a triple fault before it returns.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
}

impl RegsDump {
    /// The dump of `r` and `s`.
    pub fn new(r: &Regs, s: &SpecialRegs) -> Self {
        let h = |v: u64| format!("{v:#x}");
        RegsDump {
            reset: s.cs.selector == 0xf000 && r.rip == 0xfff0,
            rip: h(r.rip),
            rsp: h(r.rsp),
            rflags: h(r.rflags),
            rax: h(r.rax),
            rdi: h(r.rdi),
            cr0: h(s.cr0),
            cr3: h(s.cr3),
            cr4: h(s.cr4),
            efer: h(s.efer),
            cs: h(u64::from(s.cs.selector)),
            ss: h(u64::from(s.ss.selector)),
        }
    }
}

/// A guest code stub a vCPU can run once to warm up: at `rip`, it writes to the unbacked
/// address in RAX (an MMIO exit) and jumps back to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmUpStub {
    /// Guest address of the stub (mapped by the page tables the vCPU starts with).
    pub rip: u64,
    /// The unbacked guest address it writes.
    pub target: u64,
}

/// The measured in-kernel cost of one exit round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ExitCost {
    /// Median over back-to-back round trips.
    pub hot_ns: u64,
    /// Median over round trips that follow a [`SHORT_PARK_NS`] sleep of the thread, like the
    /// first run after a park (cold caches, state reloaded).
    pub after_park_ns: u64,
    /// Median over round trips that follow a [`LONG_PARK_NS`] sleep: the first run after a
    /// long park costs more where the host's own CPU idles meanwhile (on the PVM development
    /// hosts 75-79 µs after 9 ms against 28-30 µs after 200 µs; see [`ExitCost::after_park_of`]).
    pub after_long_park_ns: u64,
}

/// The sleep before [`ExitCost::after_park_ns`]'s round trips.
pub const SHORT_PARK_NS: u64 = 200_000;
/// The sleep before [`ExitCost::after_long_park_ns`]'s round trips.
pub const LONG_PARK_NS: u64 = 8_000_000;

impl ExitCost {
    /// The round trip after a park of `park_ns`: the short park's cost up to
    /// [`SHORT_PARK_NS`], the long one's from [`LONG_PARK_NS`] on, and on the line between
    /// them in between (measured on the PVM development hosts, 2026-11-29, one sleep length a
    /// run: 28-30 µs after 200 µs, 31 µs after 1 ms, 38-59 µs after 3 ms, 75-79 µs after
    /// 9 ms). An estimate; never below the short park's cost.
    pub fn after_park_of(&self, park_ns: u64) -> u64 {
        let (short, long) = (
            self.after_park_ns,
            self.after_long_park_ns.max(self.after_park_ns),
        );
        let at = park_ns.clamp(SHORT_PARK_NS, LONG_PARK_NS) - SHORT_PARK_NS;
        let span = LONG_PARK_NS - SHORT_PARK_NS;
        short + ((u128::from(long - short) * u128::from(at)) / u128::from(span)) as u64
    }
}

/// A range of host memory mapped into the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySlot {
    /// Slot number (from `memory::SlotAllocator`).
    pub slot: u32,
    /// Guest-physical start.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
    /// Host virtual start.
    pub host_addr: u64,
}

/// An address a device wants to hear about without a userspace exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoAddr {
    /// A port.
    Pio(u16),
    /// A guest-physical address.
    Mmio(u64),
}

/// An interrupt line a device raises: an eventfd the hypervisor injects from (irqfd on KVM),
/// so raising it is one `write` from any thread and no VMM lock.
#[derive(Debug)]
pub struct IrqLine {
    gsi: u32,
    fd: EventFd,
}

impl IrqLine {
    /// A line for `gsi` signalled through `fd` (the backend registers `fd` for `gsi`).
    pub fn new(gsi: u32, fd: EventFd) -> Self {
        IrqLine { gsi, fd }
    }

    /// The global system interrupt number.
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// Raises the line (an edge; the hypervisor injects the interrupt).
    pub fn trigger(&self) -> std::io::Result<()> {
        self.fd.write(1)
    }

    /// The eventfd, for tests that watch the line.
    pub fn eventfd(&self) -> &EventFd {
        &self.fd
    }
}

/// Makes a running vCPU leave [`Vcpu::run`] soon, from any thread.
pub trait Kicker: Send + Sync {
    /// Forces the vCPU out of the guest: its current or next [`Vcpu::run`] returns
    /// [`ExitEvent::Intr`] (unless [`Vcpu::clear_kick`] runs in between, which the run loop
    /// does only before it looks at its requests).
    fn kick(&self);

    /// The signal that kicks the vCPU when it reaches the bound thread, for a POSIX timer that
    /// thread aims at itself (`SIGEV_THREAD_ID`: the kernel-armed kick of CPU limits), or None
    /// when kicks are not signals. The signal's handler also passes its `siginfo` to
    /// [`timer_signal::mark_timer_fired`], so such a timer may carry a pointer to a
    /// [`timer_signal::TimerFired`] it sets.
    fn timer_signal(&self) -> Option<libc::c_int> {
        None
    }
}

/// A hypervisor: makes VMs.
pub trait Hypervisor {
    /// Its VMs.
    type Vm: Vm;
    /// A new, empty VM.
    fn create_vm(&self) -> Result<Self::Vm, HvError>;
    /// The most vCPUs one VM may have.
    fn max_vcpus(&self) -> usize;
    /// The in-kernel cost of one exit round trip, measured on a scratch VM of its own, or
    /// None where the backend cannot measure it.
    fn exit_cost(&self) -> Option<ExitCost> {
        None
    }
    /// Why this hypervisor cannot run a guest kernel (privileged, 16- and 32-bit code at
    /// native speed), or None when it can. The PVM backend runs only 64-bit user code natively.
    fn cannot_boot_kernels(&self) -> Option<String> {
        None
    }
    /// The CPUID leaves the hypervisor can give a guest, to be trimmed and patched per vCPU.
    fn supported_cpuid(&self) -> Result<Vec<CpuidEntry>, HvError>;
}

/// A VM of a [`Hypervisor`].
pub trait Vm: Send + Sync {
    /// Its vCPUs.
    type Vcpu: Vcpu;

    /// Creates vCPU `index`.
    fn create_vcpu(&self, index: usize) -> Result<Self::Vcpu, HvError>;

    /// Maps `slot` into the guest.
    ///
    /// # Safety
    /// `[slot.host_addr, slot.host_addr + slot.size)` must be a mapping of this process that
    /// stays mapped, and is used for nothing but this guest memory, until the VM (and every
    /// vCPU created from it) is dropped: the guest reads and writes it at any time.
    unsafe fn map_memory(&self, slot: &MemorySlot) -> Result<(), HvError>;

    /// An interrupt line for `gsi` (requires an in-kernel interrupt controller).
    fn irq_line(&self, gsi: u32) -> Result<Arc<IrqLine>, HvError>;

    /// Signals `fd` when the guest writes `addr` (a 32-bit write of `datamatch`, when given;
    /// any write otherwise) without a userspace exit.
    fn register_ioevent(
        &self,
        fd: &EventFd,
        addr: IoAddr,
        datamatch: Option<u32>,
    ) -> Result<(), HvError>;

    /// Creates the PC platform in the hypervisor: interrupt controllers (PIC, IOAPIC, a LAPIC
    /// per vCPU), the PIT, and what VM entry needs below 4 GiB (KVM: TSS and identity-map
    /// pages). Called once, before the vCPUs are created. Guest HLTs are then handled in the
    /// hypervisor (no userspace exit): idle comes from its halt statistics.
    fn create_platform(&self) -> Result<(), HvError>;
}

/// A vCPU of a [`Vm`], owned by the thread that runs it.
pub trait Vcpu: Send {
    /// What other threads use to stop it.
    type Kicker: Kicker + 'static;

    /// Binds the vCPU to the calling thread and returns its kicker.
    ///
    /// # Safety
    /// The caller must call [`Vcpu::unbind_thread`] on this same thread before the vCPU is
    /// dropped or moved to another thread (the kick's signal handler writes into the vCPU's
    /// shared run structure through a thread-local pointer).
    unsafe fn bind_thread(&mut self) -> Result<Self::Kicker, RunError>;

    /// Undoes [`Vcpu::bind_thread`]; a kick that arrives later does nothing to this vCPU.
    fn unbind_thread(&mut self);

    /// Forgets a kick that arrived while the vCPU was outside the guest, so the next
    /// [`Vcpu::run`] enters the guest. The run loop calls it before it reads its requests.
    fn clear_kick(&mut self);

    /// Runs the guest until the next exit the VMM must see.
    fn run(&mut self) -> Result<ExitEvent<'_>, RunError>;

    /// Completes the I/O exit `run` last returned without entering the guest (KVM finishes an
    /// MMIO or PIO exit on the next KVM_RUN; with `immediate_exit` set that run returns at
    /// once). Needed before the registers are changed after an exit.
    fn complete_pending(&mut self);

    /// General-purpose registers.
    fn regs(&self) -> Result<Regs, HvError>;
    /// Sets the general-purpose registers.
    fn set_regs(&self, regs: &Regs) -> Result<(), HvError>;
    /// Segment, table and control registers.
    fn sregs(&self) -> Result<SpecialRegs, HvError>;
    /// Sets them (fields the VMM does not model keep their values).
    fn set_sregs(&self, sregs: &SpecialRegs) -> Result<(), HvError>;
    /// Sets the FPU control state.
    fn set_fpu(&self, fpu: &Fpu) -> Result<(), HvError>;
    /// Sets the CPUID the guest sees.
    fn set_cpuid(&self, entries: &[CpuidEntry]) -> Result<(), HvError>;
    /// Sets model-specific registers.
    fn set_msrs(&self, msrs: &[Msr]) -> Result<(), HvError>;
    /// Wires the local APIC's LINT0 to external interrupts (the PIC) and LINT1 to NMI, as
    /// firmware does on a PC (needs `Vm::create_platform`).
    fn setup_lapic_lints(&self) -> Result<(), HvError>;
    /// Whether the vCPU waits for the guest to start it (an application processor before its
    /// INIT and start-up IPI: the hypervisor blocks its runs until then).
    fn waits_for_start(&self) -> bool {
        false
    }
    /// Tells the guest's paravirtual clock that the VMM paused the vCPU (KVM:
    /// KVMCLOCK_CTRL), so the guest's watchdogs do not call the lost time a soft lockup.
    /// Best effort: a guest without a paravirtual clock has nothing to tell.
    fn pause_notify(&self) {}

    /// The vCPU's statistics file, when the hypervisor keeps one.
    fn stats(&self) -> Option<VcpuStats>;
    /// The guest's TSC frequency, when the hypervisor knows it.
    fn tsc_khz(&self) -> Option<u64>;

    /// Does, before the vCPU's clocks start, the one-time work its first run does in the
    /// hypervisor (KVM: binding the vCPU to this thread, which can wait for an RCU grace period,
    /// and loading its MMU root), by running `stub` once and restoring the registers. With no
    /// stub only the thread binding is done. Returns false when the run did not go as planned.
    fn warm_up(&mut self, stub: Option<WarmUpStub>) -> bool {
        let _ = stub;
        true
    }

    /// The registers as text, or None when the hypervisor cannot give them.
    fn dump_regs(&self) -> Option<RegsDump> {
        Some(RegsDump::new(&self.regs().ok()?, &self.sregs().ok()?))
    }
}

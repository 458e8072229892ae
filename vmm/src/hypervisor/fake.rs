//! A hypervisor that replays scripted exits, so the run loop, the devices and the accounting
//! are tested without KVM: in the unit tests, and, with the `fake-hypervisor` feature, as
//! `ppa_vmm::fake_hypervisor` for the tests under tests/ that need no `/dev/kvm`
//! (`Vm::build(config, FakeHypervisor::new(scripts))`, then `run` as on KVM). The VMM itself
//! never uses it.
//!
//! Data flow: a test gives [`FakeHypervisor::new`] one script per vCPU; each [`FakeVcpu`]'s
//! `run` spins on the CPU for the step's `spin_ns` (guest time, on the thread's CPU clock), then
//! returns the step's exit. A kick makes the current or next `run` return `Intr`; a script that
//! ends returns `Other`, which the run loop treats as a guest failure. What the VMM wrote into
//! the buffers of read exits is logged ([`FakeVcpu::reads`]) and register writes are kept.
//! Kicks can also be signals, like KVM's: [`FakeKicker::timer_signal`] names a signal whose
//! handler sets the bound vCPU's kick flag, so a vCPU's kick timer works here too; a run that
//! returns at once because a kick was already pending is counted ([`FakeVcpu::wasted`]).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use vmm_sys_util::eventfd::EventFd;

use super::{
    ExitEvent, HvError, IoAddr, IrqLine, Kicker, MemorySlot, RunError, Vcpu, VcpuStats, Vm,
};
use crate::arch::x86_64::regs::{CpuidEntry, Fpu, Msr, Regs, SpecialRegs};
use crate::sync::now_ns;

/// One exit of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeExit {
    /// MMIO write of `data` at `addr`.
    MmioWrite(u64, Vec<u8>),
    /// MMIO read of `len` bytes at `addr`.
    MmioRead(u64, usize),
    /// Port write.
    IoOut(u16, Vec<u8>),
    /// Port read of `len` bytes.
    IoIn(u16, usize),
    /// HLT.
    Hlt,
    /// Triple fault.
    Shutdown,
    /// An internal error with this suberror.
    InternalError(u32),
}

/// A script step: spin (guest code) for `spin_ns`, then exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Guest time before the exit, spent on the CPU.
    pub spin_ns: u64,
    /// The exit.
    pub exit: FakeExit,
}

impl Step {
    /// An exit with no guest time before it.
    pub fn now(exit: FakeExit) -> Step {
        Step { spin_ns: 0, exit }
    }

    /// An exit after `spin_ns` of guest time.
    pub fn after(spin_ns: u64, exit: FakeExit) -> Step {
        Step { spin_ns, exit }
    }
}

/// A hypervisor whose vCPU `i` replays script `i`.
#[derive(Debug, Default)]
pub struct FakeHypervisor {
    scripts: Arc<Mutex<Vec<Vec<Step>>>>,
}

impl FakeHypervisor {
    /// vCPU `i` of every VM replays `scripts[i]` (each script is used once).
    pub fn new(scripts: Vec<Vec<Step>>) -> Self {
        FakeHypervisor {
            scripts: Arc::new(Mutex::new(scripts)),
        }
    }
}

impl super::Hypervisor for FakeHypervisor {
    type Vm = FakeVm;

    fn create_vm(&self) -> Result<FakeVm, HvError> {
        Ok(FakeVm {
            scripts: Arc::clone(&self.scripts),
            slots: Mutex::new(Vec::new()),
        })
    }

    fn max_vcpus(&self) -> usize {
        256
    }

    fn supported_cpuid(&self) -> Result<Vec<CpuidEntry>, HvError> {
        // A plausible host: vendor leaf, feature leaf, topology, KVM's leaves.
        let e = |function, index, eax, ebx, ecx, edx| CpuidEntry {
            function,
            index,
            flags: 0,
            eax,
            ebx,
            ecx,
            edx,
        };
        Ok(vec![
            e(0, 0, 0x1f, 0x6874_7541, 0x444d_4163, 0x6974_6e65),
            e(1, 0, 0x00a5_0f00, 0x0010_0800, 0, 0x178b_fbff),
            e(4, 0, 0x7c00_4121, 0, 0, 0),
            e(0xb, 0, 1, 2, 0x100, 9),
            e(0xb, 1, 4, 16, 0x201, 9),
            e(0x4000_0000, 0, 0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d),
            e(0x4000_0001, 0, 0x0100_0eff, 0, 0, 0),
            e(0x8000_0000, 0, 0x8000_001e, 0, 0, 0),
            e(0x8000_0008, 0, 0x3030, 0, 0x7007, 0),
            e(0x8000_001e, 0, 9, 9, 9, 0),
        ])
    }
}

/// A VM of the fake hypervisor: records its memory slots.
#[derive(Debug)]
pub struct FakeVm {
    scripts: Arc<Mutex<Vec<Vec<Step>>>>,
    /// Slots mapped so far.
    pub slots: Mutex<Vec<MemorySlot>>,
}

impl Vm for FakeVm {
    type Vcpu = FakeVcpu;

    fn create_vcpu(&self, index: usize) -> Result<FakeVcpu, HvError> {
        let script = self
            .scripts
            .lock()
            .unwrap()
            .get_mut(index)
            .map(std::mem::take)
            .unwrap_or_default();
        Ok(FakeVcpu::new(script))
    }

    unsafe fn map_memory(&self, slot: &MemorySlot) -> Result<(), HvError> {
        self.slots.lock().unwrap().push(*slot);
        Ok(())
    }

    fn irq_line(&self, gsi: u32) -> Result<Arc<IrqLine>, HvError> {
        let fd = EventFd::new(0).map_err(|e| HvError::call("create an eventfd")(e.into()))?;
        Ok(Arc::new(IrqLine::new(gsi, fd)))
    }

    fn register_ioevent(&self, _: &EventFd, _: IoAddr, _: Option<u32>) -> Result<(), HvError> {
        Ok(())
    }

    fn create_platform(&self) -> Result<(), HvError> {
        Ok(())
    }
}

/// What the VMM wrote into read exits' buffers: (address or port, bytes), in order.
pub type ReadLog = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// Sets the shared flag its [`FakeVcpu`] checks.
#[derive(Debug, Clone)]
pub struct FakeKicker(Arc<AtomicBool>);

impl Kicker for FakeKicker {
    fn kick(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn timer_signal(&self) -> Option<libc::c_int> {
        install_fake_handler().then(fake_signal)
    }
}

thread_local! {
    /// The kick flag of the fake vCPU bound to this thread (null: none).
    static BOUND_FLAG: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
}

/// The fake's kick signal (not KVM's, whose handler the same test process installs).
fn fake_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN() + 1
}

extern "C" fn on_fake_kick(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo (SA_SIGINFO); the only timers delivering this signal are
    // kick timers, whose value points at their `fired` flag in the vCPU's shared state.
    unsafe { super::timer_signal::mark_timer_fired(info) };
    let p = BOUND_FLAG.with(Cell::get);
    if !p.is_null() {
        // SAFETY: set by `bind_thread` on this thread to the flag of the bound vCPU, an Arc
        // that the vCPU keeps alive until `unbind_thread` (on this thread, as `Vcpu`'s
        // contract requires) resets the pointer.
        unsafe { (*p).store(true, Ordering::Release) };
    }
}

/// Installs the fake's kick handler once per process; false if it could not be.
fn install_fake_handler() -> bool {
    static ONCE: Once = Once::new();
    static OK: AtomicBool = AtomicBool::new(false);
    ONCE.call_once(|| {
        let ok = vmm_sys_util::signal::register_signal_handler(fake_signal(), on_fake_kick);
        OK.store(ok.is_ok(), Ordering::Release);
    });
    OK.load(Ordering::Acquire)
}

/// A vCPU that replays a script.
#[derive(Debug)]
pub struct FakeVcpu {
    script: VecDeque<Step>,
    buf: Vec<u8>,
    last_read: Option<u64>,
    kicked: Arc<AtomicBool>,
    wasted: Arc<AtomicU64>,
    bound: bool,
    regs: Mutex<(Regs, SpecialRegs)>,
    reads: ReadLog,
    /// Runs that returned, kicks included.
    pub runs: u64,
    /// The CPUID the VMM set.
    pub cpuid: Mutex<Vec<CpuidEntry>>,
    /// The MSRs the VMM set, in order.
    pub msrs: Mutex<Vec<Msr>>,
}

impl FakeVcpu {
    /// A vCPU that replays `script`.
    pub fn new(script: Vec<Step>) -> Self {
        FakeVcpu {
            script: script.into(),
            buf: Vec::new(),
            last_read: None,
            kicked: Arc::new(AtomicBool::new(false)),
            wasted: Arc::new(AtomicU64::new(0)),
            bound: false,
            regs: Mutex::new(Default::default()),
            reads: Arc::new(Mutex::new(Vec::new())),
            runs: 0,
            cpuid: Mutex::new(Vec::new()),
            msrs: Mutex::new(Vec::new()),
        }
    }

    /// What the VMM put in each read exit's buffer, by address, in order.
    pub fn reads(&self) -> ReadLog {
        Arc::clone(&self.reads)
    }

    /// Runs that returned `Intr` at once because a kick was pending when they were entered
    /// (on KVM: a KVM_RUN with `immediate_exit` set, which enters the guest only to leave).
    pub fn wasted(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.wasted)
    }

    /// Spins until `ns` passed or a kick arrived; true when kicked.
    fn spin(&self, ns: u64) -> bool {
        let end = now_ns().saturating_add(ns);
        while now_ns() < end {
            if self.kicked.load(Ordering::Acquire) {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }
}

impl Vcpu for FakeVcpu {
    type Kicker = FakeKicker;

    unsafe fn bind_thread(&mut self) -> Result<FakeKicker, RunError> {
        BOUND_FLAG.with(|c| c.set(Arc::as_ptr(&self.kicked)));
        self.bound = true;
        Ok(FakeKicker(Arc::clone(&self.kicked)))
    }

    fn unbind_thread(&mut self) {
        if self.bound {
            BOUND_FLAG.with(|c| c.set(std::ptr::null()));
            self.bound = false;
        }
    }

    fn clear_kick(&mut self) {
        self.kicked.store(false, Ordering::Release);
    }

    fn run(&mut self) -> Result<ExitEvent<'_>, RunError> {
        self.runs += 1;
        if let Some(addr) = self.last_read.take() {
            self.reads.lock().unwrap().push((addr, self.buf.clone()));
        }
        if self.kicked.swap(false, Ordering::AcqRel) {
            self.wasted.fetch_add(1, Ordering::Relaxed);
            return Ok(ExitEvent::Intr);
        }
        let Some(step) = self.script.front().cloned() else {
            return Ok(ExitEvent::Other("the fake vCPU's script ended"));
        };
        if self.spin(step.spin_ns) {
            // Kicked mid-spin: the rest of the step's guest time is lost, like a real kick.
            self.kicked.store(false, Ordering::Release);
            self.script.front_mut().expect("peeked").spin_ns = 0;
            return Ok(ExitEvent::Intr);
        }
        self.script.pop_front();
        Ok(match step.exit {
            FakeExit::MmioWrite(addr, data) => {
                self.buf = data;
                ExitEvent::MmioWrite {
                    addr,
                    data: &self.buf,
                }
            }
            FakeExit::MmioRead(addr, len) => {
                self.buf = vec![0xAA; len];
                self.last_read = Some(addr);
                ExitEvent::MmioRead {
                    addr,
                    data: &mut self.buf,
                }
            }
            FakeExit::IoOut(port, data) => {
                self.buf = data;
                ExitEvent::IoOut {
                    port,
                    data: &self.buf,
                }
            }
            FakeExit::IoIn(port, len) => {
                self.buf = vec![0xAA; len];
                self.last_read = Some(u64::from(port));
                ExitEvent::IoIn {
                    port,
                    data: &mut self.buf,
                }
            }
            FakeExit::Hlt => ExitEvent::Hlt,
            FakeExit::Shutdown => ExitEvent::Shutdown,
            FakeExit::InternalError(suberror) => {
                ExitEvent::Fatal(super::FatalExit::InternalError { suberror })
            }
        })
    }

    fn complete_pending(&mut self) {}

    fn regs(&self) -> Result<Regs, HvError> {
        Ok(self.regs.lock().unwrap().0)
    }

    fn set_regs(&self, regs: &Regs) -> Result<(), HvError> {
        self.regs.lock().unwrap().0 = *regs;
        Ok(())
    }

    fn sregs(&self) -> Result<SpecialRegs, HvError> {
        Ok(self.regs.lock().unwrap().1)
    }

    fn set_sregs(&self, sregs: &SpecialRegs) -> Result<(), HvError> {
        self.regs.lock().unwrap().1 = *sregs;
        Ok(())
    }

    fn set_fpu(&self, _: &Fpu) -> Result<(), HvError> {
        Ok(())
    }

    fn set_cpuid(&self, entries: &[CpuidEntry]) -> Result<(), HvError> {
        *self.cpuid.lock().unwrap() = entries.to_vec();
        Ok(())
    }

    fn set_msrs(&self, msrs: &[Msr]) -> Result<(), HvError> {
        self.msrs.lock().unwrap().extend_from_slice(msrs);
        Ok(())
    }

    fn setup_lapic_lints(&self) -> Result<(), HvError> {
        Ok(())
    }

    fn stats(&self) -> Option<VcpuStats> {
        None
    }

    fn tsc_khz(&self) -> Option<u64> {
        Some(1_000_000)
    }
}

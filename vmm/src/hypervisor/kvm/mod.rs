//! KVM behind the hypervisor traits: `/dev/kvm`, VM and vCPU file descriptors (kvm-ioctls).
//!
//! Data flow: [`Kvm::open`] opens the device node; [`Kvm::create_vm`] gives a [`KvmVm`], whose
//! `create_vcpu` gives a [`KvmVcpu`] owning the vCPU fd and its mmapped `kvm_run`. A vCPU thread
//! binds its [`KvmVcpu`] ([`kick`]: the kick signal's handler sets `immediate_exit` through a
//! thread-local pointer), then loops on `run`, which turns each KVM_RUN result into an
//! [`ExitEvent`] (`to_event`; EINTR and EAGAIN are `Intr`; an internal error's suberror is read
//! from `kvm_run`). Register conversions are in [`x86_64`], the binary statistics reader in
//! `hypervisor::stats`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{compiler_fence, Ordering};
use std::sync::Arc;

use kvm_bindings::{kvm_run, kvm_userspace_memory_region};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VcpuExit, VcpuFd, VmFd};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{
    ExitCost, ExitEvent, FatalExit, HvError, IoAddr, IrqLine, MemorySlot, RunError, Vcpu,
    VcpuStats, Vm, WarmUpStub,
};
use crate::arch::x86_64::regs::{CpuidEntry, Fpu, Msr, Regs, SpecialRegs};

pub mod ioctls;
pub mod kick;
pub mod stats;
pub mod x86_64;

pub use kick::SignalKicker;
pub use stats::KvmStats;

/// KVM, opened on its device node.
pub struct Kvm {
    kvm: kvm_ioctls::Kvm,
}

impl Kvm {
    /// Opens `path` (normally `/dev/kvm`), with an error that says what to do when it is
    /// missing or not accessible.
    pub fn open(path: &Path) -> Result<Kvm, HvError> {
        let missing = || HvError::Missing(path.to_path_buf());
        let cpath =
            std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| missing())?;
        let kvm = kvm_ioctls::Kvm::new_with_path(&cpath).map_err(|e| match e.errno() {
            libc::ENOENT => missing(),
            libc::EACCES | libc::EPERM => HvError::Access(path.to_path_buf()),
            _ => HvError::Open {
                path: PathBuf::from(path),
                source: e,
            },
        })?;
        Ok(Kvm { kvm })
    }
}

impl super::Hypervisor for Kvm {
    type Vm = KvmVm;

    fn create_vm(&self) -> Result<KvmVm, HvError> {
        let fd = self.kvm.create_vm().map_err(HvError::call("create a VM"))?;
        Ok(KvmVm { fd })
    }

    fn max_vcpus(&self) -> usize {
        self.kvm.get_max_vcpus()
    }

    fn exit_cost(&self) -> Option<ExitCost> {
        super::calibrate::exit_cost(self, 200)
    }

    fn cannot_boot_kernels(&self) -> Option<String> {
        let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
        (loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd")).then(|| {
            "this host's KVM is the PVM backend (kvm_pvm), which runs only 64-bit user-mode guest \
             code natively and cannot boot a Linux kernel: boot Linux guests on a host with \
             kvm_intel or kvm_amd (docs/linux.md says how to test them on this machine through an \
             emulated SVM host)"
                .to_string()
        })
    }

    fn supported_cpuid(&self) -> Result<Vec<CpuidEntry>, HvError> {
        let c = self
            .kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(HvError::call("read the CPUID it supports"))?;
        Ok(c.as_slice().iter().map(x86_64::from_kvm_cpuid).collect())
    }
}

/// A KVM VM.
pub struct KvmVm {
    fd: VmFd,
}

impl Vm for KvmVm {
    type Vcpu = KvmVcpu;

    fn create_vcpu(&self, index: usize) -> Result<KvmVcpu, HvError> {
        let fd = self
            .fd
            .create_vcpu(index as u64)
            .map_err(HvError::call("create a vCPU"))?;
        Ok(KvmVcpu { fd, bound: false })
    }

    unsafe fn map_memory(&self, slot: &MemorySlot) -> Result<(), HvError> {
        let region = kvm_userspace_memory_region {
            slot: slot.slot,
            flags: 0,
            guest_phys_addr: slot.gpa,
            memory_size: slot.size,
            userspace_addr: slot.host_addr,
        };
        // SAFETY: the caller guarantees the host range stays mapped and dedicated to this guest
        // memory for the VM's whole life (this function's contract).
        unsafe { self.fd.set_user_memory_region(region) }.map_err(HvError::call("map guest memory"))
    }

    fn irq_line(&self, gsi: u32) -> Result<Arc<IrqLine>, HvError> {
        let fd = EventFd::new(EFD_NONBLOCK)
            .map_err(|e| HvError::call("create an eventfd for an interrupt line")(e.into()))?;
        self.fd
            .register_irqfd(&fd, gsi)
            .map_err(HvError::call("register an irqfd"))?;
        Ok(Arc::new(IrqLine::new(gsi, fd)))
    }

    fn register_ioevent(
        &self,
        fd: &EventFd,
        addr: IoAddr,
        datamatch: Option<u32>,
    ) -> Result<(), HvError> {
        let addr = match addr {
            IoAddr::Pio(p) => IoEventAddress::Pio(u64::from(p)),
            IoAddr::Mmio(a) => IoEventAddress::Mmio(a),
        };
        match datamatch {
            Some(v) => self.fd.register_ioevent(fd, &addr, v),
            None => self.fd.register_ioevent(fd, &addr, NoDatamatch),
        }
        .map_err(HvError::call("register an ioeventfd"))
    }

    fn create_platform(&self) -> Result<(), HvError> {
        // VMX needs three pages for the real-mode TSS and one for the identity map of
        // unrestricted guests, below 4 GiB and outside RAM: right below the firmware area at
        // the top of the 32-bit gap, as QEMU and Firecracker place them.
        self.fd
            .set_tss_address(0xfffb_d000)
            .map_err(HvError::call("set the TSS address"))?;
        self.fd
            .set_identity_map_address(0xfffb_c000)
            .map_err(HvError::call("set the identity map address"))?;
        self.fd
            .create_irq_chip()
            .map_err(HvError::call("create the interrupt controllers"))?;
        let pit = kvm_bindings::kvm_pit_config {
            flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd
            .create_pit2(pit)
            .map_err(HvError::call("create the PIT"))
    }
}

/// A KVM vCPU: its fd and mmapped `kvm_run`.
pub struct KvmVcpu {
    fd: VcpuFd,
    bound: bool,
}

impl KvmVcpu {
    fn kvm_run(&mut self) -> &mut kvm_run {
        self.fd.get_kvm_run()
    }
}

impl Drop for KvmVcpu {
    fn drop(&mut self) {
        // A vCPU dropped while still bound would leave the kick handler a dangling pointer on
        // its thread. `bind_thread`'s contract forbids it; make a breach loud in debug builds.
        debug_assert!(
            !self.bound,
            "a KVM vCPU was dropped while bound to its thread"
        );
    }
}

/// Converts KVM's view of an exit into ours (an internal error is read separately).
fn to_event(exit: VcpuExit<'_>) -> ExitEvent<'_> {
    match exit {
        VcpuExit::IoIn(port, data) => ExitEvent::IoIn { port, data },
        VcpuExit::IoOut(port, data) => ExitEvent::IoOut { port, data },
        VcpuExit::MmioRead(addr, data) => ExitEvent::MmioRead { addr, data },
        VcpuExit::MmioWrite(addr, data) => ExitEvent::MmioWrite { addr, data },
        VcpuExit::Hlt => ExitEvent::Hlt,
        VcpuExit::Shutdown => ExitEvent::Shutdown,
        VcpuExit::Intr => ExitEvent::Intr,
        VcpuExit::FailEntry(reason, cpu) => ExitEvent::Fatal(FatalExit::FailEntry { reason, cpu }),
        VcpuExit::InternalError => ExitEvent::Fatal(FatalExit::InternalError { suberror: 0 }),
        VcpuExit::SystemEvent(kind, _) => ExitEvent::Fatal(FatalExit::SystemEvent { kind }),
        VcpuExit::Exception => ExitEvent::Other("exception"),
        VcpuExit::Debug(_) => ExitEvent::Other("debug"),
        VcpuExit::Hypercall(_) => ExitEvent::Other("hypercall"),
        VcpuExit::IrqWindowOpen => ExitEvent::Other("irq window open"),
        VcpuExit::MemoryFault { .. } => ExitEvent::Other("memory fault"),
        _ => ExitEvent::Other("unknown exit reason"),
    }
}

impl Vcpu for KvmVcpu {
    type Kicker = SignalKicker;

    unsafe fn bind_thread(&mut self) -> Result<SignalKicker, RunError> {
        kick::install_handler().map_err(RunError)?;
        let p: *mut u8 = &mut self.kvm_run().immediate_exit;
        // SAFETY: `p` points into this vCPU's kvm_run mapping, which lives as long as `self.fd`;
        // our caller promises `unbind_thread` (which resets the pointer) runs on this thread
        // before the vCPU is dropped or moved, and `Drop` checks it in debug builds.
        unsafe { kick::set_immediate_exit_ptr(p) };
        self.bound = true;
        // SAFETY: gettid has no preconditions.
        Ok(SignalKicker::new(unsafe { libc::gettid() }))
    }

    fn unbind_thread(&mut self) {
        if self.bound {
            // SAFETY: null is always allowed; the handler then writes nothing.
            unsafe { kick::set_immediate_exit_ptr(std::ptr::null_mut()) };
            self.bound = false;
        }
    }

    fn clear_kick(&mut self) {
        let p: *mut u8 = &mut self.kvm_run().immediate_exit;
        // SAFETY: `p` points into the live kvm_run mapping owned by `self.fd`. The only other
        // writer is the kick handler on this same thread; a volatile byte store cannot tear.
        unsafe { std::ptr::write_volatile(p, 0) };
        // The run loop reads its request bits after this: a kick whose signal lands after the
        // clear sets the byte again, one that landed before left its bits for that read.
        compiler_fence(Ordering::SeqCst);
    }

    #[link_section = "ppa_hot"]
    fn run(&mut self) -> Result<ExitEvent<'_>, RunError> {
        let run_ptr: *const kvm_run = self.kvm_run();
        match self.fd.run() {
            Ok(VcpuExit::InternalError) => {
                // SAFETY: `run_ptr` points into the kvm_run mapping owned by `self.fd`, alive
                // for this call. KVM_EXIT_INTERNAL_ERROR means the kernel filled the `internal`
                // member of the union; its u32 suberror is valid for any bit pattern.
                let suberror = unsafe { (*run_ptr).__bindgen_anon_1.internal.suberror };
                Ok(ExitEvent::Fatal(FatalExit::InternalError { suberror }))
            }
            Ok(exit) => Ok(to_event(exit)),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Ok(ExitEvent::Intr),
            Err(e) => Err(RunError(e)),
        }
    }

    fn warm_up(&mut self, stub: Option<WarmUpStub>) -> bool {
        match stub {
            Some(stub) => super::calibrate::run_stub(self, stub),
            None => {
                // KVM_RUN with immediate_exit set binds the vCPU to this thread (the part that
                // can wait for an RCU grace period) and returns before entering the guest.
                self.complete_pending();
                true
            }
        }
    }

    fn complete_pending(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    fn regs(&self) -> Result<Regs, HvError> {
        let r = self.fd.get_regs();
        r.map(|r| x86_64::from_kvm_regs(&r))
            .map_err(HvError::call("read the vCPU's registers"))
    }

    fn set_regs(&self, regs: &Regs) -> Result<(), HvError> {
        self.fd
            .set_regs(&x86_64::to_kvm_regs(regs))
            .map_err(HvError::call("set the vCPU's registers"))
    }

    fn sregs(&self) -> Result<SpecialRegs, HvError> {
        let s = self.fd.get_sregs();
        s.map(|s| x86_64::from_kvm_sregs(&s))
            .map_err(HvError::call("read the vCPU's special registers"))
    }

    fn set_sregs(&self, sregs: &SpecialRegs) -> Result<(), HvError> {
        let mut k = self
            .fd
            .get_sregs()
            .map_err(HvError::call("read the vCPU's special registers"))?;
        x86_64::overlay_sregs(&mut k, sregs);
        self.fd
            .set_sregs(&k)
            .map_err(HvError::call("set the vCPU's special registers"))
    }

    fn set_fpu(&self, fpu: &Fpu) -> Result<(), HvError> {
        self.fd
            .set_fpu(&x86_64::to_kvm_fpu(fpu))
            .map_err(HvError::call("set the vCPU's FPU state"))
    }

    fn set_cpuid(&self, entries: &[CpuidEntry]) -> Result<(), HvError> {
        let kvm: Vec<kvm_bindings::kvm_cpuid_entry2> =
            entries.iter().map(x86_64::to_kvm_cpuid).collect();
        let cpuid = kvm_bindings::CpuId::from_entries(&kvm)
            .map_err(|_| HvError::call("take that many CPUID entries")(hv_errno(libc::E2BIG)))?;
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(HvError::call("set the vCPU's CPUID"))
    }

    fn set_msrs(&self, msrs: &[Msr]) -> Result<(), HvError> {
        let entries: Vec<kvm_bindings::kvm_msr_entry> = msrs
            .iter()
            .map(|m| kvm_bindings::kvm_msr_entry {
                index: m.index,
                data: m.value,
                ..Default::default()
            })
            .collect();
        let k = kvm_bindings::Msrs::from_entries(&entries)
            .map_err(|_| HvError::call("take that many MSRs")(hv_errno(libc::E2BIG)))?;
        let set = self
            .fd
            .set_msrs(&k)
            .map_err(HvError::call("set the vCPU's MSRs"))?;
        if set != entries.len() {
            return Err(HvError::call(
                "set every boot MSR (it stopped at one it refused)",
            )(hv_errno(libc::EINVAL)));
        }
        Ok(())
    }

    fn setup_lapic_lints(&self) -> Result<(), HvError> {
        let mut lapic = self
            .fd
            .get_lapic()
            .map_err(HvError::call("read the vCPU's local APIC"))?;
        x86_64::set_lints(&mut lapic);
        self.fd
            .set_lapic(&lapic)
            .map_err(HvError::call("set the vCPU's local APIC"))
    }

    fn waits_for_start(&self) -> bool {
        self.fd.get_mp_state().is_ok_and(|s| {
            s.mp_state == kvm_bindings::KVM_MP_STATE_UNINITIALIZED
                || s.mp_state == kvm_bindings::KVM_MP_STATE_INIT_RECEIVED
        })
    }

    fn pause_notify(&self) {
        // EINVAL: the guest has no kvm-clock; nothing to tell.
        let _ = self.fd.kvmclock_ctrl();
    }

    fn stats(&self) -> Option<VcpuStats> {
        KvmStats::from_fd(&self.fd)
            .map(|s| VcpuStats::new(Box::new(s)))
            .map_err(|e| log::warn!("no KVM statistics for a vCPU: {e}"))
            .ok()
    }

    fn tsc_khz(&self) -> Option<u64> {
        self.fd.get_tsc_khz().ok().filter(|&k| k > 0).map(u64::from)
    }
}

/// An error number as the hypervisor's error type.
fn hv_errno(e: i32) -> super::Errno {
    super::Errno::new(e)
}

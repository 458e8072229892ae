//! What the VMM gives a vCPU at entry: its boot-info record and its doorbell page. Both are
//! raw guest addresses; the types here are where trusting them happens, once.
//!
//! Data flow: `_start` turns RDI into a [`Boot`] ([`Boot::from_vmm`], unsafe: the caller
//! vouches the address is the VMM's record); from then on the addresses in the record (the
//! doorbell, the PPA page, the network window and RAM) are ones the VMM mapped, so the safe
//! functions that take a [`Boot`] (`ppa::find`, [`Boot::doorbell`]) may use them. A
//! [`Doorbell`] is only made from a [`Boot`] or, unsafely, from the ABI's fixed address, so
//! [`Doorbell::write`] is safe.

use core::ops::Deref;

use ppa_guest_abi::{doorbell, BootInfo, BOOT_INFO_MAGIC, DOORBELL_SIZE};

/// This vCPU's boot-info record as the VMM wrote it, checked: the right magic, major version
/// 1, a non-zero TSC frequency and a page-aligned doorbell. Only [`Boot::from_vmm`] makes one.
#[derive(Clone, Copy)]
pub struct Boot(&'static BootInfo);

impl Boot {
    /// The record at `boot` if it is one this guest understands; `None` when `boot` is null,
    /// misaligned, or the record is not one it understands.
    ///
    /// # Safety
    ///
    /// `boot`, when non-null and aligned, must be the record the VMM placed for this vCPU:
    /// in identity-mapped memory, initialised, never written again for the rest of the run,
    /// and whose addresses (doorbell, PPA page, network window and RAM) the VMM mapped for
    /// this vCPU as the ABI says.
    pub unsafe fn from_vmm(boot: *const BootInfo) -> Option<Boot> {
        if boot.is_null() || !boot.is_aligned() {
            return None;
        }
        // SAFETY: the caller's contract: `boot` (non-null and aligned, checked above) is the
        // VMM's record, valid and immutable for the rest of the run; `BootInfo` is all
        // integers, so any bits are a valid value.
        let b = unsafe { &*boot };
        let ok = b.magic == BOOT_INFO_MAGIC
            && b.version >> 16 == 1
            && b.tsc_khz != 0
            && b.doorbell_gpa != 0
            && b.doorbell_gpa % DOORBELL_SIZE == 0;
        ok.then_some(Boot(b))
    }

    /// This vCPU's doorbell page.
    pub fn doorbell(self) -> Doorbell {
        Doorbell {
            base: self.0.doorbell_gpa,
        }
    }
}

impl Deref for Boot {
    type Target = BootInfo;

    fn deref(&self) -> &BootInfo {
        self.0
    }
}

/// The doorbell page of this vCPU.
#[derive(Clone, Copy)]
pub struct Doorbell {
    /// Guest-physical (= virtual, identity mapped) address of the page, page aligned.
    base: u64,
}

impl Doorbell {
    /// The doorbell page at the ABI's fixed address, for when the boot record cannot be
    /// trusted.
    ///
    /// # Safety
    ///
    /// The VMM must map a doorbell page at `ppa_guest_abi::DOORBELL_GPA` (the ABI says it
    /// does, for every vCPU).
    pub unsafe fn fixed() -> Doorbell {
        Doorbell {
            base: ppa_guest_abi::DOORBELL_GPA,
        }
    }

    /// Writes `value` to the 8-byte doorbell register at `offset`: one MMIO exit. An offset
    /// outside the page or misaligned is not written.
    pub fn write(self, offset: u64, value: u64) {
        if !offset.is_multiple_of(8) || offset > DOORBELL_SIZE - 8 {
            return;
        }
        let reg = (self.base + offset) as *mut u64;
        // SAFETY: `base` is a page-aligned doorbell page the VMM maps (a `Doorbell` is only
        // made from a checked `Boot` or by the unsafe `fixed`); `offset` is 8-byte aligned
        // inside the page (checked), so `reg` is aligned and mapped. No Rust object lives
        // there, so the write aliases nothing; it is volatile so it happens exactly once, in
        // program order.
        unsafe { core::ptr::write_volatile(reg, value) }
    }

    /// Writes one console byte: one MMIO exit.
    pub fn console(self, byte: u8) {
        let reg = (self.base + doorbell::CONSOLE) as *mut u8;
        // SAFETY: as in `write`: the CONSOLE register is inside the mapped doorbell page, a
        // byte needs no alignment, no Rust object lives there, and the write is volatile.
        unsafe { core::ptr::write_volatile(reg, byte) }
    }

    /// Stops the vCPU with `code`. The VMM never resumes it; spin if it does.
    pub fn exit(self, code: u64) -> ! {
        self.write(doorbell::EXIT, code);
        loop {
            core::hint::spin_loop();
        }
    }
}

//! Guest-physical memory layout of a tiny-guest VM on x86_64.
//!
//! Everything the VMM writes into guest memory before the first KVM_RUN has its place here, as
//! constants and as pure functions of the vCPU count and RAM size:
//!
//! ```text
//! 0x0000_0000  unused page (catches null pointers as a fault, not a silent read)
//! 0x0000_1000  PML4, then PDPT, then 4 page directories (identity map of the low 4 GiB)
//! 0x0000_7000  GDT
//! 0x0000_8000  TSS with a permit-all I/O bitmap (104 + 8193 bytes)
//! 0x0001_0000  boot-info records, BOOT_INFO_SIZE bytes each, one per vCPU (256 at most)
//! 0x0010_0000  guest image (ELF PT_LOAD segments), growing up
//!     ...      free
//! ram_end      vCPU stacks, STACK_SIZE each, vCPU 0 at the top, growing down
//! 0xD000_0000  doorbell page (no memory slot: every access is an MMIO exit)
//! ```
//! RAM is one slot from 0 to `ram_end`, at most [`MAX_RAM_BYTES`] so that it stays below the
//! doorbell page.

use ppa_guest_abi::{BOOT_INFO_SIZE, DOORBELL_GPA};

/// Guest-physical address of the PML4 table.
pub const PML4_GPA: u64 = 0x1000;
/// Guest-physical address of the PDPT.
pub const PDPT_GPA: u64 = 0x2000;
/// Guest-physical address of the first of [`PD_COUNT`] page directories.
pub const PD_GPA: u64 = 0x3000;
/// Page directories: each maps 1 GiB with 2 MiB pages, 4 cover the low 4 GiB.
pub const PD_COUNT: u64 = 4;
/// Guest-physical address of the TSS.
pub const TSS_GPA: u64 = 0x8000;
/// Guest-physical address of the GDT.
pub const GDT_GPA: u64 = 0x7000;
/// Guest-physical address of vCPU 0's boot-info record.
pub const BOOT_INFO_GPA: u64 = 0x1_0000;
/// The most vCPUs a VM may have.
pub const MAX_VCPUS: usize = 256;
/// Lowest address a guest image may load at: everything below belongs to the VMM.
pub const IMAGE_MIN_GPA: u64 = 0x10_0000;
/// Size of each vCPU's stack.
pub const STACK_SIZE: u64 = 64 * 1024;
/// Largest RAM size: RAM must end below the doorbell page.
pub const MAX_RAM_BYTES: u64 = 3 << 30;
/// Guest-physical address of the PPA page: right above the largest RAM, below the doorbell
/// page, inside the identity map the page tables give (docs/abi.md).
pub const PPA_PAGE_GPA: u64 = 3 << 30;
/// Smallest RAM size.
pub const MIN_RAM_BYTES: u64 = 2 << 20;

const _: () = {
    assert!(PD_GPA + PD_COUNT * 0x1000 <= GDT_GPA);
    assert!(GDT_GPA + 0x1000 <= TSS_GPA);
    assert!(TSS_GPA + 0x3000 <= BOOT_INFO_GPA);
    assert!(BOOT_INFO_GPA + (MAX_VCPUS * BOOT_INFO_SIZE) as u64 <= IMAGE_MIN_GPA);
    assert!(MAX_RAM_BYTES <= DOORBELL_GPA);
    assert!(DOORBELL_GPA < PD_COUNT << 30);
};

/// Guest-physical address of vCPU `index`'s boot-info record.
pub fn boot_info_gpa(index: usize) -> u64 {
    BOOT_INFO_GPA + (index * BOOT_INFO_SIZE) as u64
}

/// Initial stack pointer of vCPU `index`: 8 bytes below the top of its stack, as if a call had
/// pushed a return address, so the entry function sees the ABI's stack alignment.
pub fn stack_pointer(index: usize, ram_bytes: u64) -> u64 {
    ram_bytes - index as u64 * STACK_SIZE - 8
}

/// Lowest stack address of the VM: the guest image must end at or below it.
pub fn stacks_bottom(vcpus: usize, ram_bytes: u64) -> u64 {
    ram_bytes.saturating_sub(vcpus as u64 * STACK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_infos_and_stacks_do_not_overlap() {
        assert_eq!(boot_info_gpa(0), 0x1_0000);
        assert_eq!(boot_info_gpa(255) + BOOT_INFO_SIZE as u64, 0x2_0000);
        let ram = 32 << 20;
        assert_eq!(stack_pointer(0, ram), ram - 8);
        assert_eq!(stack_pointer(1, ram), ram - STACK_SIZE - 8);
        assert_eq!(stacks_bottom(4, ram), ram - 4 * STACK_SIZE);
        assert_eq!(stacks_bottom(1000, 1 << 20), 0);
    }
}

//! Where the tiny payload puts its boot state inside guest RAM (x86_64).
//!
//! ```text
//! 0x0000_0000  unused page (catches null pointers as a fault, not a silent read)
//! 0x0000_1000  GDT
//! 0x0000_2000  TSS with a permit-all I/O bitmap (104 + 8193 bytes)
//! 0x0000_5000  warm-up stub (each vCPU thread runs it once before its clocks start)
//! 0x0000_6000  PML4, then PDPT
//! 0x0001_0000  boot-info records, BOOT_INFO_SIZE bytes each, one per vCPU (256 at most)
//! 0x0002_0000  page directories: one per GiB of the identity map (224 at most)
//! 0x0010_0000  guest image (ELF PT_LOAD segments), growing up
//!     ...      free (the memtouch window when the VM has no RAM above 4 GiB)
//! low_end      vCPU stacks, STACK_SIZE each, vCPU 0 at the top, growing down
//! ```
//! `low_end` is the end of the RAM below the 32-bit MMIO gap. The identity map covers every
//! RAM region and the gap (the doorbell page, the PPA page), so it reaches at least 4 GiB.

use ppa_guest_abi::BOOT_INFO_SIZE;

use crate::arch::x86_64::cpl3::{Cpl3Layout, GDT_SIZE, TSS_SIZE};
use crate::arch::x86_64::layout::Region;

/// The tables of the vCPUs' CPL 3 start.
pub const TABLES: Cpl3Layout = Cpl3Layout {
    gdt: 0x1000,
    tss: 0x2000,
    pml4: 0x6000,
    pdpt: 0x7000,
    pd: 0x2_0000,
};
/// Guest-physical address of the warm-up stub.
pub const WARM_UP_STUB_GPA: u64 = 0x5000;
/// Guest-physical address of vCPU 0's boot-info record.
pub const BOOT_INFO_GPA: u64 = 0x1_0000;
/// The most vCPUs the boot-info area holds.
pub const MAX_VCPUS: usize = 256;
/// Lowest address a guest image may load at: everything below belongs to the payload.
pub const IMAGE_MIN_GPA: u64 = 0x10_0000;
/// Size of each vCPU's stack.
pub const STACK_SIZE: u64 = 64 * 1024;
/// The most GiB the page directories between `TABLES.pd` and the image can map.
pub const MAX_MAP_GIB: u64 = (IMAGE_MIN_GPA - TABLES.pd) / 0x1000;

const _: () = {
    assert!(TABLES.gdt + GDT_SIZE as u64 <= TABLES.tss);
    assert!(TABLES.tss + TSS_SIZE as u64 <= WARM_UP_STUB_GPA);
    assert!(WARM_UP_STUB_GPA + 0x1000 <= TABLES.pml4);
    assert!(TABLES.pml4 + 0x1000 <= TABLES.pdpt);
    assert!(TABLES.pdpt + 0x1000 <= BOOT_INFO_GPA);
    assert!(BOOT_INFO_GPA + (MAX_VCPUS * BOOT_INFO_SIZE) as u64 <= TABLES.pd);
};

/// Guest-physical address of vCPU `index`'s boot-info record.
pub fn boot_info_gpa(index: usize) -> u64 {
    BOOT_INFO_GPA + (index * BOOT_INFO_SIZE) as u64
}

/// Initial stack pointer of vCPU `index`: 8 bytes below the top of its stack, as if a call had
/// pushed a return address, so the entry function sees the ABI's stack alignment.
pub fn stack_pointer(index: usize, low_end: u64) -> u64 {
    low_end - index as u64 * STACK_SIZE - 8
}

/// Lowest stack address of the VM: the guest image must end at or below it.
pub fn stacks_bottom(vcpus: usize, low_end: u64) -> u64 {
    low_end.saturating_sub(vcpus as u64 * STACK_SIZE)
}

/// GiB of identity map the page tables need for `ram`: up to the end of the highest region,
/// and at least the low 4 GiB (the MMIO gap holds the doorbell and PPA pages).
pub fn map_gib(ram: &[Region]) -> u64 {
    let top = ram.iter().map(Region::end).max().unwrap_or(0);
    top.div_ceil(1 << 30).max(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::layout::ram_regions;

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

    #[test]
    fn the_identity_map_covers_ram_above_4gib() {
        assert_eq!(map_gib(&ram_regions(32 << 20)), 4);
        assert_eq!(
            map_gib(&ram_regions(5 << 30)),
            6,
            "3 GiB low + 2 GiB from 4 GiB"
        );
        assert_eq!(map_gib(&ram_regions((5 << 30) + 1)), 7);
        assert_eq!(MAX_MAP_GIB, 224);
        let tables = TABLES.page_tables(map_gib(&ram_regions(5 << 30)));
        assert!(tables
            .iter()
            .all(|(gpa, _)| *gpa + 0x1000 <= IMAGE_MIN_GPA && *gpa >= TABLES.pml4));
    }
}

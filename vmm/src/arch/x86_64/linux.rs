//! The Linux x86 64-bit boot protocol: where the boot structures go, the e820 map, the zero
//! page, and the state the boot vCPU starts in (Documentation/arch/x86/boot.rst).
//!
//! Data flow: the Linux payload loads the kernel (linux-loader) at 1 MiB and the initrd at the
//! top of the RAM below the MMIO gap, then asks this module for the e820 map ([`e820`]: RAM
//! below the EBDA, RAM from 1 MiB, RAM above 4 GiB; the EBDA area and the PPA page reserved),
//! the zero page ([`zero_page`]), the boot GDT and page tables ([`boot_tables`]) and the boot
//! vCPU's registers ([`boot_regs`], [`boot_sregs`]). Everything is a pure function of its
//! inputs, unit-tested without KVM.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::layout::Region;
use super::regs::{DescriptorTable, Regs, Segment, SpecialRegs};

/// The boot GDT (4 entries).
pub const GDT_GPA: u64 = 0x500;
/// A null IDT (interrupts stay off until the kernel loads its own).
pub const IDT_GPA: u64 = 0x520;
/// The PVH start info would go here; the zero page of the 64-bit protocol is at
/// [`ZERO_PAGE_GPA`].
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// The boot stack's top (the kernel switches to its own at once).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// PML4 of the boot page tables, then the PDPT and one page directory.
pub const PML4_GPA: u64 = 0x9000;
/// PDPT.
pub const PDPT_GPA: u64 = 0xa000;
/// The page directory (the first GiB in 2 MiB pages).
pub const PD_GPA: u64 = 0xb000;
/// The kernel command line.
pub const CMDLINE_GPA: u64 = 0x2_0000;
/// Longest command line the VMM writes (the kernel's own limit is in its setup header).
pub const CMDLINE_MAX: usize = 2048;
/// The MP table, in the EBDA (where Linux scans for it).
pub const MPTABLE_GPA: u64 = 0x9_fc00;
/// Start of the legacy area (EBDA, VGA, BIOS ROMs), reserved up to 1 MiB.
pub const EBDA_START: u64 = 0x9_fc00;
/// Where the kernel loads (the 64-bit protocol's default).
pub const KERNEL_GPA: u64 = 0x10_0000;
/// The 64-bit entry point's offset from the load address of a bzImage's kernel.
pub const BZIMAGE_64BIT_ENTRY: u64 = 0x200;

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type of reserved memory.
pub const E820_RESERVED: u32 = 2;

/// The e820 map: RAM below the EBDA and from 1 MiB up to the end of low RAM, the legacy area
/// reserved, the PPA page reserved (outside RAM: Linux neither uses nor claims it, and root
/// can map it through /dev/mem), and RAM above 4 GiB.
pub fn e820(ram: &[Region], ppa_page: Option<Region>) -> Vec<boot_e820_entry> {
    let entry = |addr, size, kind| boot_e820_entry {
        addr,
        size,
        r#type: kind,
    };
    let mut out = Vec::new();
    if let Some(low) = ram.first() {
        out.push(entry(0, EBDA_START.min(low.end()), E820_RAM));
        out.push(entry(EBDA_START, KERNEL_GPA - EBDA_START, E820_RESERVED));
        if low.end() > KERNEL_GPA {
            out.push(entry(KERNEL_GPA, low.end() - KERNEL_GPA, E820_RAM));
        }
    }
    if let Some(p) = ppa_page {
        out.push(entry(p.gpa, p.size, E820_RESERVED));
    }
    for r in ram.iter().skip(1) {
        out.push(entry(r.gpa, r.size, E820_RAM));
    }
    out
}

/// Where a kernel, initrd and command line were put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// The initrd's address and size, when there is one.
    pub initrd: Option<Region>,
    /// Bytes of the command line without its NUL.
    pub cmdline_len: usize,
}

/// Why a zero page cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootError {
    /// More e820 entries than the zero page holds.
    #[error("the memory map needs {0} e820 entries; the zero page holds 128")]
    TooManyE820(usize),
    /// The initrd does not fit the 32-bit fields of the boot protocol.
    #[error("the initrd must lie below 4 GiB")]
    InitrdAbove4G,
}

/// The zero page: the kernel's setup header (from a bzImage, or a default for an ELF vmlinux)
/// completed with the command line, the initrd and the e820 map.
pub fn zero_page(
    header: Option<setup_header>,
    loaded: &Loaded,
    e820: &[boot_e820_entry],
) -> Result<boot_params, BootError> {
    let mut hdr = header.unwrap_or(setup_header {
        // An ELF kernel has no header; any alignment the kernel accepts.
        kernel_alignment: 0x0100_0000,
        ..Default::default()
    });
    hdr.type_of_loader = 0xff; // "other" boot loader
    hdr.boot_flag = 0xaa55;
    hdr.header = 0x5372_6448; // "HdrS"
    hdr.cmd_line_ptr = CMDLINE_GPA as u32;
    hdr.cmdline_size = loaded.cmdline_len as u32;
    if let Some(r) = loaded.initrd {
        let (Ok(addr), Ok(size)) = (u32::try_from(r.gpa), u32::try_from(r.size)) else {
            return Err(BootError::InitrdAbove4G);
        };
        hdr.ramdisk_image = addr;
        hdr.ramdisk_size = size;
    }
    let mut params = boot_params {
        hdr,
        ..Default::default()
    };
    if e820.len() > params.e820_table.len() {
        return Err(BootError::TooManyE820(e820.len()));
    }
    params.e820_table[..e820.len()].copy_from_slice(e820);
    params.e820_entries = e820.len() as u8;
    Ok(params)
}

/// A GDT entry from its flags (access byte in the low 8 bits, flags nibble in bits 12..16),
/// base and limit.
fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

/// The boot GDT: null, 64-bit code (0x08... the kernel reloads its own at once), data, TSS.
pub fn gdt() -> [u64; 4] {
    [
        0,
        gdt_entry(0xa09b, 0, 0xfffff), // code: present, DPL 0, L, G
        gdt_entry(0xc093, 0, 0xfffff), // data: present, DPL 0, D/B, G
        gdt_entry(0x808b, 0, 0xfffff), // TSS: present, busy
    ]
}

fn segment_of(entry: u64, index: u16) -> Segment {
    Segment {
        base: ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000),
        limit: {
            let raw = ((entry & 0xffff) | ((entry >> 32) & 0xf_0000)) as u32;
            if (entry >> 55) & 1 == 1 {
                (raw << 12) | 0xfff
            } else {
                raw
            }
        },
        selector: index * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: (entry >> 47) & 1 == 1,
        dpl: ((entry >> 45) & 3) as u8,
        db: (entry >> 54) & 1 == 1,
        s: (entry >> 44) & 1 == 1,
        l: (entry >> 53) & 1 == 1,
        g: (entry >> 55) & 1 == 1,
        unusable: (entry >> 47) & 1 == 0,
    }
}

/// The boot page tables as `(guest address, table)`: the first GiB identity-mapped with 2 MiB
/// pages (the kernel builds its own right away).
pub fn boot_tables() -> Vec<(u64, Box<[u64; 512]>)> {
    let mut pml4 = Box::new([0u64; 512]);
    pml4[0] = PDPT_GPA | 0x3;
    let mut pdpt = Box::new([0u64; 512]);
    pdpt[0] = PD_GPA | 0x3;
    let mut pd = Box::new([0u64; 512]);
    for (i, e) in pd.iter_mut().enumerate() {
        *e = ((i as u64) << 21) | 0x83;
    }
    vec![(PML4_GPA, pml4), (PDPT_GPA, pdpt), (PD_GPA, pd)]
}

/// The boot vCPU's special registers: 64-bit mode at CPL 0 on the boot GDT and tables.
pub fn boot_sregs() -> SpecialRegs {
    let g = gdt();
    let data = segment_of(g[2], 2);
    SpecialRegs {
        cs: segment_of(g[1], 1),
        ds: data,
        es: data,
        fs: data,
        gs: data,
        ss: data,
        tr: segment_of(g[3], 3),
        ldt: Segment::no_ldt(),
        gdt: DescriptorTable {
            base: GDT_GPA,
            limit: (std::mem::size_of_val(&g) - 1) as u16,
        },
        idt: DescriptorTable {
            base: IDT_GPA,
            limit: 7,
        },
        cr0: 0x8000_0011, // PG ET PE
        cr3: PML4_GPA,
        cr4: 0x20,   // PAE
        efer: 0x500, // LMA LME
    }
}

/// The boot vCPU's registers: the 64-bit entry, RSI at the zero page.
pub fn boot_regs(entry: u64) -> Regs {
    Regs {
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_GPA,
        rflags: 0x2,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::layout::ram_regions;

    #[test]
    fn e820_reserves_the_legacy_area_and_the_ppa_page_outside_ram() {
        let page = Region {
            gpa: 0xFD00_0000,
            size: 0x1_0000,
        };
        let map = e820(&ram_regions(5 << 30), Some(page));
        let t = |e: &boot_e820_entry| (e.addr, e.size, e.r#type);
        assert_eq!(
            map.iter().map(t).collect::<Vec<_>>(),
            vec![
                (0, EBDA_START, E820_RAM),
                (EBDA_START, KERNEL_GPA - EBDA_START, E820_RESERVED),
                (KERNEL_GPA, (3 << 30) - KERNEL_GPA, E820_RAM),
                (0xFD00_0000, 0x1_0000, E820_RESERVED),
                (4 << 30, 2 << 30, E820_RAM),
            ]
        );
        // No RAM entry covers any byte of the page.
        for e in map.iter().filter(|e| e.r#type == E820_RAM) {
            assert!(e.addr + e.size <= page.gpa || e.addr >= page.gpa + page.size);
        }
        let small = e820(&ram_regions(512 << 20), None);
        assert_eq!(small.len(), 3, "no high RAM, no page");
        assert_eq!(small[2].addr + small[2].size, 512 << 20);
    }

    #[test]
    fn the_zero_page_carries_the_command_line_initrd_and_map() {
        let map = e820(&ram_regions(256 << 20), None);
        let loaded = Loaded {
            initrd: Some(Region {
                gpa: 0x0f00_0000,
                size: 0x12_3456,
            }),
            cmdline_len: 42,
        };
        let p = zero_page(None, &loaded, &map).unwrap();
        let hdr = p.hdr;
        assert_eq!(
            (hdr.boot_flag, hdr.header, hdr.type_of_loader),
            (0xaa55, 0x5372_6448, 0xff)
        );
        assert_eq!(
            (hdr.cmd_line_ptr, hdr.cmdline_size),
            (CMDLINE_GPA as u32, 42)
        );
        assert_eq!(
            (hdr.ramdisk_image, hdr.ramdisk_size),
            (0x0f00_0000, 0x12_3456)
        );
        assert_eq!(p.e820_entries as usize, map.len());
        let high = Loaded {
            initrd: Some(Region {
                gpa: 5 << 30,
                size: 1,
            }),
            cmdline_len: 1,
        };
        assert_eq!(zero_page(None, &high, &map), Err(BootError::InitrdAbove4G));
        assert_eq!(
            zero_page(None, &loaded, &vec![map[0]; 129]),
            Err(BootError::TooManyE820(129))
        );
    }

    #[test]
    fn the_boot_state_is_64_bit_cpl0_over_an_identity_map() {
        let s = boot_sregs();
        assert!(s.cs.l && s.cs.present && s.cs.dpl == 0 && s.cs.selector == 8);
        assert_eq!(s.ss.selector, 0x10);
        assert!(s.ds.db && !s.ds.unusable);
        assert_eq!(s.tr.type_, 0xb, "busy TSS");
        assert_eq!(s.efer & 0x500, 0x500);
        assert_eq!(s.cr0 & 0x8000_0001, 0x8000_0001);
        let r = boot_regs(0x10_0200);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x10_0200, ZERO_PAGE_GPA, 2));
        let tables = boot_tables();
        let pd = &tables[2].1;
        assert_eq!(pd[1], (1 << 21) | 0x83, "2 MiB identity pages");
        assert_eq!(tables[0].1[0] & !0xfff, PDPT_GPA);
        // The boot structures stay below the command line and the kernel.
        assert!(PD_GPA + 0x1000 <= CMDLINE_GPA && CMDLINE_GPA + CMDLINE_MAX as u64 <= EBDA_START);
    }
}

//! The x86_64 state of a vCPU that starts in 64-bit long mode at CPL 3: page tables, GDT, TSS
//! and registers. The tiny guest's vCPUs and the exit-cost calibration's scratch VM start this
//! way (on PVM hosts only CPL 3 code runs natively).
//!
//! Pure functions of a [`Cpl3Layout`] (where the tables go) produce bytes and register values;
//! the caller writes the bytes into guest memory and hands the registers to the hypervisor.
//! The vCPU starts with CS 0x33 and SS 0x2b (the Linux user selectors), paging on over an
//! identity map of the low `map_gib` GiB made of 2 MiB user pages, interrupts off, IOPL 3 (so
//! `out` to the workload port works on VMX/SVM as it does on PVM). The descriptors are valid for
//! VMX entry checks (TR a busy 64-bit TSS, LDTR unusable) although PVM does not check them.

use super::regs::{DescriptorTable, Regs, Segment, SpecialRegs};

/// Where the tables of a CPL 3 start go in guest-physical memory (each 4 KiB aligned; the
/// page directories take `map_gib` consecutive pages from `pd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpl3Layout {
    /// PML4.
    pub pml4: u64,
    /// PDPT.
    pub pdpt: u64,
    /// First page directory.
    pub pd: u64,
    /// GDT ([`GDT_SIZE`] bytes).
    pub gdt: u64,
    /// TSS ([`TSS_SIZE`] bytes).
    pub tss: u64,
}

/// Most GiB one PDPT maps.
pub const MAX_MAP_GIB: u64 = 512;

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_HUGE: u64 = 1 << 7;
const TABLE_FLAGS: u64 = PTE_PRESENT | PTE_WRITE | PTE_USER;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// RFLAGS at entry: bit 1 (always one) and IOPL = 3; IF clear.
pub const RFLAGS_IOPL3: u64 = 0x2 | (3 << 12);
/// User code selector (GDT index 6, RPL 3), as in Linux.
pub const USER_CS: u16 = 0x33;
/// User data/stack selector (GDT index 5, RPL 3), as in Linux.
pub const USER_SS: u16 = 0x2b;
/// TSS selector (GDT index 8, a 16-byte system descriptor).
pub const TSS_SEL: u16 = 0x40;
/// Bytes of the GDT: 10 eight-byte slots (the TSS takes two).
pub const GDT_SIZE: usize = 80;
/// Offset of the I/O permission bitmap inside the TSS (right after the 104-byte TSS).
const TSS_IOMAP_BASE: u16 = 104;
/// Bytes of the TSS: header, a bitmap of 65536 ports, and the 0xff byte that must end it.
pub const TSS_SIZE: usize = TSS_IOMAP_BASE as usize + 8192 + 1;
const TSS_LIMIT: u32 = TSS_SIZE as u32 - 1;

/// The TSS bytes: all zero (no stacks are used at CPL 3) except the I/O map base and the
/// bitmap's end marker. Every port is permitted, so `in`/`out` at CPL 3 exit to the VMM even
/// where IOPL is not honoured (PVM clears it; KVM's emulator then checks this bitmap).
pub fn tss() -> Vec<u8> {
    let mut t = vec![0u8; TSS_SIZE];
    t[102..104].copy_from_slice(&TSS_IOMAP_BASE.to_le_bytes());
    t[TSS_SIZE - 1] = 0xff;
    t
}

impl Cpl3Layout {
    /// The page tables as `(guest address, 4 KiB table)` pairs: PML4 → PDPT → `map_gib` page
    /// directories of 2 MiB user pages, identity-mapping `[0, map_gib GiB)` (at most
    /// [`MAX_MAP_GIB`]).
    pub fn page_tables(&self, map_gib: u64) -> Vec<(u64, Box<[u64; 512]>)> {
        let map_gib = map_gib.min(MAX_MAP_GIB);
        let mut tables = Vec::with_capacity(2 + map_gib as usize);
        let mut pml4 = Box::new([0u64; 512]);
        pml4[0] = self.pdpt | TABLE_FLAGS;
        tables.push((self.pml4, pml4));
        let mut pdpt = Box::new([0u64; 512]);
        for i in 0..map_gib {
            pdpt[i as usize] = (self.pd + i * 0x1000) | TABLE_FLAGS;
        }
        tables.push((self.pdpt, pdpt));
        for i in 0..map_gib {
            let mut pd = Box::new([0u64; 512]);
            for (j, e) in pd.iter_mut().enumerate() {
                let gpa = (i << 30) + ((j as u64) << 21);
                *e = gpa | TABLE_FLAGS | PTE_HUGE;
            }
            tables.push((self.pd + i * 0x1000, pd));
        }
        tables
    }

    /// The GDT bytes: null, kernel code/data (unused), user data at 0x28, user code at 0x30,
    /// and a 64-bit TSS descriptor at 0x40 pointing at the layout's TSS.
    pub fn gdt(&self) -> [u8; GDT_SIZE] {
        let entries: [u64; 10] = [
            0,
            descriptor(0, 0xfffff, 0x9b, 0xa), // 0x08 kernel code, L=1
            descriptor(0, 0xfffff, 0x93, 0xc), // 0x10 kernel data
            0,
            0,
            descriptor(0, 0xfffff, 0xf3, 0xc), // 0x28 user data, DPL 3
            descriptor(0, 0xfffff, 0xfb, 0xa), // 0x30 user code, DPL 3, L=1
            0,
            descriptor(self.tss as u32, TSS_LIMIT, 0x89, 0x0), // 0x40 TSS (available)
            self.tss >> 32,                                    // upper half of the TSS base
        ];
        let mut out = [0u8; GDT_SIZE];
        for (chunk, e) in out.chunks_exact_mut(8).zip(entries) {
            chunk.copy_from_slice(&e.to_le_bytes());
        }
        out
    }

    /// The special registers for 64-bit CPL 3 over this layout's tables.
    pub fn special_regs(&self) -> SpecialRegs {
        let data = segment(USER_SS, 0x3, 3, false);
        SpecialRegs {
            cs: segment(USER_CS, 0xb, 3, true),
            ds: data,
            es: data,
            fs: data,
            gs: data,
            ss: data,
            tr: Segment {
                base: self.tss,
                limit: TSS_LIMIT,
                selector: TSS_SEL,
                type_: 0xb, // 64-bit TSS, busy
                present: true,
                ..Default::default()
            },
            ldt: Segment::no_ldt(),
            gdt: DescriptorTable {
                base: self.gdt,
                limit: (GDT_SIZE - 1) as u16,
            },
            idt: DescriptorTable::default(),
            cr3: self.pml4,
            cr4: CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT,
            cr0: CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG,
            efer: EFER_LME | EFER_LMA,
        }
    }
}

/// Builds a GDT descriptor from its parts (base, limit, access byte, flags nibble).
fn descriptor(base: u32, limit: u32, access: u8, flags: u8) -> u64 {
    let base = u64::from(base);
    let limit = u64::from(limit);
    (limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (u64::from(access) << 40)
        | (((limit >> 16) & 0xf) << 48)
        | (u64::from(flags & 0xf) << 52)
        | (((base >> 24) & 0xff) << 56)
}

fn segment(selector: u16, type_: u8, dpl: u8, long: bool) -> Segment {
    Segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: true,
        dpl,
        db: !long,
        s: true,
        l: long,
        g: true,
        unusable: false,
    }
}

/// General registers at entry: RIP at `entry`, RSP at `stack_pointer`, RDI = `arg`, IOPL 3.
pub fn entry_regs(entry: u64, stack_pointer: u64, arg: u64) -> Regs {
    Regs {
        rip: entry,
        rsp: stack_pointer,
        rdi: arg,
        rflags: RFLAGS_IOPL3,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Cpl3Layout = Cpl3Layout {
        pml4: 0x6000,
        pdpt: 0x7000,
        pd: 0x2_0000,
        gdt: 0x1000,
        tss: 0x2000,
    };

    #[test]
    fn page_tables_identity_map_the_requested_gib_with_user_pages() {
        let tables = L.page_tables(6);
        assert_eq!(tables.len(), 2 + 6);
        let (pml4_gpa, pml4) = &tables[0];
        assert_eq!(*pml4_gpa, L.pml4);
        assert_eq!(pml4[0], L.pdpt | 0x7);
        assert!(pml4[1..].iter().all(|&e| e == 0));
        let (_, pdpt) = &tables[1];
        assert_eq!(pdpt[5], (L.pd + 0x5000) | 0x7);
        assert_eq!(pdpt[6], 0, "nothing mapped past 6 GiB");
        // Walk a few addresses through the tables as the MMU would, above 4 GiB too.
        for gva in [
            0u64,
            0x10_0000,
            0x1234_5678,
            0xD000_0000,
            5 << 30,
            (6 << 30) - 1,
        ] {
            let pdpte = pdpt[(gva >> 30) as usize & 511];
            assert_eq!(
                pdpte & 0x7,
                0x7,
                "PDPT entry of {gva:#x} is present, writable, user"
            );
            let pd = &tables
                .iter()
                .find(|(a, _)| *a == pdpte & !0xfff)
                .expect("PD exists")
                .1;
            let pde = pd[(gva >> 21) as usize & 511];
            assert_eq!(pde & 0x87, 0x87, "2 MiB user page");
            assert_eq!((pde & !0x1f_ffff) | (gva & 0x1f_ffff), gva, "identity");
        }
        assert_eq!(L.page_tables(10_000).len(), 2 + MAX_MAP_GIB as usize);
    }

    #[test]
    fn gdt_selectors_match_the_user_segments() {
        let g = L.gdt();
        let entry = |sel: u16| {
            let i = usize::from(sel & !7);
            u64::from_le_bytes(g[i..i + 8].try_into().unwrap())
        };
        // Access bytes: present, DPL 3, code (0xfb) and data (0xf3).
        assert_eq!((entry(USER_CS) >> 40) & 0xff, 0xfb);
        assert_eq!((entry(USER_SS) >> 40) & 0xff, 0xf3);
        // Code is 64-bit (L set, D clear).
        assert_eq!((entry(USER_CS) >> 52) & 0xf, 0xa);
        let tss = entry(TSS_SEL);
        assert_eq!((tss >> 16) & 0xff_ffff, L.tss & 0xff_ffff);
        assert_eq!(
            (tss & 0xffff) | (((tss >> 48) & 0xf) << 16),
            u64::from(TSS_LIMIT)
        );
        let t = super::tss();
        assert_eq!(t.len(), 104 + 8192 + 1);
        assert_eq!(u16::from_le_bytes([t[102], t[103]]), 104);
        // The bit of the workload port is clear (permitted), the end marker is set.
        let port = usize::from(ppa_guest_abi::WORKLOAD_PIO_PORT);
        assert_eq!(t[104 + port / 8] & (1 << (port % 8)), 0);
        assert_eq!(t[TSS_SIZE - 1], 0xff);
    }

    #[test]
    fn sregs_are_long_mode_cpl3() {
        let s = L.special_regs();
        assert_eq!(s.cs.selector & 3, 3);
        assert_eq!(s.cs.dpl, 3);
        assert_eq!(s.ss.dpl, 3);
        assert!(s.cs.l);
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, L.pml4);
        assert_eq!(s.gdt.base, L.gdt);
        assert_eq!(s.tr.base, L.tss);
        let r = entry_regs(0x10_0000, 0x1ff_fff8, 0x1_0000);
        assert_eq!((r.rflags >> 12) & 3, 3, "IOPL 3");
        assert_eq!(r.rflags & (1 << 9), 0, "interrupts off");
        assert_eq!(r.rdi, 0x1_0000);
    }
}

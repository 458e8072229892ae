//! The x86_64 boot state of a tiny-guest vCPU: page tables, GDT, TSS and registers.
//!
//! Pure functions produce bytes and register values; `vm.rs` writes the bytes into guest memory
//! and hands the registers to KVM. Every vCPU starts in 64-bit long mode at CPL 3 (CS 0x33,
//! SS 0x2b, the Linux user selectors), paging on over an identity map of the low 4 GiB made of
//! 2 MiB user pages, interrupts off, IOPL 3 (so `out` to the workload port works on VMX/SVM as
//! it does on PVM). The descriptors are valid for VMX entry checks (TR a busy 64-bit TSS, LDTR
//! unusable) although PVM does not check them.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use super::layout::{GDT_GPA, PDPT_GPA, PD_COUNT, PD_GPA, PML4_GPA, TSS_GPA};

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

/// The page tables as `(guest address, 4 KiB table)` pairs: PML4 → PDPT → `PD_COUNT` page
/// directories of 2 MiB user pages, identity-mapping `[0, PD_COUNT GiB)`.
pub fn page_tables() -> Vec<(u64, Box<[u64; 512]>)> {
    let mut tables = Vec::with_capacity(2 + PD_COUNT as usize);
    let mut pml4 = Box::new([0u64; 512]);
    pml4[0] = PDPT_GPA | TABLE_FLAGS;
    tables.push((PML4_GPA, pml4));
    let mut pdpt = Box::new([0u64; 512]);
    for i in 0..PD_COUNT {
        pdpt[i as usize] = (PD_GPA + i * 0x1000) | TABLE_FLAGS;
    }
    tables.push((PDPT_GPA, pdpt));
    for i in 0..PD_COUNT {
        let mut pd = Box::new([0u64; 512]);
        for (j, e) in pd.iter_mut().enumerate() {
            let gpa = (i << 30) + ((j as u64) << 21);
            *e = gpa | TABLE_FLAGS | PTE_HUGE;
        }
        tables.push((PD_GPA + i * 0x1000, pd));
    }
    tables
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

/// The GDT bytes: null, kernel code/data (unused), user data at 0x28, user code at 0x30, and a
/// 64-bit TSS descriptor at 0x40 pointing at [`TSS_GPA`].
pub fn gdt() -> [u8; GDT_SIZE] {
    let entries: [u64; 10] = [
        0,
        descriptor(0, 0xfffff, 0x9b, 0xa), // 0x08 kernel code, L=1
        descriptor(0, 0xfffff, 0x93, 0xc), // 0x10 kernel data
        0,
        0,
        descriptor(0, 0xfffff, 0xf3, 0xc), // 0x28 user data, DPL 3
        descriptor(0, 0xfffff, 0xfb, 0xa), // 0x30 user code, DPL 3, L=1
        0,
        descriptor(TSS_GPA as u32, TSS_LIMIT, 0x89, 0x0), // 0x40 TSS (available)
        TSS_GPA >> 32,                                    // upper half of the TSS base
    ];
    let mut out = [0u8; GDT_SIZE];
    for (chunk, e) in out.chunks_exact_mut(8).zip(entries) {
        chunk.copy_from_slice(&e.to_le_bytes());
    }
    out
}

fn segment(selector: u16, type_: u8, dpl: u8, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets the special registers of a vCPU for 64-bit CPL 3 on top of what KVM returned.
pub fn setup_sregs(sregs: &mut kvm_sregs) {
    sregs.cs = segment(USER_CS, 0xb, 3, true);
    let data = segment(USER_SS, 0x3, 3, false);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        base: TSS_GPA,
        limit: TSS_LIMIT,
        selector: TSS_SEL,
        type_: 0xb, // 64-bit TSS, busy
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.ldt = kvm_segment {
        unusable: 1,
        type_: 0x2,
        present: 1,
        ..Default::default()
    };
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = (GDT_SIZE - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// General registers at entry: RIP at the image entry, RSP on the vCPU's stack, RDI at its
/// boot-info record.
pub fn entry_regs(entry: u64, stack_pointer: u64, boot_info: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: stack_pointer,
        rdi: boot_info,
        rflags: RFLAGS_IOPL3,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tables_identity_map_the_low_4gib_with_user_pages() {
        let tables = page_tables();
        assert_eq!(tables.len(), 2 + PD_COUNT as usize);
        let (pml4_gpa, pml4) = &tables[0];
        assert_eq!(*pml4_gpa, PML4_GPA);
        assert_eq!(pml4[0], PDPT_GPA | 0x7);
        assert!(pml4[1..].iter().all(|&e| e == 0));
        let (_, pdpt) = &tables[1];
        assert_eq!(pdpt[3], (PD_GPA + 0x3000) | 0x7);
        assert_eq!(pdpt[4], 0);
        // Walk a few addresses through the tables as the MMU would.
        for gva in [0u64, 0x10_0000, 0x1234_5678, 0xD000_0000, (4 << 30) - 1] {
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
    }

    #[test]
    fn gdt_selectors_match_the_user_segments() {
        let g = gdt();
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
        assert_eq!((tss >> 16) & 0xff_ffff, TSS_GPA & 0xff_ffff);
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
        let mut s = kvm_sregs::default();
        setup_sregs(&mut s);
        assert_eq!(s.cs.selector & 3, 3);
        assert_eq!(s.cs.dpl, 3);
        assert_eq!(s.ss.dpl, 3);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4_GPA);
        let r = entry_regs(0x10_0000, 0x1ff_fff8, 0x1_0000);
        assert_eq!((r.rflags >> 12) & 3, 3, "IOPL 3");
        assert_eq!(r.rflags & (1 << 9), 0, "interrupts off");
        assert_eq!(r.rdi, 0x1_0000);
    }
}

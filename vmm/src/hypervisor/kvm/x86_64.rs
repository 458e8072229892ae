//! Conversions between the VMM's x86_64 register types (`arch::x86_64::regs`) and KVM's.
//!
//! KVM's structures carry more than the VMM models (the interrupt bitmap, CR2, CR8, the APIC
//! base, the x87 stack): a set is a read of KVM's state, an overlay of the VMM's fields, and a
//! write, so every field the VMM does not model keeps KVM's value.

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_dtable, kvm_fpu, kvm_lapic_state, kvm_regs, kvm_segment, kvm_sregs,
};

use crate::arch::x86_64::regs::{CpuidEntry, DescriptorTable, Fpu, Regs, Segment, SpecialRegs};

/// The same general registers in another struct (KVM's and ours name them alike).
macro_rules! copy_regs {
    ($r:expr => $ty:ident) => {
        $ty {
            rax: $r.rax,
            rbx: $r.rbx,
            rcx: $r.rcx,
            rdx: $r.rdx,
            rsi: $r.rsi,
            rdi: $r.rdi,
            rsp: $r.rsp,
            rbp: $r.rbp,
            r8: $r.r8,
            r9: $r.r9,
            r10: $r.r10,
            r11: $r.r11,
            r12: $r.r12,
            r13: $r.r13,
            r14: $r.r14,
            r15: $r.r15,
            rip: $r.rip,
            rflags: $r.rflags,
        }
    };
}

/// KVM's general registers from ours.
pub fn to_kvm_regs(r: &Regs) -> kvm_regs {
    copy_regs!(r => kvm_regs)
}

/// Our general registers from KVM's.
pub fn from_kvm_regs(r: &kvm_regs) -> Regs {
    copy_regs!(r => Regs)
}

fn to_kvm_segment(s: &Segment) -> kvm_segment {
    kvm_segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: u8::from(s.present),
        dpl: s.dpl,
        db: u8::from(s.db),
        s: u8::from(s.s),
        l: u8::from(s.l),
        g: u8::from(s.g),
        avl: 0,
        unusable: u8::from(s.unusable),
        padding: 0,
    }
}

fn from_kvm_segment(s: &kvm_segment) -> Segment {
    Segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present != 0,
        dpl: s.dpl,
        db: s.db != 0,
        s: s.s != 0,
        l: s.l != 0,
        g: s.g != 0,
        unusable: s.unusable != 0,
    }
}

fn to_kvm_dtable(t: &DescriptorTable) -> kvm_dtable {
    kvm_dtable {
        base: t.base,
        limit: t.limit,
        padding: [0; 3],
    }
}

/// Lays our special registers over KVM's `k` (fields we do not model stay).
pub fn overlay_sregs(k: &mut kvm_sregs, s: &SpecialRegs) {
    k.cs = to_kvm_segment(&s.cs);
    k.ds = to_kvm_segment(&s.ds);
    k.es = to_kvm_segment(&s.es);
    k.fs = to_kvm_segment(&s.fs);
    k.gs = to_kvm_segment(&s.gs);
    k.ss = to_kvm_segment(&s.ss);
    k.tr = to_kvm_segment(&s.tr);
    k.ldt = to_kvm_segment(&s.ldt);
    k.gdt = to_kvm_dtable(&s.gdt);
    k.idt = to_kvm_dtable(&s.idt);
    k.cr0 = s.cr0;
    k.cr3 = s.cr3;
    k.cr4 = s.cr4;
    k.efer = s.efer;
}

/// Our special registers from KVM's.
pub fn from_kvm_sregs(k: &kvm_sregs) -> SpecialRegs {
    let dt = |t: &kvm_dtable| DescriptorTable {
        base: t.base,
        limit: t.limit,
    };
    SpecialRegs {
        cs: from_kvm_segment(&k.cs),
        ds: from_kvm_segment(&k.ds),
        es: from_kvm_segment(&k.es),
        fs: from_kvm_segment(&k.fs),
        gs: from_kvm_segment(&k.gs),
        ss: from_kvm_segment(&k.ss),
        tr: from_kvm_segment(&k.tr),
        ldt: from_kvm_segment(&k.ldt),
        gdt: dt(&k.gdt),
        idt: dt(&k.idt),
        cr0: k.cr0,
        cr3: k.cr3,
        cr4: k.cr4,
        efer: k.efer,
    }
}

/// KVM's FPU state with our control words (the register stack empty).
pub fn to_kvm_fpu(f: &Fpu) -> kvm_fpu {
    kvm_fpu {
        fcw: f.fcw,
        mxcsr: f.mxcsr,
        ..Default::default()
    }
}

/// The same CPUID entry in another struct (KVM's carries padding too).
macro_rules! copy_cpuid {
    ($e:expr => $ty:ident { $($extra:tt)* }) => {
        $ty {
            function: $e.function,
            index: $e.index,
            flags: $e.flags,
            eax: $e.eax,
            ebx: $e.ebx,
            ecx: $e.ecx,
            edx: $e.edx,
            $($extra)*
        }
    };
}

/// Our CPUID entry from KVM's.
pub fn from_kvm_cpuid(e: &kvm_cpuid_entry2) -> CpuidEntry {
    copy_cpuid!(e => CpuidEntry {})
}

/// KVM's CPUID entry from ours.
pub fn to_kvm_cpuid(e: &CpuidEntry) -> kvm_cpuid_entry2 {
    copy_cpuid!(e => kvm_cpuid_entry2 { padding: [0; 3] })
}

/// Offset of the LVT LINT0 register in the local APIC's register page.
const APIC_LVT0: usize = 0x350;
/// Offset of the LVT LINT1 register.
const APIC_LVT1: usize = 0x360;
/// LVT delivery mode: external interrupt (the PIC).
const APIC_MODE_EXTINT: u32 = 0x7;
/// LVT delivery mode: NMI.
const APIC_MODE_NMI: u32 = 0x4;

fn lapic_reg(l: &kvm_lapic_state, at: usize) -> u32 {
    let b = &l.regs[at..at + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_lapic_reg(l: &mut kvm_lapic_state, at: usize, v: u32) {
    for (d, s) in l.regs[at..at + 4].iter_mut().zip(v.to_le_bytes()) {
        *d = s as _;
    }
}

/// LINT0 to ExtINT and LINT1 to NMI, keeping the other LVT bits (the delivery mode is bits
/// 8..11).
pub fn set_lints(l: &mut kvm_lapic_state) {
    let mode = |v: u32, m: u32| (v & !0x700) | (m << 8);
    let lvt0 = lapic_reg(l, APIC_LVT0);
    set_lapic_reg(l, APIC_LVT0, mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = lapic_reg(l, APIC_LVT1);
    set_lapic_reg(l, APIC_LVT1, mode(lvt1, APIC_MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_round_trip_and_overlay_keeps_the_rest() {
        let r = Regs {
            rax: 1,
            rdi: 2,
            r8: 8,
            r15: 15,
            rip: 0x10_0000,
            rflags: 0x3002,
            ..Default::default()
        };
        assert_eq!(from_kvm_regs(&to_kvm_regs(&r)), r);
        let s = SpecialRegs {
            cs: Segment {
                selector: 0x33,
                l: true,
                present: true,
                dpl: 3,
                ..Default::default()
            },
            cr3: 0x1000,
            efer: 0x500,
            gdt: DescriptorTable {
                base: 0x7000,
                limit: 79,
            },
            ..Default::default()
        };
        let mut k = kvm_sregs {
            apic_base: 0xfee0_0900,
            cr8: 3,
            ..Default::default()
        };
        overlay_sregs(&mut k, &s);
        assert_eq!(from_kvm_sregs(&k), s);
        assert_eq!(k.apic_base, 0xfee0_0900, "fields we do not model stay");
        assert_eq!(k.cr8, 3);
    }

    #[test]
    fn lints_get_extint_and_nmi_and_keep_their_other_bits() {
        let mut l = kvm_lapic_state::default();
        set_lapic_reg(&mut l, APIC_LVT0, 0x0001_0000); // masked
        set_lapic_reg(&mut l, APIC_LVT1, 0x0001_0200);
        set_lints(&mut l);
        assert_eq!(lapic_reg(&l, APIC_LVT0), 0x0001_0700);
        assert_eq!(lapic_reg(&l, APIC_LVT1), 0x0001_0400);
        let e = CpuidEntry {
            function: 0x4000_0000,
            index: 1,
            flags: 1,
            eax: 2,
            ebx: 3,
            ecx: 4,
            edx: 5,
        };
        assert_eq!(from_kvm_cpuid(&to_kvm_cpuid(&e)), e);
    }
}

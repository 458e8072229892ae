//! The CPUID a Linux guest's vCPUs see, and the MSRs they start with.
//!
//! Data flow: the VM builder reads the leaves the hypervisor supports once
//! (`Hypervisor::supported_cpuid`); for each vCPU the Linux payload calls [`guest_cpuid`], which
//! keeps every supported leaf (KVM's own leaves included: kvm-clock, steal time) and patches
//! what depends on the vCPU and the VM's size: the APIC IDs (leaves 1, 0xB, 0x1F, 0x8000001E),
//! the topology (N cores of one thread in one package), the hypervisor bit; then appends the
//! VMM's own leaves (the PPA page's, beside KVM's range). [`boot_msrs`] is the MSR set every
//! vCPU starts with. Pure functions, unit-tested without KVM.

use super::regs::{CpuidEntry, Msr, CPUID_FLAG_SIGNIFICANT_INDEX};

/// Bits needed to number `n` items (0 for 1).
fn bits_for(n: usize) -> u32 {
    usize::BITS - n.saturating_sub(1).leading_zeros()
}

/// The CPUID of vCPU `vcpu` of a VM with `vcpus` vCPUs: `supported` patched for the
/// topology (one package of `vcpus` single-thread cores, APIC ID = vCPU index), with `extra`
/// leaves added (replacing any supported leaf of the same number and subleaf).
pub fn guest_cpuid(
    supported: &[CpuidEntry],
    vcpu: usize,
    vcpus: usize,
    extra: &[CpuidEntry],
) -> Vec<CpuidEntry> {
    let id = vcpu as u32;
    let n = vcpus.max(1) as u32;
    let core_shift = bits_for(vcpus.max(1));
    let mut out: Vec<CpuidEntry> = supported
        .iter()
        .filter(|e| {
            !extra
                .iter()
                .any(|x| x.function == e.function && x.index == e.index)
        })
        .copied()
        .collect();
    for e in &mut out {
        match e.function {
            1 => {
                // EBX: initial APIC ID, logical processors per package, CLFLUSH size kept.
                e.ebx = (e.ebx & 0xffff) | ((n.min(255)) << 16) | ((id & 0xff) << 24);
                e.ecx |= 1 << 31; // running under a hypervisor
                                  // HTT: the logical count above is more than one.
                if n > 1 {
                    e.edx |= 1 << 28;
                } else {
                    e.edx &= !(1 << 28);
                }
            }
            4 => {
                // Cores per package − 1 in EAX[31:26] (Intel's deterministic cache leaf).
                e.eax = (e.eax & 0x03ff_ffff) | ((n - 1).min(63) << 26);
            }
            0xb | 0x1f => {
                e.flags |= CPUID_FLAG_SIGNIFICANT_INDEX;
                e.edx = id; // x2APIC ID
                match e.index {
                    0 => {
                        // SMT level: one thread per core.
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        // Core level: every vCPU, in one package.
                        e.eax = core_shift;
                        e.ebx = n;
                        e.ecx = (2 << 8) | 1;
                    }
                    i => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = i;
                    }
                }
            }
            0x8000_0008 => {
                // AMD: cores per package − 1 and the APIC ID bits they take.
                e.ecx = (e.ecx & !0xf0ff) | (n - 1).min(255) | (core_shift << 12);
            }
            0x8000_001e => {
                // AMD topology extensions: extended APIC ID, core ID, one thread per core, one
                // node.
                e.eax = id;
                e.ebx = id & 0xff;
                e.ecx = 0;
            }
            _ => {}
        }
    }
    out.extend_from_slice(extra);
    out
}

/// The MSRs every vCPU of a Linux guest starts with: the system-call entry points cleared,
/// the TSC at 0, fast strings on, and write-back as the default memory type (as a BIOS leaves
/// them).
pub fn boot_msrs() -> Vec<Msr> {
    let m = |index, value| Msr { index, value };
    vec![
        m(0x174, 0),         // IA32_SYSENTER_CS
        m(0x175, 0),         // IA32_SYSENTER_ESP
        m(0x176, 0),         // IA32_SYSENTER_EIP
        m(0xc000_0081, 0),   // STAR
        m(0xc000_0082, 0),   // LSTAR
        m(0xc000_0083, 0),   // CSTAR
        m(0xc000_0084, 0),   // SYSCALL_MASK
        m(0xc000_0102, 0),   // KERNEL_GS_BASE
        m(0x10, 0),          // IA32_TSC
        m(0x1a0, 1),         // IA32_MISC_ENABLE: fast strings
        m(0x2ff, 0x800 | 6), // MTRRdefType: MTRRs on, write-back default
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plausible host's leaves (the fake hypervisor's).
    fn supported() -> Vec<CpuidEntry> {
        use crate::hypervisor::Hypervisor;
        crate::hypervisor::fake::FakeHypervisor::default()
            .supported_cpuid()
            .unwrap()
    }

    fn leaf(c: &[CpuidEntry], function: u32, index: u32) -> CpuidEntry {
        *c.iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap_or_else(|| panic!("leaf {function:#x}.{index}"))
    }

    #[test]
    fn topology_and_apic_ids_follow_the_vcpu_count() {
        for (vcpus, shift) in [(1usize, 0u32), (2, 1), (64, 6)] {
            for vcpu in [0, vcpus - 1] {
                let c = guest_cpuid(&supported(), vcpu, vcpus, &[]);
                let l1 = leaf(&c, 1, 0);
                assert_eq!(l1.ebx >> 24, vcpu as u32, "initial APIC ID");
                assert_eq!((l1.ebx >> 16) & 0xff, vcpus as u32, "logical count");
                assert_eq!(l1.ebx & 0xffff, 0x0800, "CLFLUSH size kept");
                assert_ne!(l1.ecx & (1 << 31), 0, "hypervisor bit");
                assert_eq!(l1.edx & (1 << 28) != 0, vcpus > 1, "HTT");
                let smt = leaf(&c, 0xb, 0);
                let core = leaf(&c, 0xb, 1);
                assert_eq!((smt.ebx, smt.ecx >> 8, smt.edx), (1, 1, vcpu as u32));
                assert_eq!(
                    (core.eax, core.ebx, core.ecx >> 8, core.edx),
                    (shift, vcpus as u32, 2, vcpu as u32)
                );
                assert_eq!(leaf(&c, 4, 0).eax >> 26, vcpus as u32 - 1);
                let amd = leaf(&c, 0x8000_0008, 0);
                assert_eq!(
                    (amd.ecx & 0xff, (amd.ecx >> 12) & 0xf),
                    (vcpus as u32 - 1, shift)
                );
                assert_eq!(leaf(&c, 0x8000_001e, 0).eax, vcpu as u32);
                assert_eq!(
                    leaf(&c, 0x4000_0000, 0).ebx,
                    0x4b4d_564b,
                    "KVM's leaves kept"
                );
            }
        }
    }

    #[test]
    fn extra_leaves_are_added_and_replace_their_numbers() {
        let extra = [
            CpuidEntry {
                function: 0x4000_0100,
                eax: 0x4000_0101,
                ..Default::default()
            },
            CpuidEntry {
                function: 0x8000_001e,
                eax: 77,
                ..Default::default()
            },
        ];
        let c = guest_cpuid(&supported(), 1, 2, &extra);
        assert_eq!(leaf(&c, 0x4000_0100, 0).eax, 0x4000_0101);
        assert_eq!(leaf(&c, 0x8000_001e, 0).eax, 77, "the extra leaf wins");
        assert_eq!(c.iter().filter(|e| e.function == 0x8000_001e).count(), 1);
    }

    #[test]
    fn boot_msrs_set_write_back_and_clear_syscall_entries() {
        let m = boot_msrs();
        assert!(m.contains(&Msr {
            index: 0x2ff,
            value: 0x806
        }));
        assert!(m.iter().any(|x| x.index == 0xc000_0082 && x.value == 0));
        let mut idx: Vec<u32> = m.iter().map(|x| x.index).collect();
        idx.sort_unstable();
        idx.dedup();
        assert_eq!(idx.len(), m.len(), "no MSR twice");
    }
}

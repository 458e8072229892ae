//! Names of the hardware exit reasons `kvm:kvm_exit` reports, for the per-reason in-kernel exit
//! counts (`kvm_exits`, `kvm_exit_ns`, the `kvm_exit_handling.REASON` histograms): VMX's basic
//! exit reasons and SVM's exit codes, spelled as the kernel's tracepoint prints them (and as
//! `perf kvm stat` does), so the figures can be compared with that tool. A code neither table
//! knows is kept as its number (`vmx_0x..`, `svm_0x..`), never dropped.

use super::switches::pairing::ExitCode;

/// `KVM_ISA_VMX` of the tracepoint's `isa` field.
pub const ISA_VMX: u8 = 1;
/// `KVM_ISA_SVM`.
pub const ISA_SVM: u8 = 2;

/// The name of an exit reason.
pub fn name(c: ExitCode) -> String {
    let (table, prefix): (&[(u32, &str)], &str) = match c.isa {
        ISA_VMX => (VMX, "vmx"),
        ISA_SVM => (SVM, "svm"),
        _ => (&[], "isa"),
    };
    match table.iter().find(|(code, _)| *code == c.code) {
        Some((_, n)) => (*n).to_string(),
        None if c.isa == ISA_VMX || c.isa == ISA_SVM => format!("{prefix}_{:#x}", c.code),
        None => format!("isa{}_{:#x}", c.isa, c.code),
    }
}

/// VMX basic exit reasons (the kernel's `VMX_EXIT_REASONS`, as `perf kvm stat` names them).
const VMX: &[(u32, &str)] = &[
    (0, "EXCEPTION_NMI"),
    (1, "EXTERNAL_INTERRUPT"),
    (2, "TRIPLE_FAULT"),
    (3, "INIT_SIGNAL"),
    (4, "SIPI_SIGNAL"),
    (7, "INTERRUPT_WINDOW"),
    (8, "NMI_WINDOW"),
    (9, "TASK_SWITCH"),
    (10, "CPUID"),
    (12, "HLT"),
    (13, "INVD"),
    (14, "INVLPG"),
    (15, "RDPMC"),
    (16, "RDTSC"),
    (18, "VMCALL"),
    (19, "VMCLEAR"),
    (20, "VMLAUNCH"),
    (21, "VMPTRLD"),
    (22, "VMPTRST"),
    (23, "VMREAD"),
    (24, "VMRESUME"),
    (25, "VMWRITE"),
    (26, "VMOFF"),
    (27, "VMON"),
    (28, "CR_ACCESS"),
    (29, "DR_ACCESS"),
    (30, "IO_INSTRUCTION"),
    (31, "MSR_READ"),
    (32, "MSR_WRITE"),
    (33, "INVALID_STATE"),
    (34, "MSR_LOAD_FAIL"),
    (36, "MWAIT_INSTRUCTION"),
    (37, "MONITOR_TRAP_FLAG"),
    (39, "MONITOR_INSTRUCTION"),
    (40, "PAUSE_INSTRUCTION"),
    (41, "MCE_DURING_VMENTRY"),
    (43, "TPR_BELOW_THRESHOLD"),
    (44, "APIC_ACCESS"),
    (45, "EOI_INDUCED"),
    (46, "GDTR_IDTR"),
    (47, "LDTR_TR"),
    (48, "EPT_VIOLATION"),
    (49, "EPT_MISCONFIG"),
    (50, "INVEPT"),
    (51, "RDTSCP"),
    (52, "PREEMPTION_TIMER"),
    (53, "INVVPID"),
    (54, "WBINVD"),
    (55, "XSETBV"),
    (56, "APIC_WRITE"),
    (57, "RDRAND"),
    (58, "INVPCID"),
    (59, "VMFUNC"),
    (60, "ENCLS"),
    (61, "RDSEED"),
    (62, "PML_FULL"),
    (63, "XSAVES"),
    (64, "XRSTORS"),
    (67, "UMWAIT"),
    (68, "TPAUSE"),
    (74, "BUS_LOCK"),
    (75, "NOTIFY"),
    (77, "TDCALL"),
    (84, "MSR_READ_IMM"),
    (85, "MSR_WRITE_IMM"),
];

/// SVM exit codes (the kernel's `SVM_EXIT_REASONS`, as `perf kvm stat` names them).
const SVM: &[(u32, &str)] = &[
    (0x0, "read_cr0"),
    (0x2, "read_cr2"),
    (0x3, "read_cr3"),
    (0x4, "read_cr4"),
    (0x8, "read_cr8"),
    (0x10, "write_cr0"),
    (0x12, "write_cr2"),
    (0x13, "write_cr3"),
    (0x14, "write_cr4"),
    (0x18, "write_cr8"),
    (0x20, "read_dr0"),
    (0x21, "read_dr1"),
    (0x22, "read_dr2"),
    (0x23, "read_dr3"),
    (0x24, "read_dr4"),
    (0x25, "read_dr5"),
    (0x26, "read_dr6"),
    (0x27, "read_dr7"),
    (0x30, "write_dr0"),
    (0x31, "write_dr1"),
    (0x32, "write_dr2"),
    (0x33, "write_dr3"),
    (0x34, "write_dr4"),
    (0x35, "write_dr5"),
    (0x36, "write_dr6"),
    (0x37, "write_dr7"),
    (0x40, "DE excp"),
    (0x41, "DB excp"),
    (0x43, "BP excp"),
    (0x44, "OF excp"),
    (0x45, "BR excp"),
    (0x46, "UD excp"),
    (0x47, "NM excp"),
    (0x48, "DF excp"),
    (0x4a, "TS excp"),
    (0x4b, "NP excp"),
    (0x4c, "SS excp"),
    (0x4d, "GP excp"),
    (0x4e, "PF excp"),
    (0x50, "MF excp"),
    (0x51, "AC excp"),
    (0x52, "MC excp"),
    (0x53, "XF excp"),
    (0x60, "interrupt"),
    (0x61, "nmi"),
    (0x62, "smi"),
    (0x63, "init"),
    (0x64, "vintr"),
    (0x65, "cr0_sel_write"),
    (0x66, "read_idtr"),
    (0x67, "read_gdtr"),
    (0x68, "read_ldtr"),
    (0x69, "read_rt"),
    (0x6a, "write_idtr"),
    (0x6b, "write_gdtr"),
    (0x6c, "write_ldtr"),
    (0x6d, "write_rt"),
    (0x6e, "rdtsc"),
    (0x6f, "rdpmc"),
    (0x70, "pushf"),
    (0x71, "popf"),
    (0x72, "cpuid"),
    (0x73, "rsm"),
    (0x74, "iret"),
    (0x75, "swint"),
    (0x76, "invd"),
    (0x77, "pause"),
    (0x78, "hlt"),
    (0x79, "invlpg"),
    (0x7a, "invlpga"),
    (0x7b, "io"),
    (0x7c, "msr"),
    (0x7d, "task_switch"),
    (0x7e, "ferr_freeze"),
    (0x7f, "shutdown"),
    (0x80, "vmrun"),
    (0x81, "hypercall"),
    (0x82, "vmload"),
    (0x83, "vmsave"),
    (0x84, "stgi"),
    (0x85, "clgi"),
    (0x86, "skinit"),
    (0x87, "rdtscp"),
    (0x88, "icebp"),
    (0x89, "wbinvd"),
    (0x8a, "monitor"),
    (0x8b, "mwait"),
    (0x8d, "xsetbv"),
    (0x8f, "write_efer_trap"),
    (0x90, "write_cr0_trap"),
    (0x94, "write_cr4_trap"),
    (0x98, "write_cr8_trap"),
    (0xa2, "invpcid"),
    (0xa5, "buslock"),
    (0xa6, "idle-halt"),
    (0x400, "npf"),
    (0x401, "avic_incomplete_ipi"),
    (0x402, "avic_unaccelerated_access"),
    (0x403, "vmgexit"),
    (0x80000001, "vmgexit_mmio_read"),
    (0x80000002, "vmgexit_mmio_write"),
    (0x80000003, "vmgexit_nmi_complete"),
    (0x80000004, "vmgexit_ap_hlt_loop"),
    (0x80000005, "vmgexit_ap_jump_table"),
    (0x80000010, "vmgexit_page_state_change"),
    (0x80000011, "vmgexit_guest_request"),
    (0x80000012, "vmgexit_ext_guest_request"),
    (0x80000013, "vmgexit_ap_creation"),
    (0x8000fffd, "vmgexit_hypervisor_feature"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_are_named_as_the_kernel_prints_them_and_others_kept_as_numbers() {
        let n = |isa, code| name(ExitCode { isa, code });
        assert_eq!(n(ISA_VMX, 10), "CPUID");
        assert_eq!(n(ISA_VMX, 48), "EPT_VIOLATION");
        assert_eq!(n(ISA_SVM, 0x72), "cpuid");
        assert_eq!(n(ISA_SVM, 0x400), "npf");
        assert_eq!(n(ISA_SVM, 0x4e), "PF excp");
        assert_eq!(n(ISA_VMX, 0x99), "vmx_0x99");
        assert_eq!(n(ISA_SVM, 0x3ff), "svm_0x3ff");
        assert_eq!(n(7, 1), "isa7_0x1");
    }
}

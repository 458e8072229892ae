//! x86_64 register state in the VMM's own terms, free of any hypervisor's types.
//!
//! Payloads (the tiny guest, Linux) compute a vCPU's boot state as these plain values with pure,
//! unit-tested functions; the hypervisor backend converts them to its own structures
//! (`hypervisor::kvm::x86_64`) and back. Only the fields the VMM sets or reports are here; a
//! backend keeps every other field of its own state as it was (read, overlay, write).

/// General-purpose registers, RIP and RFLAGS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Regs {
    /// RAX.
    pub rax: u64,
    /// RBX.
    pub rbx: u64,
    /// RCX.
    pub rcx: u64,
    /// RDX.
    pub rdx: u64,
    /// RSI.
    pub rsi: u64,
    /// RDI.
    pub rdi: u64,
    /// RSP.
    pub rsp: u64,
    /// RBP.
    pub rbp: u64,
    /// R8.
    pub r8: u64,
    /// R9.
    pub r9: u64,
    /// R10.
    pub r10: u64,
    /// R11.
    pub r11: u64,
    /// R12.
    pub r12: u64,
    /// R13.
    pub r13: u64,
    /// R14.
    pub r14: u64,
    /// R15.
    pub r15: u64,
    /// Instruction pointer.
    pub rip: u64,
    /// Flags.
    pub rflags: u64,
}

/// A segment register as the hardware caches it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segment {
    /// Base address.
    pub base: u64,
    /// Limit (in bytes, already scaled by the granularity).
    pub limit: u32,
    /// Selector.
    pub selector: u16,
    /// Type field of the access byte.
    pub type_: u8,
    /// Present.
    pub present: bool,
    /// Descriptor privilege level.
    pub dpl: u8,
    /// Default operation size (32-bit when set).
    pub db: bool,
    /// Code or data segment (not a system segment).
    pub s: bool,
    /// 64-bit code segment.
    pub l: bool,
    /// Granularity (limit in 4 KiB units in the descriptor).
    pub g: bool,
    /// Unusable (a null selector loaded, or LDTR unused).
    pub unusable: bool,
}

impl Segment {
    /// An unusable LDT (no LDT: what both the CPL 3 and the Linux boot states load).
    pub fn no_ldt() -> Segment {
        Segment {
            unusable: true,
            type_: 0x2,
            present: true,
            ..Default::default()
        }
    }
}

/// A descriptor table register (GDTR, IDTR).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    /// Base address.
    pub base: u64,
    /// Limit.
    pub limit: u16,
}

/// Segment, descriptor-table and control registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialRegs {
    /// CS.
    pub cs: Segment,
    /// DS.
    pub ds: Segment,
    /// ES.
    pub es: Segment,
    /// FS.
    pub fs: Segment,
    /// GS.
    pub gs: Segment,
    /// SS.
    pub ss: Segment,
    /// Task register.
    pub tr: Segment,
    /// LDT register.
    pub ldt: Segment,
    /// GDTR.
    pub gdt: DescriptorTable,
    /// IDTR.
    pub idt: DescriptorTable,
    /// CR0.
    pub cr0: u64,
    /// CR3.
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER.
    pub efer: u64,
}

/// The FPU/SSE control state a vCPU starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpu {
    /// x87 control word.
    pub fcw: u16,
    /// SSE control and status.
    pub mxcsr: u32,
}

impl Default for Fpu {
    /// The state after FNINIT with SSE exceptions masked (what a CPU has after reset).
    fn default() -> Self {
        Fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
        }
    }
}

/// One CPUID leaf (and subleaf) as the guest will see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuidEntry {
    /// Leaf (EAX input).
    pub function: u32,
    /// Subleaf (ECX input), when `flags` says the leaf has subleaves.
    pub index: u32,
    /// The hypervisor's flags (KVM: `KVM_CPUID_FLAG_SIGNIFCANT_INDEX` = 1).
    pub flags: u32,
    /// EAX.
    pub eax: u32,
    /// EBX.
    pub ebx: u32,
    /// ECX.
    pub ecx: u32,
    /// EDX.
    pub edx: u32,
}

/// The subleaf matters for this leaf (KVM_CPUID_FLAG_SIGNIFCANT_INDEX).
pub const CPUID_FLAG_SIGNIFICANT_INDEX: u32 = 1;

/// A model-specific register and the value it starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msr {
    /// Index.
    pub index: u32,
    /// Value.
    pub value: u64,
}

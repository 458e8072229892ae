//! x86_64-specific code: the guest memory map, register state, the CPL 3 long-mode start, the
//! Linux boot protocol, and the measurement of an exit's in-kernel cost.
//!
//! [`layout`] says where RAM, the MMIO gap and the VMM's pages go in guest-physical memory;
//! [`regs`] is register state in the VMM's own types; [`cpl3`] makes the page tables, GDT and
//! registers that put a vCPU straight into 64-bit long mode at CPL 3; [`linux`] is the Linux
//! 64-bit boot protocol (e820, zero page, boot state), [`mptable`] the MP table that lists the
//! vCPUs, [`acpi`] the ACPI tables that do the same for kernels without an MP parser, [`cpuid`] the CPUID and MSRs a Linux guest's vCPUs start with; [`calibrate`] times the
//! hypervisor's exit round trip on a scratch VM.

pub mod acpi;
pub mod calibrate;
pub mod cpl3;
pub mod cpuid;
pub mod layout;
pub mod linux;
pub mod mptable;
pub mod regs;

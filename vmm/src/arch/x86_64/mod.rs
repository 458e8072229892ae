//! x86_64-specific code: the guest memory map, register state, the CPL 3 long-mode start and
//! the Linux boot protocol. It needs nothing of the hypervisor: the hypervisor's backends use
//! its register types, and the exit-cost calibration (`hypervisor::calibrate`) its CPL 3 start.
//!
//! [`layout`] says where RAM, the MMIO gap and the VMM's pages go in guest-physical memory;
//! [`regs`] is register state in the VMM's own types; [`cpl3`] makes the page tables, GDT and
//! registers that put a vCPU straight into 64-bit long mode at CPL 3; [`linux`] is the Linux
//! 64-bit boot protocol (e820, zero page, boot state), [`mptable`] the MP table that lists the
//! vCPUs, [`acpi`] the ACPI tables that do the same for kernels without an MP parser, [`cpuid`] the CPUID and MSRs a Linux guest's vCPUs start with, [`tsc`] the host's time-stamp
//! counter as the vCPU threads' stamp clock reads it.

pub mod acpi;
pub mod cpl3;
pub mod cpuid;
pub mod layout;
pub mod linux;
pub mod mptable;
pub mod regs;
pub mod tsc;

//! x86_64-specific code: the guest memory layout and the boot state of a vCPU.
//!
//! [`layout`] says where everything goes in guest-physical memory; [`boot`] makes the page
//! tables, GDT and registers that put a vCPU straight into 64-bit long mode at CPL 3.

pub mod boot;
pub mod layout;

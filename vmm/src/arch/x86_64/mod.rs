//! x86_64-specific code: the guest memory layout, the boot state of a vCPU, and the
//! measurement of an exit's in-kernel cost.
//!
//! [`layout`] says where everything goes in guest-physical memory; [`boot`] makes the page
//! tables, GDT and registers that put a vCPU straight into 64-bit long mode at CPL 3;
//! [`calibrate`] times KVM's exit round trip with a two-instruction stub.

pub mod boot;
pub mod calibrate;
pub mod layout;

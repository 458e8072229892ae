//! PPA-VMM: a KVM virtual machine monitor built for precise CPU accounting of virtual machines.
//!
//! The library is the whole VMM; the `ppa-vmm` binary is a thin command-line adapter over it.
//! Data flow: a [`config::VmConfig`] (from the CLI, a config file, or code) becomes a
//! [`vm::Vm`] through `TryFrom`: the [`payload`] is prepared, guest [`memory`] is mapped into
//! a VM of the [`hypervisor`] (KVM behind traits), the vCPUs are created and the payload loads
//! itself and its [`devices`]. [`vm::Vm::run`] starts one thread per vCPU ([`vcpu`]), whose
//! exits go through [`exit::handle_exit`] to the device buses; [`accounting`] records where
//! every nanosecond went; other threads watch through a [`handle::VmHandle`] (the control
//! socket [`api`], the [`sampler`], the [`limits`]). When every vCPU has ended, the run
//! returns a [`report::Report`].

pub mod accounting;
pub(crate) mod api;
pub(crate) mod arch;
pub mod bench;
pub mod config;
pub(crate) mod devices;
pub mod exit;
pub mod handle;
pub(crate) mod hypervisor;
pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod metrics;
pub mod payload;
pub(crate) mod ppa_page;
pub mod report;
pub(crate) mod sampler;
pub(crate) mod sched;
pub mod sync;
pub(crate) mod vcpu;
pub mod vm;

//! PPA-VMM: a KVM virtual machine monitor built for precise CPU accounting of virtual machines.
//!
//! The library is the whole VMM; the `ppa-vmm` binary is a thin command-line adapter over it.
//! Data flow: a [`config::VmConfig`] (from the CLI, a config file, or code) becomes a
//! [`vm::Vm`] through `TryFrom`; [`vm::Vm::run`] starts one thread per vCPU ([`vcpu`]), whose
//! exits go through [`exit::handle_exit`] to the [`bus`] and its [`devices`]; when every vCPU
//! has ended, the run returns a [`report::Report`].

pub mod accounting;
pub mod api;
pub mod arch;
pub mod bench;
pub mod bus;
pub mod config;
pub mod devices;
pub mod exit;
pub mod kick;
pub mod kvm_stats;
pub mod limits;
pub mod loader;
pub mod metrics;
pub mod ppa_page;
pub mod report;
pub mod sampler;
pub mod sched;
pub mod vcpu;
pub mod vm;
pub mod workload;

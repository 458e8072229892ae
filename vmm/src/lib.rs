//! PPA-VMM: a KVM virtual machine monitor built for precise CPU accounting of virtual machines.
//!
//! The library is the whole VMM; the `ppa-vmm` binary (the `ppa-vmm-cli` package, cli/) is a
//! thin command-line adapter over it, with the socket's clients and the benchmarks.
//! Data flow: a [`config::VmConfig`] (from the CLI, a config file, or code) becomes a
//! [`vm::Vm`] through `TryFrom`: the [`payload`] is prepared, guest [`memory`] is mapped into
//! a VM of the [`hypervisor`] (KVM behind traits), the vCPUs are created and the payload loads
//! itself and its [`devices`]. [`vm::Vm::run`] starts one thread per vCPU ([`vcpu`]), whose
//! exits go through [`exit::handle_exit`] to the device buses; [`accounting`] records where
//! every nanosecond went; other threads watch through a [`handle::VmHandle`] (the control
//! socket [`api`], the [`sampler`], the [`limits`]; the binary's [`signals`] thread, which
//! turns SIGTERM, SIGINT and SIGHUP into a shutdown). When every vCPU has ended, the run
//! returns a [`report::Report`].

/// Declares a fieldless enum whose variants index per-kind counter arrays and carry the name
/// reports use (also their serde name): `COUNT`, `ALL` in index order, `index()`, `name()`.
macro_rules! indexed_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
        $vis enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $v,)*
        }

        impl $name {
            /// Number of variants.
            pub const COUNT: usize = [$($name::$v),*].len();
            /// Every variant, in index order.
            pub const ALL: [$name; Self::COUNT] = [$($name::$v),*];

            /// Index into per-variant arrays.
            pub fn index(self) -> usize {
                self as usize
            }

            /// The name used in reports.
            pub fn name(self) -> &'static str {
                [$($s),*][self as usize]
            }
        }
    };
}

pub mod accounting;
pub(crate) mod api;
pub(crate) mod arch;
pub(crate) mod calibration_cache;
pub mod config;
pub mod devices;
pub(crate) mod event_hub;
pub mod exit;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod handle;
pub(crate) mod hypervisor;
/// The fake hypervisor (feature `fake-hypervisor`): [`vm::Vm::build`] on a
/// [`fake_hypervisor::FakeHypervisor`] runs a whole VM whose vCPUs replay scripted exits, so
/// tests of what does not depend on KVM (the control protocol, the report, the limits) run on
/// a host without `/dev/kvm`.
#[cfg(feature = "fake-hypervisor")]
pub use hypervisor::fake as fake_hypervisor;
pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod metrics;
pub mod notify;
pub(crate) mod owned_files;
pub mod payload;
pub mod placement;
pub(crate) mod ppa_page;
pub mod pressure;
pub mod probes;
pub mod report;
pub(crate) mod sampler;
pub(crate) mod sched;
pub mod seccomp;
pub mod signals;
pub(crate) mod stamp_clock;
pub mod sync;
pub mod vdso;
/// The control socket's Unix-socket rules, for the binary's other socket (`ppa-vmm
/// firecracker`'s API socket): mode 0600 from the start, a stale file replaced and a live one
/// refused, removed at the end (and by a forced exit) only while it is still ours.
pub mod unix_socket {
    pub use crate::api::unix::{bind_unix, remove_socket_file};
    pub use crate::api::SocketError;
}
pub(crate) mod vcpu;
pub mod vm;

#[cfg(test)]
mod layering_tests;

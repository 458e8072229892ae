//! The control socket (spec section 6, docs/control.md) and the HTTP /metrics endpoint.
//!
//! Data flow: `Vm::run` starts an [`ApiServer`] before the vCPUs when `--api-sock` or
//! `--metrics-addr` is given. Its `api` thread ([`server`]) accepts clients, splits their
//! bytes into request lines ([`conn`]), hands each line to the [`handler`], which reads the
//! VM through a `VmHandle` and returns one response line, and streams events that the run
//! loop pushes into the `EventHub` (`crate::event_hub`). What each client may hold (caps, time limits,
//! output budget) and the counters of what happened to clients are in [`listen`]. The
//! protocol's types live in the `ppa-vmm-api` crate, which clients use without linking KVM
//! code.

pub mod board;
pub mod conn;
pub mod handler;
pub mod http;
pub mod listen;
#[cfg(test)]
mod schema_tests;
mod serve;
pub mod server;
pub mod unix;

pub use listen::ClientLimits;
pub use server::{ApiServer, ServerOptions};

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum SocketError {
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; remove it or choose another path")]
    NotASocket(PathBuf),
    /// Another process serves the path.
    #[error("another process already serves {0}")]
    InUse(PathBuf),
    /// The path is too long for a Unix socket address.
    #[error("the socket path {0} is longer than a Unix socket address allows (107 bytes)")]
    PathTooLong(PathBuf),
    /// The directory that would hold the socket does not exist.
    #[error("cannot serve the control socket at {path}: the directory {dir} does not exist")]
    NoDirectory {
        /// The socket path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// Binding the Unix socket failed.
    #[error("cannot serve the control socket at {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Binding the metrics address failed.
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The event loop could not be set up.
    #[error("cannot set up the control socket's event loop: {0}")]
    EventLoop(String),
    /// The thread could not be started.
    #[error("cannot start the control socket thread")]
    Spawn(#[source] io::Error),
}

/// Synthetic VMs for unit tests and the fuzz checks: vCPUs that never ran, with meters a test
/// can drive.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod tests_support {
    use std::sync::Arc;

    use crate::accounting::meter::VcpuMeter;
    use crate::accounting::snapshot::VcpuAccounting;
    use crate::accounting::{AccountingControl, Level, Thresholds};
    use crate::handle::{VmHandle, VmStatus};
    use crate::vcpu::VcpuShared;

    /// A handle on `n` vCPUs that have not started.
    pub fn handle(n: usize) -> VmHandle {
        let control = Arc::new(AccountingControl::new(
            Level::Basic,
            Thresholds::default(),
            3,
            10_000_000,
        ));
        let vcpus: Vec<Arc<VcpuShared>> = (0..n)
            .map(|id| {
                let meter = Arc::new(VcpuMeter::new(3, 2));
                Arc::new(VcpuShared::new(id, VcpuAccounting::new(meter, None, None)))
            })
            .collect();
        let limiter = Arc::new(crate::limits::limiter::Limiter::new(
            &Default::default(),
            vcpus.clone(),
            None,
            30_000,
        ));
        VmHandle::new(
            control,
            vcpus,
            Arc::new(VmStatus::new("test \"vm\"".into())),
            limiter,
            None,
        )
    }
}

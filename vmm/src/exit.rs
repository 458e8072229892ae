//! Exit handling as a pure function: an exit in, its reason and what the vCPU does next out.
//!
//! Data flow: the vCPU loop (`vcpu::run`) gets each [`ExitEvent`] from the hypervisor seam (our
//! own type, free of KVM's), calls [`handle_exit`] with the VM's [`Buses`], and carries out the
//! [`Outcome`]: resume, a device's [`VcpuRequest`] (exit, park, stop), or a guest failure.
//! Nothing here touches the hypervisor, clocks or threads, so every exit kind is unit-tested with
//! synthetic exits.

use std::fmt;

pub use crate::accounting::ExitReason;
use crate::devices::{Buses, VcpuRequest};
pub use crate::hypervisor::{ExitEvent, FatalExit};

/// Why a vCPU stopped for good, decided by the guest's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// KVM_EXIT_SHUTDOWN: a triple fault (at CPL 3 with no IDT: any exception).
    Shutdown,
    /// Entry failed, an internal error or a system event.
    Fatal(FatalExit),
    /// An unexpected exit.
    Unexpected(&'static str),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Shutdown => {
                write!(
                    f,
                    "the vCPU shut down (triple fault: an exception with no handler)"
                )
            }
            Failure::Fatal(e) => e.fmt(f),
            Failure::Unexpected(what) => write!(f, "unexpected exit: {what}"),
        }
    }
}

/// What the vCPU does after an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Resume the guest.
    Resume,
    /// Carry out a device's request.
    Request(VcpuRequest),
    /// The vCPU is dead.
    Fail(Failure),
}

impl From<Option<VcpuRequest>> for Outcome {
    fn from(r: Option<VcpuRequest>) -> Self {
        r.map_or(Outcome::Resume, Outcome::Request)
    }
}

/// Handles one exit of vCPU `vcpu`: classifies it and routes I/O to the buses. In the
/// exit path's `ppa_hot` section (`vcpu::run::run_loop` says why).
#[link_section = "ppa_hot"]
pub fn handle_exit(event: ExitEvent<'_>, buses: &Buses, vcpu: usize) -> (ExitReason, Outcome) {
    match event {
        ExitEvent::IoIn { port, data } => (
            ExitReason::IoIn,
            buses.pio.read(vcpu, u64::from(port), data).into(),
        ),
        ExitEvent::IoOut { port, data } => (
            ExitReason::IoOut,
            buses.pio.write(vcpu, u64::from(port), data).into(),
        ),
        ExitEvent::MmioRead { addr, data } => (
            ExitReason::MmioRead,
            buses.mmio.read(vcpu, addr, data).into(),
        ),
        ExitEvent::MmioWrite { addr, data } => (
            ExitReason::MmioWrite,
            buses.mmio.write(vcpu, addr, data).into(),
        ),
        // With no in-kernel irqchip only the VMM can end a HLT: park until kicked.
        ExitEvent::Hlt => (
            ExitReason::Hlt,
            Outcome::Request(VcpuRequest::Park { deadline_ns: None }),
        ),
        ExitEvent::Intr => (ExitReason::Intr, Outcome::Resume),
        ExitEvent::Shutdown => (ExitReason::Shutdown, Outcome::Fail(Failure::Shutdown)),
        ExitEvent::Fatal(e) => {
            let reason = match e {
                FatalExit::FailEntry { .. } => ExitReason::FailEntry,
                FatalExit::InternalError { .. } => ExitReason::InternalError,
                FatalExit::SystemEvent { .. } => ExitReason::SystemEvent,
            };
            (reason, Outcome::Fail(Failure::Fatal(e)))
        }
        ExitEvent::Other(what) => (ExitReason::Other, Outcome::Fail(Failure::Unexpected(what))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ppa_guest_abi::{doorbell, DOORBELL_GPA, WORKLOAD_PIO_PORT};

    use super::*;
    use crate::devices::tiny::{Doorbell, TinyBoard};

    fn buses(board: &Arc<TinyBoard>) -> Buses {
        let mut b = Buses::new(1);
        crate::devices::tiny::install(board, &mut b).unwrap();
        b
    }

    fn h(e: ExitEvent<'_>) -> (ExitReason, Outcome) {
        handle_exit(e, &buses(&TinyBoard::new(1)), 0)
    }

    #[test]
    fn routes_synthetic_exits() {
        assert!(matches!(
            h(ExitEvent::MmioWrite {
                addr: DOORBELL_GPA + doorbell::HALT,
                data: &5000u64.to_le_bytes()
            }),
            (
                ExitReason::MmioWrite,
                Outcome::Request(VcpuRequest::Park {
                    deadline_ns: Some(_)
                })
            )
        ));
        assert_eq!(
            h(ExitEvent::MmioWrite {
                addr: DOORBELL_GPA + doorbell::EXIT,
                data: &[3, 0, 0, 0]
            }),
            (
                ExitReason::MmioWrite,
                Outcome::Request(VcpuRequest::Exit(3))
            )
        );
        let board = TinyBoard::new(1);
        let b = buses(&board);
        assert_eq!(
            handle_exit(
                ExitEvent::IoOut {
                    port: WORKLOAD_PIO_PORT,
                    data: &[1, 2, 3, 4]
                },
                &b,
                0
            ),
            (ExitReason::IoOut, Outcome::Resume)
        );
        assert_eq!(board.vcpu(0).unwrap().doorbell(Doorbell::WorkloadPio), 1);
        let mut buf = [0xffu8; 4];
        assert_eq!(
            handle_exit(
                ExitEvent::IoIn {
                    port: 0x80,
                    data: &mut buf
                },
                &b,
                0
            ),
            (ExitReason::IoIn, Outcome::Resume)
        );
        assert_eq!(buf, [0; 4], "unclaimed port reads as zeros");
        let mut buf = [0xffu8; 8];
        assert_eq!(
            handle_exit(
                ExitEvent::MmioRead {
                    addr: 0x4000_0000,
                    data: &mut buf
                },
                &b,
                0
            ),
            (ExitReason::MmioRead, Outcome::Resume)
        );
        assert_eq!(buf, [0; 8]);
        assert_eq!(b.unclaimed(0), 2);
    }

    #[test]
    fn classifies_failures() {
        assert_eq!(
            h(ExitEvent::Shutdown),
            (ExitReason::Shutdown, Outcome::Fail(Failure::Shutdown))
        );
        assert_eq!(
            h(ExitEvent::Fatal(FatalExit::FailEntry { reason: 7, cpu: 1 })),
            (
                ExitReason::FailEntry,
                Outcome::Fail(Failure::Fatal(FatalExit::FailEntry { reason: 7, cpu: 1 }))
            )
        );
        assert_eq!(h(ExitEvent::Intr), (ExitReason::Intr, Outcome::Resume));
        assert_eq!(
            h(ExitEvent::Hlt),
            (
                ExitReason::Hlt,
                Outcome::Request(VcpuRequest::Park { deadline_ns: None })
            )
        );
        assert_eq!(h(ExitEvent::Other("debug")).0, ExitReason::Other);
        assert_eq!(
            h(ExitEvent::Fatal(FatalExit::InternalError { suberror: 1 })).0,
            ExitReason::InternalError
        );
        assert_eq!(
            h(ExitEvent::Fatal(FatalExit::SystemEvent { kind: 2 })).0,
            ExitReason::SystemEvent
        );
        assert!(Failure::Shutdown.to_string().contains("triple fault"));
    }

    #[test]
    fn reason_names_are_in_index_order() {
        for (i, r) in ExitReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(ExitReason::MmioWrite.name(), "mmio_write");
        assert_eq!(
            serde_json::to_string(&ExitReason::FailEntry).unwrap(),
            "\"fail_entry\""
        );
    }
}

//! Exit handling as a pure function: a KVM exit in, its reason and what to do next out.
//!
//! Data flow: the vCPU loop (`vcpu.rs`) turns each KVM_RUN result into an [`ExitEvent`] (our
//! own type, free of KVM's), calls [`handle_exit`] with the VM's buses, and carries out the
//! [`Outcome`]: resume, a device action (console, halt, report, exit), or a guest failure.
//! Nothing here touches KVM, clocks or threads, so every exit kind is unit-tested with synthetic
//! exits.

use std::fmt;

use serde::Serialize;

use crate::bus::{Bus, DeviceAction};

/// Userspace exit reasons, the keys of the per-vCPU `exits` counts (spec section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// Port read.
    IoIn,
    /// Port write.
    IoOut,
    /// MMIO read.
    MmioRead,
    /// MMIO write.
    MmioWrite,
    /// HLT with no in-kernel irqchip.
    Hlt,
    /// Triple fault or other shutdown.
    Shutdown,
    /// KVM_RUN interrupted by a signal or `immediate_exit` (a kick).
    Intr,
    /// The hardware refused VM entry.
    FailEntry,
    /// KVM could not handle something (emulation failure, ...).
    InternalError,
    /// A system event (reset, shutdown, crash request).
    SystemEvent,
    /// Anything else.
    Other,
}

impl ExitReason {
    /// Number of reasons.
    pub const COUNT: usize = 11;
    /// Every reason, in index order.
    pub const ALL: [ExitReason; Self::COUNT] = [
        ExitReason::IoIn,
        ExitReason::IoOut,
        ExitReason::MmioRead,
        ExitReason::MmioWrite,
        ExitReason::Hlt,
        ExitReason::Shutdown,
        ExitReason::Intr,
        ExitReason::FailEntry,
        ExitReason::InternalError,
        ExitReason::SystemEvent,
        ExitReason::Other,
    ];

    /// Index into per-reason arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        [
            "io_in",
            "io_out",
            "mmio_read",
            "mmio_write",
            "hlt",
            "shutdown",
            "intr",
            "fail_entry",
            "internal_error",
            "system_event",
            "other",
        ][self.index()]
    }
}

/// One KVM_RUN result, in our own terms.
#[derive(Debug)]
pub enum ExitEvent<'a> {
    /// Port read: fill `data`.
    IoIn {
        /// Port.
        port: u16,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// Port write.
    IoOut {
        /// Port.
        port: u16,
        /// Bytes written.
        data: &'a [u8],
    },
    /// MMIO read: fill `data`.
    MmioRead {
        /// Guest-physical address.
        addr: u64,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// MMIO write.
    MmioWrite {
        /// Guest-physical address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// HLT reached userspace.
    Hlt,
    /// Shutdown (triple fault).
    Shutdown,
    /// Interrupted (kick or signal).
    Intr,
    /// VM entry failed.
    FailEntry {
        /// Hardware reason.
        reason: u64,
        /// Host CPU.
        cpu: u32,
    },
    /// KVM internal error.
    InternalError {
        /// KVM's suberror code.
        suberror: u32,
    },
    /// System event.
    SystemEvent {
        /// Event type.
        kind: u32,
    },
    /// An exit this VMM does not expect from its guests.
    Other(&'static str),
}

/// Why a vCPU stopped for good, decided by the guest's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// KVM_EXIT_SHUTDOWN: a triple fault (at CPL 3 with no IDT: any exception).
    Shutdown,
    /// VM entry failed.
    FailEntry {
        /// Hardware reason.
        reason: u64,
        /// Host CPU.
        cpu: u32,
    },
    /// KVM internal error.
    InternalError {
        /// Suberror.
        suberror: u32,
    },
    /// The guest asked for a system event (reset, shutdown, crash).
    SystemEvent {
        /// Event type.
        kind: u32,
    },
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
            Failure::FailEntry { reason, cpu } => write!(
                f,
                "VM entry failed with hardware reason {reason:#x} on host CPU {cpu}"
            ),
            Failure::InternalError { suberror } => {
                write!(f, "KVM reported an internal error (suberror {suberror})")
            }
            Failure::SystemEvent { kind } => write!(f, "the guest raised system event {kind}"),
            Failure::Unexpected(what) => write!(f, "unexpected exit: {what}"),
        }
    }
}

/// What the vCPU does after an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Carry out a device's action, then resume (unless it says otherwise).
    Device(DeviceAction),
    /// Resume at once.
    Resume,
    /// Park until kicked: a HLT with no in-kernel irqchip, which only the VMM can end.
    ParkUntilKicked,
    /// The vCPU is dead.
    Fail(Failure),
}

/// Handles one exit of vCPU `vcpu`: classifies it and routes I/O to the buses.
pub fn handle_exit(
    event: ExitEvent<'_>,
    mmio: &Bus,
    pio: &Bus,
    vcpu: usize,
) -> (ExitReason, Outcome) {
    match event {
        ExitEvent::IoIn { port, data } => (
            ExitReason::IoIn,
            Outcome::Device(pio.read(vcpu, u64::from(port), data)),
        ),
        ExitEvent::IoOut { port, data } => (
            ExitReason::IoOut,
            Outcome::Device(pio.write(vcpu, u64::from(port), data)),
        ),
        ExitEvent::MmioRead { addr, data } => (
            ExitReason::MmioRead,
            Outcome::Device(mmio.read(vcpu, addr, data)),
        ),
        ExitEvent::MmioWrite { addr, data } => (
            ExitReason::MmioWrite,
            Outcome::Device(mmio.write(vcpu, addr, data)),
        ),
        ExitEvent::Hlt => (ExitReason::Hlt, Outcome::ParkUntilKicked),
        ExitEvent::Intr => (ExitReason::Intr, Outcome::Resume),
        ExitEvent::Shutdown => (ExitReason::Shutdown, Outcome::Fail(Failure::Shutdown)),
        ExitEvent::FailEntry { reason, cpu } => (
            ExitReason::FailEntry,
            Outcome::Fail(Failure::FailEntry { reason, cpu }),
        ),
        ExitEvent::InternalError { suberror } => (
            ExitReason::InternalError,
            Outcome::Fail(Failure::InternalError { suberror }),
        ),
        ExitEvent::SystemEvent { kind } => (
            ExitReason::SystemEvent,
            Outcome::Fail(Failure::SystemEvent { kind }),
        ),
        ExitEvent::Other(what) => (ExitReason::Other, Outcome::Fail(Failure::Unexpected(what))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ppa_guest_abi::{doorbell, DOORBELL_GPA, DOORBELL_SIZE, WORKLOAD_PIO_PORT};

    use super::*;
    use crate::devices::{Doorbells, WorkloadPort};

    fn buses() -> (Bus, Bus) {
        let mut mmio = Bus::new();
        mmio.insert(DOORBELL_GPA, DOORBELL_SIZE, Arc::new(Doorbells))
            .unwrap();
        let mut pio = Bus::new();
        pio.insert(u64::from(WORKLOAD_PIO_PORT), 4, Arc::new(WorkloadPort))
            .unwrap();
        (mmio, pio)
    }

    fn h(e: ExitEvent<'_>) -> (ExitReason, Outcome) {
        let (mmio, pio) = buses();
        handle_exit(e, &mmio, &pio, 0)
    }

    #[test]
    fn routes_synthetic_exits() {
        assert_eq!(
            h(ExitEvent::MmioWrite {
                addr: DOORBELL_GPA + doorbell::HALT,
                data: &5000u64.to_le_bytes()
            }),
            (
                ExitReason::MmioWrite,
                Outcome::Device(DeviceAction::Halt(5000))
            )
        );
        assert_eq!(
            h(ExitEvent::MmioWrite {
                addr: DOORBELL_GPA + doorbell::EXIT,
                data: &[3, 0, 0, 0]
            }),
            (
                ExitReason::MmioWrite,
                Outcome::Device(DeviceAction::Exit(3))
            )
        );
        assert_eq!(
            h(ExitEvent::IoOut {
                port: WORKLOAD_PIO_PORT,
                data: &[1, 2, 3, 4]
            }),
            (ExitReason::IoOut, Outcome::Device(DeviceAction::Workload))
        );
        let mut buf = [0xffu8; 4];
        assert_eq!(
            h(ExitEvent::IoIn {
                port: 0x80,
                data: &mut buf
            }),
            (ExitReason::IoIn, Outcome::Device(DeviceAction::Unhandled))
        );
        assert_eq!(buf, [0; 4], "unclaimed port reads as zeros");
        let mut buf = [0xffu8; 8];
        assert_eq!(
            h(ExitEvent::MmioRead {
                addr: 0x4000_0000,
                data: &mut buf
            }),
            (
                ExitReason::MmioRead,
                Outcome::Device(DeviceAction::Unhandled)
            )
        );
        assert_eq!(buf, [0; 8]);
    }

    #[test]
    fn classifies_failures() {
        assert_eq!(
            h(ExitEvent::Shutdown),
            (ExitReason::Shutdown, Outcome::Fail(Failure::Shutdown))
        );
        assert_eq!(
            h(ExitEvent::FailEntry { reason: 7, cpu: 1 }),
            (
                ExitReason::FailEntry,
                Outcome::Fail(Failure::FailEntry { reason: 7, cpu: 1 })
            )
        );
        assert_eq!(h(ExitEvent::Intr), (ExitReason::Intr, Outcome::Resume));
        assert_eq!(
            h(ExitEvent::Hlt),
            (ExitReason::Hlt, Outcome::ParkUntilKicked)
        );
        assert_eq!(h(ExitEvent::Other("debug")).0, ExitReason::Other);
        assert_eq!(
            h(ExitEvent::InternalError { suberror: 1 }).0,
            ExitReason::InternalError
        );
        assert_eq!(
            h(ExitEvent::SystemEvent { kind: 2 }).0,
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

//! The guest's alarm ring (layout 1.5, docs/abi.md "Alarms"): a guest agent that counts
//! threshold occurrences (PPA's thresholds, inside the guest) writes one [`GuestAlarm`] per
//! occurrence into a ring of slots after a [`GuestAlarms`] header, so that the host can
//! forward each to its operators.
//!
//! Data flow: the writer numbers its alarms from 1; alarm `n` goes into slot `(n − 1) %
//! slots` under the sequence protocol, and the header's `written` becomes `n` afterwards
//! (under the protocol too). A reader keeps the last number it took; it reads the header,
//! then at most `slots` of the alarms after its number, each from its slot, and takes one only
//! when the record carries the number it expects (otherwise the writer has moved on and the
//! alarm is lost to it, which it counts). Everything here is guest-written and untrusted: the
//! VMM checks the header against the section and bounds each read.

use super::{Record, COMM_LEN};

/// "PPAL": magic of [`GuestAlarms`].
pub const ALARMS_MAGIC: u32 = u32::from_le_bytes(*b"PPAL");
/// Most slots a reader takes from a ring (a larger ring is refused).
pub const MAX_SLOTS: u32 = 1024;

/// What an alarm is about (its threshold), as numbered in [`GuestAlarm::kind`] and in the
/// order of [`GuestAlarms::thresholds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AlarmKind {
    /// A thread's mean run-queue wait per wait in a sample interval (ns).
    RunDelay = 1,
    /// A thread's on-CPU time per timeslice (ns).
    Slice = 2,
    /// A thread's involuntary context switches in a sample interval (a count).
    Nivcsw = 3,
    /// A CPU's hard-interrupt time in a sample interval (ns).
    Irq = 4,
    /// A CPU's softirq time in a sample interval (ns).
    Softirq = 5,
}

/// Number of alarm kinds.
pub const ALARM_KINDS: usize = 5;

impl AlarmKind {
    /// Every kind, in number order.
    pub const ALL: [AlarmKind; ALARM_KINDS] = [
        AlarmKind::RunDelay,
        AlarmKind::Slice,
        AlarmKind::Nivcsw,
        AlarmKind::Irq,
        AlarmKind::Softirq,
    ];

    /// The kind numbered `n`.
    pub fn from_u32(n: u32) -> Option<AlarmKind> {
        AlarmKind::ALL.get((n as usize).wrapping_sub(1)).copied()
    }

    /// Its name on the wire and in the metrics (`run_delay`, `slice`, `nivcsw`, `irq`,
    /// `softirq`).
    pub const fn name(self) -> &'static str {
        match self {
            AlarmKind::RunDelay => "run_delay",
            AlarmKind::Slice => "slice",
            AlarmKind::Nivcsw => "nivcsw",
            AlarmKind::Irq => "irq",
            AlarmKind::Softirq => "softirq",
        }
    }

    /// Whether it is about a thread (else about a CPU).
    pub const fn of_thread(self) -> bool {
        matches!(
            self,
            AlarmKind::RunDelay | AlarmKind::Slice | AlarmKind::Nivcsw
        )
    }
}

/// The ring's header (128 bytes), at the agent record's `alarms_offset` in the guest section.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestAlarms {
    /// Sequence counter, odd while the writer updates the header.
    pub seq: u32,
    /// [`ALARMS_MAGIC`].
    pub magic: u32,
    /// Slots of the ring, right after this header.
    pub slots: u32,
    /// Size of one slot (64; a reader uses the size given).
    pub record_size: u32,
    /// Alarms written since the writer started: the number of the latest.
    pub written: u64,
    /// Occurrences the writer counted but wrote no alarm for (over its per-sample cap).
    pub suppressed: u64,
    /// The thresholds in force, by [`AlarmKind`] order (0: off): ns, ns, a count, ns, ns.
    pub thresholds: [u64; ALARM_KINDS],
    /// Reserved, zero.
    pub reserved: [u64; 7],
}

/// One alarm (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestAlarm {
    /// Sequence counter, odd while the writer writes the slot.
    pub seq: u32,
    /// Its [`AlarmKind`] number.
    pub kind: u32,
    /// Its number (1, 2, …): what a reader matches against the slot it reads.
    pub number: u64,
    /// The thread's id (0 for a CPU's alarm).
    pub tid: u32,
    /// The CPU: the one it is about, or the thread's last.
    pub cpu: u32,
    /// The thread's name, UTF-8, NUL-padded (empty for a CPU's alarm).
    pub comm: [u8; COMM_LEN],
    /// What was measured (ns, or a count for [`AlarmKind::Nivcsw`]).
    pub value: u64,
    /// The threshold it exceeded, same unit.
    pub threshold: u64,
    /// Guest time of the sample that found it, ns (the guest header's clock).
    pub guest_ns: u64,
}

impl GuestAlarms {
    /// Bytes a ring of `slots` slots of 64 bytes takes, header included.
    pub const fn bytes(slots: u32) -> u32 {
        core::mem::size_of::<GuestAlarms>() as u32 + slots * 64
    }
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<GuestAlarms>() == 128);
    assert!(offset_of!(GuestAlarms, written) == 16);
    assert!(offset_of!(GuestAlarms, thresholds) == 32);
    assert!(offset_of!(GuestAlarms, reserved) == 72);
    assert!(size_of::<GuestAlarm>() == 64);
    assert!(offset_of!(GuestAlarm, number) == 8);
    assert!(offset_of!(GuestAlarm, tid) == 16);
    assert!(offset_of!(GuestAlarm, comm) == 24);
    assert!(offset_of!(GuestAlarm, value) == 40);
    assert!(offset_of!(GuestAlarm, guest_ns) == 56);
};

// SAFETY: repr(C), integers only, `seq: u32` first, no padding (the offsets above), a size
// that is a multiple of 8.
unsafe impl Record for GuestAlarms {}
// SAFETY: as above.
unsafe impl Record for GuestAlarm {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_number_from_one_and_name_themselves() {
        for (i, k) in AlarmKind::ALL.iter().enumerate() {
            assert_eq!(*k as u32, i as u32 + 1);
            assert_eq!(AlarmKind::from_u32(i as u32 + 1), Some(*k));
        }
        assert_eq!(AlarmKind::from_u32(0), None);
        assert_eq!(AlarmKind::from_u32(6), None);
        assert_eq!(AlarmKind::from_u32(u32::MAX), None);
        assert_eq!(AlarmKind::Softirq.name(), "softirq");
        assert!(AlarmKind::Nivcsw.of_thread() && !AlarmKind::Irq.of_thread());
        assert_eq!(GuestAlarms::bytes(64), 128 + 64 * 64);
    }
}

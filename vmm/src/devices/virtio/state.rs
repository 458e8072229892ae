//! A device's state word: the status register, the epoch its threads follow, whether the
//! device is active in that epoch, and an activation that waits for the threads, packed into
//! one 64-bit value so that every change is one compare-and-swap and no change can undo
//! another.
//!
//! Why one word: a driver's status write (a vCPU), a reset (a vCPU), an activation that
//! completes once the device's threads have let go of their old queues (a vCPU or a device
//! thread), and NEEDS_RESET set by a device thread that found a broken chain all change the
//! status or the epoch. Kept apart, a reset could land between a thread's check of the epoch
//! and its NEEDS_RESET (the stale flag then stops the re-probed device), or a status write
//! could store a value read before a thread's NEEDS_RESET and erase it. Here each is a pure
//! function from one [`Word`] to the next, applied with a compare-and-swap
//! ([`super::VirtioShared`] loops on it): a NEEDS_RESET for an epoch that has ended is
//! dropped, and a status write is recomputed from the status it replaces.
//!
//! Layout: bits 0..8 the status register (virtio's status is one byte), bit 8 active, bit 9
//! an activation pending, bits 32..64 the epoch (it only ever grows; it wraps after 2^32
//! resets, and is compared for equality only).

use super::status::{DRIVER_OK, NEEDS_RESET};

const STATUS_MASK: u64 = 0xff;
const ACTIVE: u64 = 1 << 8;
const PENDING: u64 = 1 << 9;
const EPOCH_SHIFT: u32 = 32;

/// One value of the state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Word(pub u64);

impl Word {
    /// The status register.
    pub fn status(self) -> u32 {
        (self.0 & STATUS_MASK) as u32
    }

    /// The epoch (bumped at each reset and each activation).
    pub fn epoch(self) -> u32 {
        (self.0 >> EPOCH_SHIFT) as u32
    }

    /// Whether the device's queues run in this epoch.
    pub fn active(self) -> bool {
        self.0 & ACTIVE != 0
    }

    /// Whether the driver set DRIVER_OK and the activation waits for the threads to let go
    /// of the queues of the epoch before.
    pub fn pending(self) -> bool {
        self.0 & PENDING != 0
    }

    /// Whether a thread serving `epoch` may go on: the same epoch, active, not stopped.
    pub fn serves(self, epoch: u32) -> bool {
        self.epoch() == epoch && self.active() && self.status() & NEEDS_RESET == 0
    }

    fn with_epoch(self, epoch: u32) -> Word {
        Word((self.0 & !(u64::from(u32::MAX) << EPOCH_SHIFT)) | (u64::from(epoch) << EPOCH_SHIFT))
    }

    /// The same word with the status register `status` (its low byte).
    pub fn with_status(self, status: u32) -> Word {
        Word((self.0 & !STATUS_MASK) | (u64::from(status) & STATUS_MASK))
    }

    /// A driver's reset: status 0, a new epoch, inactive, nothing pending.
    pub fn reset(self) -> Word {
        Word(0).with_epoch(self.epoch().wrapping_add(1))
    }

    /// DRIVER_OK with `status`: a new active epoch when the threads have caught up with this
    /// one (`caught_up`), otherwise the status is stored and the activation waits
    /// ([`Word::complete`]).
    pub fn activate(self, status: u32, caught_up: bool) -> Word {
        let w = self.with_status(status);
        if caught_up {
            Word((w.0 & !PENDING) | ACTIVE).with_epoch(self.epoch().wrapping_add(1))
        } else {
            Word((w.0 & !ACTIVE) | PENDING)
        }
    }

    /// The pending activation, now that the threads have caught up: a new active epoch. None
    /// when nothing is pending, or NEEDS_RESET came meanwhile (the driver must reset).
    pub fn complete(self) -> Option<Word> {
        if !self.pending() || self.status() & NEEDS_RESET != 0 {
            return None;
        }
        Some(Word((self.0 & !PENDING) | ACTIVE).with_epoch(self.epoch().wrapping_add(1)))
    }

    /// NEEDS_RESET set for `epoch` (None: that epoch has ended, or the bit is set already).
    /// A pending activation is cancelled: the device stops until a reset.
    pub fn needs_reset(self, epoch: u32) -> Option<Word> {
        if self.epoch() != epoch || self.status() & NEEDS_RESET != 0 {
            return None;
        }
        Some(Word((self.0 & !PENDING) | u64::from(NEEDS_RESET)))
    }

    /// Whether NEEDS_RESET in this word should reach the driver as a configuration-change
    /// interrupt (it only listens once DRIVER_OK is set).
    pub fn tells_driver(self) -> bool {
        self.status() & DRIVER_OK != 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::status::{ACKNOWLEDGE, DRIVER, FEATURES_OK};
    use super::*;

    const READY: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK;

    #[test]
    fn a_reset_clears_the_status_and_starts_an_inactive_epoch() {
        let w = Word::default()
            .with_status(READY)
            .activate(READY | DRIVER_OK, true);
        assert_eq!(
            (w.epoch(), w.active(), w.status()),
            (1, true, READY | DRIVER_OK)
        );
        let r = w.reset();
        assert_eq!(
            (r.epoch(), r.active(), r.pending(), r.status()),
            (2, false, false, 0)
        );
    }

    #[test]
    fn an_activation_waits_for_the_threads_and_completes_once() {
        let w = Word::default().reset().with_status(READY);
        let p = w.activate(READY | DRIVER_OK, false);
        assert_eq!((p.epoch(), p.active(), p.pending()), (1, false, true));
        assert_eq!(
            p.status(),
            READY | DRIVER_OK,
            "the driver reads DRIVER_OK back"
        );
        let c = p.complete().expect("pending");
        assert_eq!((c.epoch(), c.active(), c.pending()), (2, true, false));
        assert_eq!(c.complete(), None, "once");
        // A reset while pending cancels it.
        assert_eq!(p.reset().complete(), None);
    }

    #[test]
    fn needs_reset_applies_only_to_its_own_epoch_and_cancels_a_pending_activation() {
        let w = Word::default()
            .with_status(READY)
            .activate(READY | DRIVER_OK, true);
        assert_eq!(w.needs_reset(0), None, "an epoch that ended");
        let n = w.needs_reset(1).expect("current epoch");
        assert_ne!(n.status() & NEEDS_RESET, 0);
        assert!(!n.serves(1), "stopped");
        assert!(n.tells_driver());
        assert_eq!(n.needs_reset(1), None, "set once");
        let p = Word::default().activate(READY | DRIVER_OK, false);
        let n = p.needs_reset(0).unwrap();
        assert!(!n.pending());
        assert_eq!(n.complete(), None);
    }

    #[test]
    fn a_thread_serves_only_the_active_epoch_it_built_its_queues_in() {
        let w = Word::default().activate(READY | DRIVER_OK, true);
        assert!(w.serves(1));
        assert!(!w.serves(0));
        assert!(!w.reset().serves(1));
        assert!(!w.reset().serves(2), "inactive");
    }

    #[test]
    fn the_epoch_wraps_without_touching_the_flags() {
        let w = Word::default().with_epoch(u32::MAX).with_status(READY);
        let r = w.reset();
        assert_eq!((r.epoch(), r.status()), (0, 0));
        let a = w.activate(READY | DRIVER_OK, true);
        assert_eq!(
            (a.epoch(), a.active(), a.status()),
            (0, true, READY | DRIVER_OK)
        );
    }
}

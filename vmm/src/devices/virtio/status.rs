//! The virtio device status register as a pure state machine (virtio 1.2, 2.1 and 3.1):
//! what a driver's write to `Status` does, given what the device offered and the driver
//! acknowledged. No atomics, no I/O: `mmio.rs` applies the verdict.
//!
//! Data flow: the transport passes the current status, the written value and the negotiated
//! features to [`on_write`]; it returns the [`Transition`] to carry out (set the new value,
//! start a reset, activate the device, refuse the features, or mark the device as needing a
//! reset because the driver broke a rule) and, when a rule was broken, which one
//! ([`Violation`], counted and logged once by the transport).

use virtio_bindings::bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};

/// ACKNOWLEDGE: the guest found the device.
pub const ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
/// DRIVER: the guest has a driver for it.
pub const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
/// FEATURES_OK: the features are agreed.
pub const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
/// DRIVER_OK: the driver is ready; the device runs.
pub const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
/// NEEDS_RESET: the device met an error it cannot recover from without a reset.
pub const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
/// FAILED: the driver gave up on the device.
pub const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
/// The bits a driver may write.
const DRIVER_BITS: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | FAILED;

/// A rule of the virtio initialisation sequence that a driver broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Violation {
    /// The driver cleared a status bit without a reset (a write of 0).
    ClearedBit,
    /// The driver set a bit before the bits that must come first (DRIVER before
    /// ACKNOWLEDGE, FEATURES_OK before DRIVER, DRIVER_OK before FEATURES_OK).
    OutOfOrder,
    /// The driver wrote a bit only the device may set (NEEDS_RESET) or an undefined bit.
    ReservedBit,
    /// The driver did not accept `VIRTIO_F_VERSION_1`: a legacy driver, which this
    /// modern-only device does not serve.
    NoVersion1,
    /// The driver accepted features the device did not offer.
    UnofferedFeatures,
    /// A queue was set up wrongly when the driver set DRIVER_OK (size, alignment, or rings
    /// outside guest memory), or the device could not start.
    BadQueue,
    /// The driver wrote a register it may not write in the device's current state (queue or
    /// feature registers after FEATURES_OK or DRIVER_OK).
    LateWrite,
    /// The driver made a malformed descriptor chain available (`chain::ChainError` says how).
    BadChain,
    /// The driver moved a queue's available index ahead by more than the queue holds.
    AvailIndex,
}

impl Violation {
    /// A sentence for the log and the report.
    pub fn describe(self) -> &'static str {
        match self {
            Violation::ClearedBit => "the driver cleared a status bit without a reset",
            Violation::OutOfOrder => "the driver set status bits out of order",
            Violation::ReservedBit => "the driver wrote a status bit only the device may set",
            Violation::NoVersion1 => {
                "the driver did not accept VIRTIO_F_VERSION_1 (a legacy driver; this device is virtio 1.x only)"
            }
            Violation::UnofferedFeatures => "the driver accepted features the device did not offer",
            Violation::BadQueue => {
                "a queue was not set up correctly when the driver set DRIVER_OK"
            }
            Violation::LateWrite => {
                "the driver wrote a queue or feature register after the features were agreed"
            }
            Violation::BadChain => "the driver made a malformed descriptor chain available",
            Violation::AvailIndex => {
                "the driver moved an available index ahead by more than the queue holds"
            }
        }
    }

    /// A short name for counters and the wire (`snake_case`).
    pub fn name(self) -> &'static str {
        match self {
            Violation::ClearedBit => "cleared_bit",
            Violation::OutOfOrder => "out_of_order",
            Violation::ReservedBit => "reserved_bit",
            Violation::NoVersion1 => "no_version_1",
            Violation::UnofferedFeatures => "unoffered_features",
            Violation::BadQueue => "bad_queue",
            Violation::LateWrite => "late_write",
            Violation::BadChain => "bad_chain",
            Violation::AvailIndex => "avail_index",
        }
    }
}

/// What a status write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Store this status; nothing else happens.
    Set(u32),
    /// A write of 0: reset the device (queues stop, features and status clear).
    Reset,
    /// FEATURES_OK asked and refused: the status stays without FEATURES_OK (the driver reads
    /// it back and gives up), and the reason is counted.
    RefuseFeatures(Violation),
    /// DRIVER_OK: store this status and start the device's queues.
    Activate(u32),
    /// The driver broke a rule: set NEEDS_RESET (and tell the driver through a
    /// configuration-change interrupt); the device stops processing until a reset.
    NeedsReset(Violation),
}

/// The features a driver may keep: those offered, and at least VERSION_1.
pub fn check_features(offered: u64, acked: u64) -> Result<(), Violation> {
    if acked & (1 << VIRTIO_F_VERSION_1) == 0 {
        return Err(Violation::NoVersion1);
    }
    if acked & !offered != 0 {
        return Err(Violation::UnofferedFeatures);
    }
    Ok(())
}

/// What writing `new` to the status register does when it holds `current`, the device
/// offered `offered` and the driver acknowledged `acked`.
pub fn on_write(current: u32, new: u32, offered: u64, acked: u64) -> Transition {
    if new == 0 {
        return Transition::Reset;
    }
    // A device that needs a reset keeps saying so until it gets one; FAILED may still be set.
    if current & NEEDS_RESET != 0 {
        return if new & FAILED != 0 {
            Transition::Set(current | FAILED)
        } else {
            Transition::Set(current)
        };
    }
    if new & !DRIVER_BITS != 0 {
        return Transition::NeedsReset(Violation::ReservedBit);
    }
    if current & !new & DRIVER_BITS != 0 {
        return Transition::NeedsReset(Violation::ClearedBit);
    }
    // Giving up is always allowed.
    if new & FAILED != 0 {
        return Transition::Set(new);
    }
    let needs = [
        (DRIVER, ACKNOWLEDGE),
        (FEATURES_OK, DRIVER),
        (DRIVER_OK, FEATURES_OK),
    ];
    if needs
        .iter()
        .any(|&(bit, before)| new & bit != 0 && new & before == 0)
    {
        return Transition::NeedsReset(Violation::OutOfOrder);
    }
    let added = new & !current;
    if added & FEATURES_OK != 0 {
        if let Err(v) = check_features(offered, acked) {
            return Transition::RefuseFeatures(v);
        }
    }
    if added & DRIVER_OK != 0 {
        return Transition::Activate(new);
    }
    Transition::Set(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: u64 = 1 << VIRTIO_F_VERSION_1;
    const OFFERED: u64 = V1 | 0b1010_0000;

    #[test]
    fn the_normal_sequence_reaches_driver_ok_and_activates_once() {
        let mut s = 0;
        for (bit, expect_activate) in [
            (ACKNOWLEDGE, false),
            (DRIVER, false),
            (FEATURES_OK, false),
            (DRIVER_OK, true),
        ] {
            let t = on_write(s, s | bit, OFFERED, V1 | 0b1000_0000);
            match t {
                Transition::Set(v) if !expect_activate => s = v,
                Transition::Activate(v) if expect_activate => s = v,
                other => panic!("bit {bit}: {other:?}"),
            }
        }
        assert_eq!(s, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        // Writing the same value again changes nothing and does not activate twice.
        assert_eq!(on_write(s, s, OFFERED, V1), Transition::Set(s));
    }

    #[test]
    fn a_legacy_driver_is_refused_at_features_ok() {
        let s = ACKNOWLEDGE | DRIVER;
        assert_eq!(
            on_write(s, s | FEATURES_OK, OFFERED, 0b1000_0000),
            Transition::RefuseFeatures(Violation::NoVersion1)
        );
        assert_eq!(
            on_write(s, s | FEATURES_OK, OFFERED, V1 | 1),
            Transition::RefuseFeatures(Violation::UnofferedFeatures)
        );
        // Having read FEATURES_OK back as clear, the driver sets FAILED.
        assert_eq!(
            on_write(s, s | FAILED, OFFERED, 0),
            Transition::Set(s | FAILED)
        );
    }

    #[test]
    fn rule_breaking_writes_need_a_reset() {
        let ok = ACKNOWLEDGE | DRIVER | FEATURES_OK;
        assert_eq!(
            on_write(ok, ACKNOWLEDGE, OFFERED, V1),
            Transition::NeedsReset(Violation::ClearedBit)
        );
        assert_eq!(
            on_write(0, DRIVER, OFFERED, V1),
            Transition::NeedsReset(Violation::OutOfOrder)
        );
        assert_eq!(
            on_write(
                ACKNOWLEDGE | DRIVER,
                ACKNOWLEDGE | DRIVER | DRIVER_OK,
                OFFERED,
                V1
            ),
            Transition::NeedsReset(Violation::OutOfOrder)
        );
        assert_eq!(
            on_write(ACKNOWLEDGE, ACKNOWLEDGE | NEEDS_RESET, OFFERED, V1),
            Transition::NeedsReset(Violation::ReservedBit)
        );
        assert_eq!(
            on_write(ACKNOWLEDGE, ACKNOWLEDGE | 0x20, OFFERED, V1),
            Transition::NeedsReset(Violation::ReservedBit)
        );
    }

    #[test]
    fn needs_reset_sticks_until_a_reset() {
        let s = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | NEEDS_RESET;
        assert_eq!(on_write(s, ACKNOWLEDGE, OFFERED, V1), Transition::Set(s));
        assert_eq!(
            on_write(s, s | FAILED, OFFERED, V1),
            Transition::Set(s | FAILED)
        );
        assert_eq!(on_write(s, 0, OFFERED, V1), Transition::Reset);
    }

    #[test]
    fn every_violation_has_a_sentence_and_a_distinct_name() {
        let all = [
            Violation::ClearedBit,
            Violation::OutOfOrder,
            Violation::ReservedBit,
            Violation::NoVersion1,
            Violation::UnofferedFeatures,
            Violation::BadQueue,
            Violation::LateWrite,
            Violation::BadChain,
            Violation::AvailIndex,
        ];
        let names: std::collections::BTreeSet<_> = all.iter().map(|v| v.name()).collect();
        assert_eq!(names.len(), all.len());
        assert!(
            all.iter()
                .all(|v| v.describe().starts_with("the driver")
                    || v.describe().starts_with("a queue"))
        );
    }
}

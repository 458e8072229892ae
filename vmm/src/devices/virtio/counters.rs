//! Per-queue counters of a virtio device, each written by the one thread that serves the
//! queue (single-writer atomics: no locked instruction on the hot path), read by anyone.
//!
//! Data flow: a device thread adds to its queues' [`QueueCounters`] as it takes chains,
//! carries frames or requests, drops frames and raises interrupts; readers turn them into
//! `ppa_vmm_api::QueueStats` ([`QueueCounters::stats`]) for `stats`, the report and the
//! metrics. The network device counts frames in `packets`; the block device counts requests
//! there, which a `req` queue's stats call `requests`.

use std::collections::BTreeMap;

use ppa_vmm_api::{DropReason, QueueKind, QueueStats};

use crate::devices::rate::ThrottleClock;
use crate::sync::Counter;

/// One queue's counters.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Guest kicks.
    pub notifications: Counter,
    /// Interrupts raised.
    pub interrupts: Counter,
    /// Interrupts the driver did not want.
    pub suppressed: Counter,
    /// Chains taken.
    pub chains: Counter,
    /// Frames carried (network), requests answered (block).
    pub packets: Counter,
    /// Bytes of those frames, headers excluded.
    pub bytes: Counter,
    /// Received frames that went through the host buffer (the guest had made too few buffers
    /// available to read the largest frame straight into them).
    pub copied: Counter,
    /// Stops for the device's rate limiter.
    pub throttles: Counter,
    /// Time waited for the rate limiter.
    pub throttled: ThrottleClock,
    drops: [Counter; DropReason::COUNT],
}

impl QueueCounters {
    /// Counts one dropped frame.
    #[inline]
    pub fn drop_one(&self, why: DropReason) {
        self.drops[why.index()].add(1);
    }

    /// Drops so far for `why`.
    pub fn drops(&self, why: DropReason) -> u64 {
        self.drops[why.index()].get()
    }

    /// Every drop.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().map(Counter::get).sum()
    }

    /// Counts one interrupt raised (`raised`) or not needed.
    #[inline]
    pub fn interrupt(&self, raised: bool) {
        if raised {
            self.interrupts.add(1);
        } else {
            self.suppressed.add(1);
        }
    }

    /// The counts as the protocol gives them.
    pub fn stats(&self, index: u16, kind: QueueKind) -> QueueStats {
        let drops: BTreeMap<DropReason, u64> = DropReason::ALL
            .iter()
            .map(|r| (*r, self.drops(*r)))
            .filter(|(_, n)| *n > 0)
            .collect();
        QueueStats {
            index,
            kind,
            notifications: self.notifications.get(),
            interrupts: self.interrupts.get(),
            interrupts_suppressed: self.suppressed.get(),
            chains: self.chains.get(),
            packets: if kind == QueueKind::Req {
                0
            } else {
                self.packets.get()
            },
            requests: (kind == QueueKind::Req).then(|| self.packets.get()),
            bytes: self.bytes.get(),
            copied: self.copied.get(),
            throttles: self.throttles.get(),
            throttled_ns: self.throttled.total_ns(crate::sync::now_ns()),
            drops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_become_queue_stats_with_only_the_drops_seen() {
        let c = QueueCounters::default();
        c.notifications.add(3);
        c.interrupt(true);
        c.interrupt(false);
        c.interrupt(false);
        c.chains.add(5);
        c.packets.add(4);
        c.bytes.add(256);
        c.drop_one(DropReason::OversizedFrame);
        c.drop_one(DropReason::TapWouldBlock);
        c.drop_one(DropReason::TapWouldBlock);
        let s = c.stats(1, QueueKind::Tx);
        assert_eq!(
            (
                s.index,
                s.kind,
                s.notifications,
                s.interrupts,
                s.interrupts_suppressed
            ),
            (1, QueueKind::Tx, 3, 1, 2)
        );
        assert_eq!((s.chains, s.packets, s.bytes), (5, 4, 256));
        assert_eq!((s.copied, s.throttles, s.throttled_ns), (0, 0, 0));
        assert_eq!(s.drops.len(), 2);
        assert_eq!(s.drops[&DropReason::TapWouldBlock], 2);
        assert_eq!(c.total_drops(), 3);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["drops"]["oversized_frame"], 1);
    }
}

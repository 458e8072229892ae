//! Per-queue counters of a network device, each written by the one thread that serves the
//! queue (single-writer atomics: no locked instruction on the packet path), read by anyone.
//!
//! Data flow: the queue pair's thread adds to its rx and tx queues' [`QueueCounters`] as it
//! takes chains, moves frames, drops them and raises interrupts, and to its [`FrameCpu`] the
//! CPU of each batch with the frames it handled; readers turn them into
//! `ppa_vmm_api::QueueStats` ([`QueueCounters::stats`]) and the device's per-frame figures for
//! `stats`, the report and the metrics.

use std::collections::BTreeMap;

use ppa_vmm_api::{DropReason, QueueKind, QueueStats};

use crate::accounting::histogram::{Histogram, HistogramSnapshot, DEFAULT_FRAC_BITS};
use crate::sync::Counter;

/// What a queue pair's thread measured of its CPU per frame, while the CPU marks were taken
/// (not at level off): the frames handled (delivered or sent, and dropped) each way, the mean's
/// denominator, and per batch its CPU over its frames (log-linear, as the exit histograms), so
/// a tail shows. Single writer: the thread.
#[derive(Debug)]
pub struct FrameCpu {
    frames: [Counter; 2],
    per_batch: [Histogram; 2],
}

impl Default for FrameCpu {
    fn default() -> Self {
        let h = || Histogram::new(DEFAULT_FRAC_BITS).expect("the default fraction bits are valid");
        FrameCpu {
            frames: [Counter::default(), Counter::default()],
            per_batch: [h(), h()],
        }
    }
}

/// Which way a frame went, as [`FrameCpu`] indexes it: the worker's `PART_RX` and `PART_TX`.
fn way(part: usize) -> Option<usize> {
    (part < 2).then_some(part)
}

impl FrameCpu {
    /// A batch of `part` (receive 0, transmit 1; others are not frames) took `cpu_ns` for
    /// `frames` frames.
    #[inline]
    pub fn record(&self, part: usize, cpu_ns: u64, frames: u64) {
        let Some(w) = way(part) else {
            return;
        };
        if frames == 0 {
            return;
        }
        self.frames[w].add(frames);
        self.per_batch[w].record(cpu_ns / frames);
    }

    /// Frames handled each way while marks were taken: (receive, transmit).
    pub fn frames(&self) -> (u64, u64) {
        (self.frames[0].get(), self.frames[1].get())
    }

    /// The per-batch histograms: (receive, transmit).
    pub fn histograms(&self) -> (HistogramSnapshot, HistogramSnapshot) {
        (self.per_batch[0].snapshot(), self.per_batch[1].snapshot())
    }
}

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
    /// Frames carried.
    pub packets: Counter,
    /// Bytes of those frames, headers excluded.
    pub bytes: Counter,
    /// Received frames that went through the host buffer (the guest had made too few buffers
    /// available to read the largest frame straight into them).
    pub copied: Counter,
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
            packets: self.packets.get(),
            bytes: self.bytes.get(),
            copied: self.copied.get(),
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
        assert_eq!(s.copied, 0);
        assert_eq!(s.drops.len(), 2);
        assert_eq!(s.drops[&DropReason::TapWouldBlock], 2);
        assert_eq!(c.total_drops(), 3);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["drops"]["oversized_frame"], 1);
    }

    #[test]
    fn per_frame_cpu_counts_frames_of_receive_and_transmit_batches_only() {
        let f = FrameCpu::default();
        f.record(0, 3_000, 3);
        f.record(0, 5_000, 1);
        f.record(1, 700, 0);
        f.record(2, 9_999, 4);
        f.record(1, 2_000, 2);
        assert_eq!(f.frames(), (4, 2));
        let (rx, tx) = f.histograms();
        assert_eq!((rx.count(), tx.count()), (2, 1), "batches with frames");
        assert_eq!(rx.sum(), 1_000 + 5_000, "each batch's CPU over its frames");
        assert_eq!(tx.sum(), 1_000);
    }
}

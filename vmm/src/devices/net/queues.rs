//! A network device's CPU per frame, written by each queue pair's thread (single writer), read
//! by anyone; and, re-exported, the per-queue counters every virtio device keeps
//! ([`crate::devices::virtio::counters`]).
//!
//! Data flow: the queue pair's thread adds to its [`FrameCpu`] the CPU of each batch with the
//! frames it handled, and to its rx and tx queues' [`QueueCounters`] what crossed them;
//! readers turn both into the device's per-frame figures and `ppa_vmm_api::QueueStats` for
//! `stats`, the report and the metrics.

use crate::accounting::histogram::{Histogram, HistogramSnapshot, DEFAULT_FRAC_BITS};
use crate::sync::Counter;

pub use crate::devices::virtio::counters::QueueCounters;

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

#[cfg(test)]
mod tests {
    use super::*;

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

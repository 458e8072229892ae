//! A block device's figures for readers (`stats`, the report, the `device` command, the
//! metrics, `top`): its threads' accounting, its queues' counters, its requests by type,
//! bytes, errors by status and service-time histograms, and its driver's side.
//!
//! Data flow: a reader calls `BlkDevice::stats`, which takes [`Raw`] (every figure since the
//! device started, read from the threads' single-writer meters and counters without a lock)
//! and subtracts the baseline a `reset` request kept ([`Raw::since`]); what every virtio
//! device shares comes from [`crate::devices::virtio::stats`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use ppa_vmm_api::{
    BlkRequestKind, BlkStats, BlkStatus, DeviceCpu, DeviceKind, DeviceStats, QueueKind,
};
use virtio_bindings::bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;

use super::queue::BlkCounts;
use super::{worker, BlkDevice};
use crate::accounting::worker::WorkerMeter;
use crate::devices::virtio::stats::{driver_stats, health, since_common, thread_stats};

/// Every figure since the device started, with the request counts as a reading (a baseline
/// subtracts them).
#[derive(Debug, Clone)]
pub struct Raw {
    stats: DeviceStats,
    counts: BlkCounts,
}

impl Raw {
    /// These figures less `base` (none: as they are), with the request figures made from
    /// what is left.
    pub fn since(self, base: Option<&Raw>) -> DeviceStats {
        let (mut cur, counts) = match base {
            Some(b) => {
                let mut cur = self.stats;
                since_common(&mut cur, &b.stats);
                (cur, self.counts.since(&b.counts))
            }
            None => (self.stats, self.counts),
        };
        with_counts(&mut cur, &counts);
        cur
    }
}

/// Fills `cur.blk` (already holding the disk's facts) and `cur.service` from `c`.
pub fn with_counts(cur: &mut DeviceStats, c: &BlkCounts) {
    if let Some(b) = cur.blk.as_mut() {
        b.requests = BlkRequestKind::ALL
            .iter()
            .map(|k| (*k, c.requests(*k)))
            .filter(|(_, n)| *n > 0)
            .collect();
        b.errors = BlkStatus::ALL
            .iter()
            .map(|s| (*s, c.errors[s.index()]))
            .filter(|(_, n)| *n > 0)
            .collect();
        b.bytes_read = c.read;
        b.bytes_written = c.written;
        b.merged = c.merged;
    }
    cur.service = Some(c.service_json());
}

impl BlkDevice {
    /// Every figure since the device started.
    pub(super) fn raw(&self) -> Raw {
        let blk = &self.blk;
        let times: Vec<_> = blk.meters.iter().map(WorkerMeter::times).collect();
        let threads = times
            .iter()
            .enumerate()
            .map(|(q, t)| thread_stats(self.thread_name(q), &blk.meters[q], t))
            .collect();
        let queues = blk
            .queues
            .iter()
            .enumerate()
            .map(|(i, c)| c.stats(i as u16, QueueKind::Req))
            .collect();
        let cpu_ns: u64 = times.iter().map(|t| t.used_ns).sum();
        let req: u64 = times.iter().map(|t| t.parts_ns[worker::PART_REQ]).sum();
        let poll: u64 = times.iter().map(|t| t.parts_ns[worker::PART_POLL]).sum();
        let mut counts = BlkCounts::empty();
        for r in &blk.requests {
            counts.merge(&r.counts());
        }
        let (status, status_reason) = health(&self.virtio);
        let stats = DeviceStats {
            id: blk.id.clone(),
            kind: DeviceKind::Blk,
            backend: blk.disk.path().display().to_string(),
            mac: None,
            rate: super::spec::rate_value(&blk.rate.spec()),
            mmio_base: self.mmio_base,
            gsi: self.virtio.gsi(),
            status,
            status_reason,
            backend_error: None,
            threads,
            queues,
            cpu_ns,
            cpu: DeviceCpu {
                req,
                poll,
                other: cpu_ns.saturating_sub(req + poll),
                ..DeviceCpu::default()
            },
            cpu_ns_per_packet: None,
            frame_cpu: None,
            driver: driver_stats(&self.virtio),
            blk: Some(BlkStats {
                capacity_bytes: blk.disk.sectors() * super::file::SECTOR,
                readonly: blk.disk.readonly(),
                discard: blk.disk.can_punch(),
                write_zeroes: blk.disk.can_punch(),
                flush_negotiated: self.virtio.has_feature(VIRTIO_BLK_F_FLUSH)
                    || blk.flush_negotiated.load(Ordering::Relaxed),
                requests: BTreeMap::new(),
                bytes_read: 0,
                bytes_written: 0,
                errors: BTreeMap::new(),
                merged: 0,
            }),
            service: None,
        };
        Raw { stats, counts }
    }
}

//! A network device's figures for readers (`stats`, the report, the `device` command, the
//! metrics): its threads' accounting, its queues' counters, its CPU by kind of work and per
//! frame, and its driver's side.
//!
//! Data flow: a reader calls `NetDevice::stats`, which takes [`Raw`] (every figure since the
//! device started, read from the threads' single-writer meters and counters without a lock)
//! and subtracts the baseline a `reset` request kept ([`Raw::since`]). The mean CPU per frame
//! is each way's CPU over the frames handled while the marks were taken (both counted only at
//! levels basic and full), with the per-batch histograms beside it.

use std::sync::atomic::Ordering;

use ppa_vmm_api::{DeviceCpu, DeviceKind, DeviceStats, FrameCpu, PerPacket};

use super::{worker, NetDevice};
use crate::accounting::histogram::{HistogramSnapshot, DEFAULT_FRAC_BITS};
use crate::accounting::worker::WorkerMeter;
use crate::devices::virtio::stats::{driver_stats, health, since_common, thread_stats};

/// Every figure since the device started, with the per-batch histograms as snapshots (a
/// baseline subtracts them).
#[derive(Debug, Clone)]
pub struct Raw {
    stats: DeviceStats,
    rx_batches: HistogramSnapshot,
    tx_batches: HistogramSnapshot,
}

impl Raw {
    /// These figures less `base` (none: as they are), with the means and the histograms'
    /// JSON made from what is left.
    pub fn since(self, base: Option<&Raw>) -> DeviceStats {
        let (cur, rx, tx) = match base {
            Some(b) => (
                since(self.stats, &b.stats),
                self.rx_batches.since(&b.rx_batches),
                self.tx_batches.since(&b.tx_batches),
            ),
            None => (self.stats, self.rx_batches, self.tx_batches),
        };
        with_frame_cpu(cur, &rx, &tx)
    }
}

/// Fills the per-batch histograms and the means from the frames in `cur.frame_cpu`.
fn with_frame_cpu(
    mut cur: DeviceStats,
    rx: &HistogramSnapshot,
    tx: &HistogramSnapshot,
) -> DeviceStats {
    let Some(f) = cur.frame_cpu.as_mut() else {
        return cur;
    };
    f.rx_per_batch = rx.to_json();
    f.tx_per_batch = tx.to_json();
    let per = |cpu: u64, n: u64| (n > 0).then(|| cpu / n);
    cur.cpu_ns_per_packet = Some(PerPacket {
        tx: per(cur.cpu.tx, f.tx_frames),
        rx: per(cur.cpu.rx, f.rx_frames),
    });
    cur
}

/// `cur` less `base`, counter by counter (0 where a counter went down: a thread that was
/// not there at the reset): what every device has ([`since_common`]), then the frames behind
/// the means, which are made again.
pub fn since(mut cur: DeviceStats, base: &DeviceStats) -> DeviceStats {
    since_common(&mut cur, base);
    if let (Some(f), Some(b)) = (cur.frame_cpu.as_mut(), base.frame_cpu.as_ref()) {
        f.rx_frames = f.rx_frames.saturating_sub(b.rx_frames);
        f.tx_frames = f.tx_frames.saturating_sub(b.tx_frames);
    }
    let per = |cpu: u64, n: u64| (n > 0).then(|| cpu / n);
    if let Some(f) = cur.frame_cpu.as_ref() {
        cur.cpu_ns_per_packet = Some(PerPacket {
            tx: per(cur.cpu.tx, f.tx_frames),
            rx: per(cur.cpu.rx, f.rx_frames),
        });
    }
    cur
}

impl NetDevice {
    /// The tap's failure, when a queue pair's tap fails now.
    fn backend_error(&self) -> Option<String> {
        let errno = self
            .net
            .tap_errors
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .find(|&e| e != 0)?;
        let e = std::io::Error::from_raw_os_error(errno);
        let gone = matches!(errno, libc::EBADFD | libc::ENODEV | libc::ENXIO | libc::EIO);
        Some(format!(
            "its tap {} {} ({e}): frames to and from the host stop",
            self.tap_name,
            if gone { "is gone or down" } else { "fails" }
        ))
    }

    /// Every figure since the device started.
    pub(super) fn raw(&self) -> Raw {
        let times: Vec<_> = self.net.meters.iter().map(WorkerMeter::times).collect();
        let threads = times
            .iter()
            .enumerate()
            .map(|(pair, t)| thread_stats(self.thread_name(pair), &self.net.meters[pair], t))
            .collect();
        let queues: Vec<_> = self
            .net
            .queues
            .iter()
            .enumerate()
            .map(|(i, c)| c.stats(i as u16, self.kind_of(i)))
            .collect();
        let part = |p: usize| times.iter().map(|t| t.parts_ns[p]).sum::<u64>();
        let cpu_ns: u64 = times.iter().map(|t| t.used_ns).sum();
        let cpu = DeviceCpu {
            rx: part(worker::PART_RX),
            tx: part(worker::PART_TX),
            ctrl: part(worker::PART_CTRL),
            req: 0,
            poll: 0,
            other: cpu_ns.saturating_sub(
                part(worker::PART_RX) + part(worker::PART_TX) + part(worker::PART_CTRL),
            ),
        };
        let mut rx_batches = HistogramSnapshot::empty(DEFAULT_FRAC_BITS);
        let mut tx_batches = HistogramSnapshot::empty(DEFAULT_FRAC_BITS);
        let (mut rx_frames, mut tx_frames) = (0, 0);
        for f in &self.net.frame_cpu {
            let (r, t) = f.frames();
            rx_frames += r;
            tx_frames += t;
            let (rh, th) = f.histograms();
            rx_batches.merge(&rh);
            tx_batches.merge(&th);
        }
        let (status, status_reason) = health(&self.virtio);
        let stats = DeviceStats {
            id: self.net.id.clone(),
            kind: DeviceKind::Net,
            backend: self.tap_name.clone(),
            mac: Some(self.net.mac.to_string()),
            rate: super::spec::rate_value(&self.net.rx_rate.spec(), &self.net.tx_rate.spec()),
            mmio_base: self.mmio_base,
            gsi: self.virtio.gsi(),
            status,
            status_reason,
            backend_error: self.backend_error(),
            threads,
            queues,
            cpu_ns,
            cpu_ns_per_packet: None,
            frame_cpu: Some(FrameCpu {
                rx_frames,
                tx_frames,
                rx_per_batch: rx_batches.to_json(),
                tx_per_batch: tx_batches.to_json(),
            }),
            cpu,
            driver: driver_stats(&self.virtio),
            blk: None,
            service: None,
        };
        Raw {
            stats,
            rx_batches,
            tx_batches,
        }
    }
}

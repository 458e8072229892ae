//! virtio-blk on a raw file (spec section 10, docs/design.md "Devices"): request queues each
//! served by a thread of its own (`blk0-q0`, …), every request, byte, error and kick counted,
//! each request's service time in a histogram by type, and each thread's time accounted as
//! exactly as a vCPU's.
//!
//! Data flow: the VM builder makes a [`BlkDevice`] from a [`spec::DiskSpec`]: it opens and
//! locks the file ([`file::DiskFile`]), makes a kick eventfd per queue (registered as
//! ioeventfds at the transport's QueueNotify) and shares a
//! [`crate::devices::virtio::VirtioShared`] (a wake eventfd per thread) with its MMIO
//! transport. `Vm::run` starts one thread per queue ([`worker`]) before the vCPUs and stops
//! them after. A thread answers its queue's requests with positioned vector reads and writes
//! of the file straight from and into guest memory ([`queue`], [`request`]). Readers
//! (`stats`, the report, metrics) take [`BlkDevice`]'s `stats` ([`stats`]): the threads'
//! meters and counters, single-writer atomics read without a lock.
//!
//! Features offered: VERSION_1, EVENT_IDX, INDIRECT_DESC, SIZE_MAX, SEG_MAX, BLK_SIZE (512),
//! FLUSH, TOPOLOGY (4 KiB physical blocks), MQ with several queues, RO for a read-only disk,
//! and DISCARD and WRITE_ZEROES when the file can punch holes (a writable regular file on a
//! file system that supports it). Not offered: CONFIG_WCE (the cache mode is fixed: write
//! back when the driver negotiates FLUSH, write through when it does not), GEOMETRY,
//! SECURE_ERASE, ZONED. GET_ID (not a feature bit) answers the device id.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ppa_vmm_api::{DeviceStats, DeviceThreadInfo};
use thiserror::Error;
use virtio_bindings::bindings::virtio_blk::*;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::virtio::{eventfds, read_config_bytes, VirtioDevice, VirtioShared};
use crate::accounting::worker::WorkerMeter;
use crate::accounting::AccountingControl;
use crate::devices::rate::{RateSpecError, SharedLimiter};
use crate::devices::virtio::counters::QueueCounters;
use crate::hypervisor::IrqLine;

pub mod file;
#[cfg(any(test, feature = "fuzzing"))]
pub mod memdisk;
pub mod merge;
pub mod queue;
pub mod request;
pub mod spec;
pub mod stats;
pub mod worker;

use file::DiskFile;
use queue::BlkCounters;
use request::{Limits, Why, ID_BYTES, MAX_RANGES, MAX_RANGE_SECTORS};
use spec::DiskSpec;

/// Size of every queue.
pub const QUEUE_SIZE: u16 = 256;
/// virtio device id of a block device.
pub const DEVICE_ID: u32 = 2;
/// The largest buffer of a request (`size_max`): 1 MiB.
pub const SIZE_MAX: u32 = 1 << 20;
/// The most data buffers of a request (`seg_max`): a queue's size less the header and the
/// status.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Bytes of the configuration space (`struct virtio_blk_config` to `write_zeroes_may_unmap`
/// and its padding).
pub const CONFIG_LEN: usize = 60;

/// Why a block device could not be made.
#[derive(Debug, Error)]
pub enum BlkError {
    /// The file could not be used.
    #[error("{id}: cannot use its disk")]
    Disk {
        /// Device id.
        id: String,
        /// Cause.
        #[source]
        source: file::DiskError,
    },
    /// More queues than vCPUs.
    #[error(
        "{id}: {queues} request queues for {vcpus} vCPUs; a disk takes at most one queue per vCPU"
    )]
    TooManyQueues {
        /// Device id.
        id: String,
        /// Queues asked.
        queues: u16,
        /// vCPUs of the VM.
        vcpus: usize,
    },
    /// An eventfd could not be made.
    #[error("{id}: cannot make its eventfds")]
    EventFd {
        /// Device id.
        id: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// The features a disk offers.
pub fn offered_features(readonly: bool, can_punch: bool, queues: u16) -> u64 {
    let mut bits = vec![
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_BLK_F_SIZE_MAX,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_TOPOLOGY,
    ];
    if readonly {
        bits.push(VIRTIO_BLK_F_RO);
    } else if can_punch {
        bits.extend([VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES]);
    }
    if queues > 1 {
        bits.push(VIRTIO_BLK_F_MQ);
    }
    bits.iter().fold(0u64, |acc, b| acc | (1u64 << b))
}

/// The configuration space (`struct virtio_blk_config`, virtio 1.2, 5.2.4): capacity,
/// size_max, seg_max, blk_size 512, a 4 KiB physical block (topology), num_queues, and the
/// DISCARD and WRITE_ZEROES limits (read as 0 where not offered).
pub fn config_space(sectors: u64, queues: u16, punch: bool) -> [u8; CONFIG_LEN] {
    let mut c = [0u8; CONFIG_LEN];
    let mut put = |at: usize, b: &[u8]| c[at..at + b.len()].copy_from_slice(b);
    put(0, &sectors.to_le_bytes());
    put(8, &SIZE_MAX.to_le_bytes());
    put(12, &SEG_MAX.to_le_bytes());
    put(20, &512u32.to_le_bytes());
    // physical_block_exp (2^3 logical blocks per physical), alignment_offset, min_io_size
    // (in logical blocks), opt_io_size.
    put(24, &[3, 0]);
    put(26, &8u16.to_le_bytes());
    put(28, &0u32.to_le_bytes());
    put(34, &queues.to_le_bytes());
    if punch {
        put(36, &MAX_RANGE_SECTORS.to_le_bytes());
        put(40, &MAX_RANGES.to_le_bytes());
        // Discard sector alignment: a 4 KiB block.
        put(44, &8u32.to_le_bytes());
        put(48, &MAX_RANGE_SECTORS.to_le_bytes());
        put(52, &MAX_RANGES.to_le_bytes());
        // write_zeroes_may_unmap.
        put(56, &[1]);
    }
    c
}

/// What a block device's threads and readers share.
#[derive(Debug)]
pub struct BlkShared {
    /// Device id (`blk0`).
    pub id: String,
    /// The file.
    pub disk: DiskFile,
    /// Features offered.
    pub features: u64,
    /// GET_ID's answer.
    pub id_bytes: [u8; ID_BYTES],
    /// One kick eventfd per queue.
    pub kicks: Vec<EventFd>,
    /// Each thread's meter.
    pub meters: Vec<WorkerMeter>,
    /// Each queue's counters (chains, requests, bytes, kicks, interrupts).
    pub queues: Vec<QueueCounters>,
    /// Each queue's requests by type, errors and service times.
    pub requests: Vec<BlkCounters>,
    /// Set to stop the threads.
    pub stop: AtomicBool,
    /// The rate limiter (`rate=`), shared by the queues' threads (limiting nothing until it
    /// has buckets: `set-rate`).
    pub rate: Arc<SharedLimiter>,
    /// Times `set-rate` changed the limiter: a thread that sees a new count ends its rate
    /// wait and asks the new buckets.
    pub rate_changes: AtomicU32,
    /// How long a request thread polls its emptied ring before it sleeps, ns (`poll_us=`;
    /// 0: it does not).
    pub poll_ns: u64,
    /// Whether the driver negotiated FLUSH in the last activation a thread served: the
    /// features read 0 after the reset a guest's shutdown makes, and the report is read after.
    pub flush_negotiated: AtomicBool,
    logged: [AtomicBool; Why::ALL.len()],
}

impl BlkShared {
    /// The disk's limits with the features the driver negotiated on `virtio` (a thread's, as
    /// it takes the queues of an activation).
    pub fn limits(&self, virtio: &VirtioShared) -> Limits {
        let has = |bit: u32| virtio.has_feature(bit);
        self.flush_negotiated
            .store(has(VIRTIO_BLK_F_FLUSH), Ordering::Relaxed);
        Limits {
            sectors: self.disk.sectors(),
            readonly: self.disk.readonly(),
            discard: has(VIRTIO_BLK_F_DISCARD),
            write_zeroes: has(VIRTIO_BLK_F_WRITE_ZEROES),
            writeback: has(VIRTIO_BLK_F_FLUSH),
            id: self.id_bytes,
        }
    }

    /// Logs `why` the first time a request gets an error status for it.
    pub fn log_once(&self, why: Why) {
        if !self.logged[why.index()].swap(true, Ordering::Relaxed) {
            log::warn!("{}: {} (logged once)", self.id, why.describe());
        }
    }
}

/// A virtio-blk device.
pub struct BlkDevice {
    blk: Arc<BlkShared>,
    virtio: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    config: [u8; CONFIG_LEN],
    mmio_base: u64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The figures at the last reset, which readers subtract (taken only by readers and
    /// `reset`: the device threads never touch it).
    baseline: Mutex<Option<stats::Raw>>,
}

/// What a block device is made from.
pub struct BlkParams<'a> {
    /// Its configuration.
    pub spec: &'a DiskSpec,
    /// Its id.
    pub id: String,
    /// vCPUs of the VM (the most queues).
    pub vcpus: usize,
    /// Its interrupt line, when the guest has an interrupt controller.
    pub irq: Option<Arc<IrqLine>>,
    /// Guest RAM.
    pub memory: Arc<GuestMemoryMmap>,
    /// Its MMIO window's base.
    pub mmio_base: u64,
}

impl BlkDevice {
    /// Opens and locks the file and makes the device (its threads start with `start`).
    pub fn new(p: BlkParams<'_>) -> Result<(Arc<BlkDevice>, Arc<VirtioShared>), BlkError> {
        let queues = p.spec.queues;
        if usize::from(queues) > p.vcpus.max(1) {
            return Err(BlkError::TooManyQueues {
                id: p.id,
                queues,
                vcpus: p.vcpus,
            });
        }
        let disk =
            DiskFile::open(&p.spec.path, p.spec.readonly).map_err(|source| BlkError::Disk {
                id: p.id.clone(),
                source,
            })?;
        let nq = usize::from(queues);
        let efd = |source| BlkError::EventFd {
            id: p.id.clone(),
            source,
        };
        let mut id_bytes = [0u8; ID_BYTES];
        let n = p.id.len().min(ID_BYTES);
        id_bytes[..n].copy_from_slice(&p.id.as_bytes()[..n]);
        let blk = Arc::new(BlkShared {
            id: p.id.clone(),
            features: offered_features(disk.readonly(), disk.can_punch(), queues),
            id_bytes,
            kicks: eventfds(nq).map_err(efd)?,
            meters: (0..nq).map(|_| WorkerMeter::default()).collect(),
            queues: (0..nq).map(|_| QueueCounters::default()).collect(),
            requests: (0..nq).map(|_| BlkCounters::default()).collect(),
            stop: AtomicBool::new(false),
            flush_negotiated: AtomicBool::new(false),
            logged: Default::default(),
            rate: Arc::new(SharedLimiter::always(&p.spec.rate)),
            rate_changes: AtomicU32::new(0),
            poll_ns: u64::from(p.spec.poll_us) * 1000,
            disk,
        });
        let virtio = Arc::new(
            VirtioShared::new(p.id.clone(), &vec![QUEUE_SIZE; nq], nq, p.irq).map_err(efd)?,
        );
        log::info!(
            "{}: {} ({} sectors{}{}), {queues} queue(s)",
            p.id,
            blk.disk.path().display(),
            blk.disk.sectors(),
            if blk.disk.readonly() {
                ", read-only"
            } else {
                ""
            },
            if blk.disk.can_punch() {
                ", discard and write-zeroes"
            } else {
                ""
            }
        );
        let dev = Arc::new(BlkDevice {
            config: config_space(blk.disk.sectors(), queues, blk.disk.can_punch()),
            blk,
            virtio: Arc::clone(&virtio),
            mem: p.memory,
            mmio_base: p.mmio_base,
            threads: Mutex::new(Vec::new()),
            baseline: Mutex::new(None),
        });
        Ok((dev, virtio))
    }

    /// What the device's threads share (tests and benches look inside).
    pub fn shared(&self) -> &Arc<BlkShared> {
        &self.blk
    }

    fn thread_name(&self, queue: usize) -> String {
        format!("{}-q{queue}", self.blk.id)
    }
}

impl VirtioDevice for BlkDevice {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    fn features(&self) -> u64 {
        self.blk.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn kick_fd(&self, queue: usize) -> Option<&EventFd> {
        self.blk.kicks.get(queue)
    }
}

impl super::Device for BlkDevice {
    fn id(&self) -> &str {
        &self.blk.id
    }

    fn start(&self, control: &Arc<AccountingControl>) -> io::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        self.virtio.threads_started();
        for queue in 0..self.blk.queues.len() {
            let (blk, virtio, mem, control) = (
                Arc::clone(&self.blk),
                Arc::clone(&self.virtio),
                Arc::clone(&self.mem),
                Arc::clone(control),
            );
            let name = self.thread_name(queue);
            // Made on its thread: the worker's scratch holds raw I/O pointers between uses.
            threads.push(
                std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        worker::run(&name, worker::Worker::new(queue, blk, virtio, mem, control))
                    })?,
            );
        }
        Ok(())
    }

    fn stop(&self) {
        self.blk.stop.store(true, Ordering::Release);
        self.virtio.wake_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    fn threads(&self) -> Vec<DeviceThreadInfo> {
        (0..self.blk.queues.len())
            .map(|q| DeviceThreadInfo {
                device: self.blk.id.clone(),
                name: self.thread_name(q),
                host_tid: self.blk.meters[q].tid(),
                ..Default::default()
            })
            .collect()
    }

    fn cpu_ns(&self) -> u64 {
        self.blk.meters.iter().map(|m| m.times().used_ns).sum()
    }

    fn wake_threads(&self) {
        // Each queue's thread runs its wake pass once: it moves to one of its CPUs, and looks
        // at its hold before it waits again.
        self.virtio.wake_all();
    }

    fn worker_meters(&self) -> &[WorkerMeter] {
        // What a CPU limit of scope `vm` charges and holds, as a network device's.
        &self.blk.meters
    }

    fn set_rate(&self, rate: &str) -> Result<Option<String>, RateSpecError> {
        let r = spec::parse_rate(rate)?;
        self.blk.rate.set(&r);
        self.blk.rate_changes.fetch_add(1, Ordering::AcqRel);
        self.virtio.wake_all();
        Ok(spec::rate_value(&r))
    }

    fn reset(&self) {
        let mut b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        *b = Some(self.raw());
    }

    fn stats(&self) -> DeviceStats {
        // The baseline lock is held across the sample: a reader sees the figures wholly
        // before or wholly after a reset.
        let b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        self.raw().since(b.as_ref())
    }
}

#[cfg(test)]
mod tests;

//! The disk's features and configuration space, and the request pass over a queue driven by
//! the model of Linux's ring (`crate::fuzzing::driver`) in real guest memory, on an in-memory
//! disk. [`Rig`] is shared with the request tests.

use std::sync::Arc;

use ppa_vmm_api::{BlkRequestKind, BlkStatus};
use virtio_bindings::bindings::virtio_blk::*;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::memdisk::MemDisk;
use super::queue::{req_pass, BlkCounters, ReqQueue, REQ_BUDGET};
use super::request::{serve, Done, Limits, Refused, HEADER, ID_BYTES};
use super::*;
use crate::devices::virtio::chain::{Direction, Segments};
use crate::devices::virtio::counters::QueueCounters;
use crate::devices::virtio::pass::Irq;
use crate::devices::virtio::queue::{DeviceQueue, QueueFault};
use crate::fuzzing::driver::{Buf, DriverRing};

/// Where the rig's request headers, statuses and data go.
const HDRS: u64 = 0x2_0000;
const STATUS: u64 = 0x3_0000;
const DATA: u64 = 0x10_0000;
/// Data room per request slot.
const SLOT: u64 = 0x1_0000;

/// A queue in guest memory, the driver's side and the device's.
pub(crate) struct Rig {
    pub mem: Arc<GuestMemoryMmap>,
    pub ring: DriverRing,
    pub dq: DeviceQueue,
    /// Kicks the driver made (its publishes the device's notification state asked for).
    pub kicks: u64,
    next: u64,
}

/// One request as the rig lays it out.
pub(crate) struct Req<'a> {
    pub ty: u32,
    pub sector: u64,
    /// Readable data after the header (a write's sectors, DISCARD ranges).
    pub out: &'a [u8],
    /// Writable data before the status (a read's sectors, GET_ID's answer).
    pub in_len: u32,
}

/// Limits of a writable 64-sector disk that offers everything, with FLUSH negotiated.
pub(crate) fn limits() -> Limits {
    let mut id = [0u8; ID_BYTES];
    id[..4].copy_from_slice(b"blk0");
    Limits {
        sectors: 64,
        readonly: false,
        discard: true,
        write_zeroes: true,
        writeback: true,
        id,
    }
}

/// A device's queue of `size` over rings at `(desc, avail, used)`.
pub(crate) fn queue(size: u16, (d, a, u): (u64, u64, u64), event_idx: bool) -> Queue {
    let mut q = Queue::new(size).unwrap();
    q.try_set_size(size).unwrap();
    q.try_set_desc_table_address(GuestAddress(d)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(a)).unwrap();
    q.try_set_used_ring_address(GuestAddress(u)).unwrap();
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q
}

impl Rig {
    /// A queue of `size` with or without EVENT_IDX.
    pub fn new(size: u16, event_idx: bool) -> Rig {
        let mem =
            Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x80_0000)]).unwrap());
        let ring = DriverRing::new(&mem, 0x1000, size, event_idx);
        let dq = ring.device_queue(&mem);
        Rig {
            mem,
            ring,
            dq,
            kicks: 0,
            next: 0,
        }
    }

    /// Slot `k`'s status byte.
    pub fn status_of(&self, k: u64) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS + k)).unwrap()
    }

    /// Slot `k`'s data area (64 of them, reused in turn).
    pub fn data_of(&self, k: u64) -> u64 {
        DATA + (k % 64) * SLOT
    }

    /// Adds `r` (published; the status byte set to 0xff first); returns its slot.
    pub fn add(&mut self, r: &Req<'_>) -> u64 {
        let k = self.next;
        self.next += 1;
        let hdr = HDRS + 32 * k;
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&r.ty.to_le_bytes());
        h[8..].copy_from_slice(&r.sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(hdr)).unwrap();
        self.mem
            .write_obj(0xffu8, GuestAddress(STATUS + k))
            .unwrap();
        let data = self.data_of(k);
        let mut bufs = vec![Buf {
            addr: hdr,
            len: HEADER as u32,
            write: false,
        }];
        if !r.out.is_empty() {
            self.mem.write_slice(r.out, GuestAddress(data)).unwrap();
            bufs.push(Buf {
                addr: data,
                len: r.out.len() as u32,
                write: false,
            });
        }
        if r.in_len > 0 {
            bufs.push(Buf {
                addr: data,
                len: r.in_len,
                write: true,
            });
        }
        bufs.push(Buf {
            addr: STATUS + k,
            len: 1,
            write: true,
        });
        self.raw(&bufs);
        k
    }

    /// Adds a chain of `bufs` as given, published.
    pub fn raw(&mut self, bufs: &[Buf]) {
        self.ring.add(&self.mem, bufs).expect("room in the ring");
        self.kicks += u64::from(self.ring.publish(&self.mem));
    }

    /// Pops the next chain and serves it on `disk`, then gives it back (with the status's
    /// length when it was refused) and lets the driver take it.
    pub fn serve(&mut self, disk: &MemDisk, l: &Limits) -> Result<Done, Refused> {
        let chain = self.dq.pop(&self.mem).unwrap().expect("a chain");
        let mut segs = Segments::with_capacity(usize::from(self.dq.size()));
        segs.load(chain, &self.mem, Direction::ReadThenWrite, 1)
            .unwrap();
        let mut iov = Vec::with_capacity(usize::from(self.dq.size()));
        let r = serve(&segs, &self.mem, disk, l, &mut iov);
        let used = r.map_or(0, |d| d.used);
        self.dq.add_used(segs.head(), used).unwrap();
        assert_eq!(self.ring.pop_used(&self.mem), Some((segs.head(), used)));
        r
    }
}

#[test]
fn features_follow_the_disk() {
    let f = offered_features(false, false, 1);
    for bit in [
        VIRTIO_BLK_F_SIZE_MAX,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_FLUSH,
    ] {
        assert_ne!(f & (1 << bit), 0, "bit {bit}");
    }
    assert_ne!(f & (1 << VIRTIO_F_VERSION_1), 0);
    for bit in [
        VIRTIO_BLK_F_RO,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
        VIRTIO_BLK_F_MQ,
        VIRTIO_BLK_F_CONFIG_WCE,
    ] {
        assert_eq!(f & (1 << bit), 0, "bit {bit}");
    }
    let punch = offered_features(false, true, 2);
    assert_ne!(punch & (1 << VIRTIO_BLK_F_DISCARD), 0);
    assert_ne!(punch & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
    assert_ne!(punch & (1 << VIRTIO_BLK_F_MQ), 0);
    let ro = offered_features(true, true, 1);
    assert_ne!(ro & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(
        ro & (1 << VIRTIO_BLK_F_DISCARD),
        0,
        "a read-only disk discards nothing"
    );
}

#[test]
fn the_configuration_space_is_virtio_blk_config() {
    let c = config_space(1 << 21, 2, true);
    let u32_at = |o: usize| u32::from_le_bytes(c[o..o + 4].try_into().unwrap());
    assert_eq!(u64::from_le_bytes(c[..8].try_into().unwrap()), 1 << 21);
    assert_eq!(
        (u32_at(8), u32_at(12), u32_at(20)),
        (SIZE_MAX, SEG_MAX, 512)
    );
    assert_eq!(c[24], 3, "4 KiB physical blocks");
    assert_eq!(u16::from_le_bytes([c[34], c[35]]), 2);
    assert_eq!(
        (u32_at(36), u32_at(40), u32_at(48), c[56]),
        (MAX_RANGE_SECTORS, MAX_RANGES, MAX_RANGE_SECTORS, 1)
    );
    let plain = config_space(8, 1, false);
    assert!(
        plain[36..].iter().all(|b| *b == 0),
        "no discard limits offered"
    );
}

pub(crate) fn pass(
    rig: &mut Rig,
    rq: &mut ReqQueue,
    disk: &MemDisk,
    c: &(QueueCounters, BlkCounters),
) -> super::queue::Outcome {
    req_pass(rq, &rig.mem, disk, &c.0, &c.1, || true)
}

pub(crate) fn req_queue(rig: &Rig, l: Limits) -> ReqQueue {
    // The pass takes the rig's queue; the rig keeps the driver's side.
    let q = queue(rig.ring.size(), rig.ring.addrs(), rig.dq.event_idx());
    ReqQueue::new(DeviceQueue::new(q, &rig.mem).unwrap(), l)
}

#[test]
fn a_pass_answers_every_request_counts_them_and_stops_at_its_budget() {
    let mut rig = Rig::new(1024, true);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = (QueueCounters::default(), BlkCounters::default());
    let n = REQ_BUDGET + 10;
    let block = [7u8; 512];
    for i in 0..n {
        let write = i % 2 == 0;
        rig.add(&Req {
            ty: if write {
                VIRTIO_BLK_T_OUT
            } else {
                VIRTIO_BLK_T_IN
            },
            sector: i % 64,
            out: if write { &block } else { &[] },
            in_len: if write { 0 } else { 512 },
        });
    }
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.more, o.fault), (REQ_BUDGET, true, None));
    assert_eq!(o.irq, Irq::Wanted, "EVENT_IDX's used_event 0 was passed");
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.more), (10, false));
    let mut got = 0;
    while rig.ring.pop_used(&rig.mem).is_some() {
        got += 1;
    }
    assert_eq!(got, n, "every chain given back");
    assert!((0..n).all(|k| rig.status_of(k) == 0), "every status OK");
    let counts = c.1.counts();
    assert_eq!(counts.requests(BlkRequestKind::Write), n / 2);
    assert_eq!(counts.requests(BlkRequestKind::Read), n / 2);
    assert_eq!((counts.read, counts.written), (512 * n / 2, 512 * n / 2));
    assert_eq!(counts.service[BlkRequestKind::Read.index()].count(), n / 2);
    let q = c.0.stats(0, ppa_vmm_api::QueueKind::Req);
    assert_eq!(
        (q.chains, q.requests, q.bytes, q.packets),
        (n, Some(n), 512 * n, 0)
    );
}

#[test]
fn a_chain_with_no_place_for_a_status_stops_the_queue_and_errors_do_not() {
    let mut rig = Rig::new(16, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = (QueueCounters::default(), BlkCounters::default());
    // A request of an unknown type: answered UNSUPP, the queue goes on.
    rig.add(&Req {
        ty: 99,
        sector: 0,
        out: &[],
        in_len: 0,
    });
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (1, None));
    assert_eq!(rig.status_of(0), VIRTIO_BLK_S_UNSUPP as u8);
    assert_eq!(c.1.counts().errors[BlkStatus::Unsupp.index()], 1);
    assert_ne!(o.whys, 0, "the reason is there to log");
    // Only readable buffers: nowhere to answer.
    rig.raw(&[Buf {
        addr: HDRS,
        len: 16,
        write: false,
    }]);
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert!(matches!(o.fault, Some(QueueFault::Chain(_))), "{o:?}");
    assert_eq!(o.irq, Irq::None);
}

#[test]
fn an_abandoned_pass_takes_nothing() {
    let mut rig = Rig::new(16, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = (QueueCounters::default(), BlkCounters::default());
    rig.add(&Req {
        ty: VIRTIO_BLK_T_FLUSH,
        sector: 0,
        out: &[],
        in_len: 0,
    });
    let o = req_pass(&mut rq, &rig.mem, &disk, &c.0, &c.1, || false);
    assert!(o.abandoned && o.handled == 0);
    assert_eq!(rig.status_of(0), 0xff, "not answered");
}

#[test]
fn a_request_the_rate_cannot_pay_for_waits_in_the_ring_and_goes_first_after() {
    use crate::devices::rate::{BucketSpec, RateSpec, SharedLimiter};
    let mut rig = Rig::new(16, true);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = (QueueCounters::default(), BlkCounters::default());
    let block = [9u8; 512];
    for i in 0..3 {
        rig.add(&Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: i,
            out: &block,
            in_len: 0,
        });
    }
    // 1 KiB of data an hour: two writes of 512 bytes, then a wait.
    let spec = RateSpec {
        bytes: Some(BucketSpec {
            size: 1024,
            refill_ns: 3_600_000_000_000,
            burst: 0,
        }),
        ops: None,
    };
    rq.rate = SharedLimiter::new(&spec).map(Arc::new);
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault, o.more), (2, None, false));
    assert!(o.throttled.is_some_and(|w| w > 1_000_000_000_000), "{o:?}");
    assert_eq!(o.irq, Irq::Wanted, "the two answered are signalled");
    assert_eq!((rig.status_of(1), rig.status_of(2)), (0, 0xff));
    assert_eq!(c.0.chains.get(), 2, "the request put back is not counted");
    // Tokens again: the waiting request goes.
    rq.rate = SharedLimiter::new(&spec).map(Arc::new);
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.throttled), (1, None));
    assert_eq!(rig.status_of(2), 0);
    assert_eq!(c.1.counts().written, 3 * 512);
}

#[test]
fn flush_negotiated_outlives_the_reset_a_guest_makes_at_shutdown() {
    let path = std::env::temp_dir().join(format!("ppa-blk-flush-{}.img", std::process::id()));
    std::fs::write(&path, vec![0u8; 64 * 512]).unwrap();
    let memory =
        Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let spec = DiskSpec {
        poll_us: 0,
        path: path.clone(),
        readonly: false,
        id: None,
        queues: 1,
        rate: Default::default(),
    };
    let (dev, virtio) = BlkDevice::new(BlkParams {
        spec: &spec,
        id: "blk0".into(),
        vcpus: 1,
        irq: None,
        memory,
        mmio_base: 0,
    })
    .unwrap();
    let _ = std::fs::remove_file(&path);
    let flush = |d: &BlkDevice| {
        crate::devices::Device::stats(d)
            .blk
            .expect("a disk's figures")
            .flush_negotiated
    };
    assert!(!flush(&dev), "nothing negotiated yet");
    // The driver takes FLUSH and a thread takes the queues of that activation.
    virtio.driver_features_atomic().store(
        1 << VIRTIO_BLK_F_FLUSH,
        std::sync::atomic::Ordering::Release,
    );
    assert!(dev.shared().limits(&virtio).writeback);
    assert!(flush(&dev));
    // The guest's shutdown resets the device: its features read 0, the figure stays.
    virtio
        .driver_features_atomic()
        .store(0, std::sync::atomic::Ordering::Release);
    assert!(flush(&dev), "the last activation's FLUSH");
    // A limit of scope `vm` charges and holds what `worker_meters` gives: one meter per
    // queue thread, in the order of `threads` (it gave none before, so disks ran unheld).
    let d: &dyn crate::devices::Device = &*dev;
    assert_eq!(d.worker_meters().len(), d.threads().len());
    assert_eq!(d.worker_meters().len(), 1);
}

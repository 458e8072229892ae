//! The fuzzer's model of a Linux guest driving our virtio-blk device: the driver (over a
//! [`super::driver::DriverRing`], Linux's `virtio_ring.c`, answering completions as
//! `virtblk_done` does) posts requests, well-formed and malformed, and the device's queue
//! thread (played here, running the same pass as the real thread:
//! [`crate::devices::blk::queue::req_pass`]) answers them on an in-memory disk, step by step
//! as the fuzzer's bytes say.
//!
//! What it asserts: a kick is the only way the driver wakes the device and an interrupt the
//! only way the device wakes the driver, each exactly when the other side's index says so; so
//! at quiescence every request the driver posted has been answered and seen. Each answer is
//! the one a reference reading of the virtio spec gives ([`expect`], written apart from the
//! device's code): its status byte, the used length, what a read or GET_ID put into the
//! guest's buffers; and the disk holds exactly what the answered requests, applied in order,
//! leave. A chain with no writable byte stops the queue (NEEDS_RESET), and nothing else does.
//!
//! With a rate limiter (the setup's choice: small buckets on the model's own clock), a pass
//! it stops leaves the rest to its timer as the real thread does: kicks meanwhile start
//! nothing, the timer's firing moves the model's clock to its deadline and runs the pass, and
//! at quiescence nothing may be left either.
//!
//! With polling (`poll_us=`, the setup's choice), a pass that empties the ring leaves the
//! driver's notifications off and the thread polls: its looks answer what the driver made
//! available meanwhile (without a kick, which the model's driver makes only when the ring's
//! state asks for one), and the window's end is a pass that turns notifications on and looks
//! once more; at quiescence a polling thread's window ends, and nothing may be left.
//!
//! Data flow: [`run`] reads the setup from the first bytes (queue size, EVENT_IDX, the disk's
//! size and offers), then one action per byte (with arguments from the next ones) until the
//! input ends (posting a request, the device's thread running, the driver's completion
//! handler running, or starting with its callbacks off), then drives both sides to
//! quiescence and checks.

use std::cell::Cell;
use std::collections::VecDeque;

use std::sync::Arc;

use virtio_bindings::bindings::virtio_blk::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::blk::{limits_of, Checked};
use super::driver::{Buf, DriverRing};
use crate::devices::blk::file::SECTOR;
use crate::devices::blk::queue::{req_pass, BlkCounters, ReqQueue};
use crate::devices::blk::request::{Limits, ID_BYTES, MAX_RANGES, MAX_RANGE_SECTORS};
use crate::devices::rate::{BucketSpec, RateSpec, SharedLimiter};
use crate::devices::virtio::counters::QueueCounters;
use crate::devices::virtio::pass::Irq;
use crate::devices::virtio::queue::QueueFault;

/// Guest memory of the model.
const MEM: usize = 0x20_0000;
/// The rings' base.
const RINGS: u64 = 0x1000;
/// Request slots in flight at most, and where their parts lie.
const SLOTS: u64 = 64;
const HDRS: u64 = 0x8000;
const STATUS: u64 = 0xC000;
const DATA: u64 = 0x1_0000;
/// Data room of a slot.
const SLOT: u64 = 0x4000;
/// Steps at quiescence before the model calls it a livelock.
const QUIESCE_STEPS: usize = 10_000;

thread_local! {
    /// The model's clock (ns): it moves only when the rate timer fires.
    static CLOCK: Cell<u64> = const { Cell::new(1_000_000_000) };
}

fn model_now() -> u64 {
    CLOCK.with(Cell::get)
}

/// A rate limit of 1-4 requests and 4-16 KiB a millisecond (`v` picks), or none.
fn rate_of(on: bool, v: u8) -> Option<RateSpec> {
    on.then(|| RateSpec {
        ops: Some(BucketSpec {
            size: 1 + u64::from(v % 4),
            refill_ns: 1_000_000,
            burst: 0,
        }),
        bytes: Some(BucketSpec {
            size: 4096 * (1 + u64::from(v / 4 % 4)),
            refill_ns: 1_000_000,
            burst: 0,
        }),
    })
}

/// One request as the driver posted it.
#[derive(Debug, Clone)]
struct Posted {
    head: u16,
    slot: u64,
    /// Every readable byte, in order (the header first, when the driver wrote a whole one).
    readable: Vec<u8>,
    /// Writable bytes, the status (the last of them) included.
    w: u64,
    /// Where the writable data starts.
    write_at: u64,
    /// Where the status byte is.
    status_at: u64,
}

/// What the spec says a request gets: status, used length, bytes a read returns (or the id).
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u8,
    used: u32,
    data: Option<Vec<u8>>,
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap_or([0; 4]))
}

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

fn status(s: u8) -> Answer {
    Answer {
        status: s,
        used: 1,
        data: None,
    }
}

/// The reference answer to `p` on a disk of bytes `disk` under `l`, applied to `disk`.
fn expect(p: &Posted, l: &Limits, disk: &mut [u8]) -> Answer {
    if p.readable.len() < 16 {
        return status(IOERR);
    }
    let (ty, sector) = (le32(&p.readable), le64(&p.readable[8..]));
    let out = &p.readable[16..];
    let span = |len: u64| -> Option<usize> {
        let end = sector.checked_add(len / SECTOR)?;
        (len % SECTOR == 0 && end <= l.sectors).then(|| (sector * SECTOR) as usize)
    };
    match ty {
        VIRTIO_BLK_T_IN => {
            let len = p.w - 1;
            match (out.is_empty(), span(len)) {
                (true, Some(at)) => Answer {
                    status: OK,
                    used: p.w as u32,
                    data: Some(disk[at..at + len as usize].to_vec()),
                },
                _ => status(IOERR),
            }
        }
        VIRTIO_BLK_T_OUT => match span(out.len() as u64) {
            Some(at) if !l.readonly && p.w == 1 => {
                disk[at..at + out.len()].copy_from_slice(out);
                status(OK)
            }
            _ => status(IOERR),
        },
        VIRTIO_BLK_T_FLUSH => status(OK),
        VIRTIO_BLK_T_GET_ID if out.is_empty() => {
            let n = (p.w - 1).min(ID_BYTES as u64) as usize;
            Answer {
                status: OK,
                used: n as u32 + 1,
                data: Some(l.id[..n].to_vec()),
            }
        }
        VIRTIO_BLK_T_GET_ID => status(IOERR),
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => ranges(out, p.w, ty, l, disk),
        _ => status(UNSUPP),
    }
}

/// DISCARD and WRITE_ZEROES (ranges `out`, `w` writable bytes): every range checked in order
/// (its flags, its length, its end) before any is carried out.
fn ranges(out: &[u8], w: u64, ty: u32, l: &Limits, disk: &mut [u8]) -> Answer {
    let discard = ty == VIRTIO_BLK_T_DISCARD;
    if l.readonly || !(if discard { l.discard } else { l.write_zeroes }) {
        return status(UNSUPP);
    }
    if w != 1 || out.is_empty() || out.len() % 16 != 0 || out.len() / 16 > MAX_RANGES as usize {
        return status(IOERR);
    }
    let unmap = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
    let mut zero = Vec::new();
    for r in out.chunks_exact(16) {
        let (sector, count, flags) = (le64(r), le32(&r[8..]), le32(&r[12..]));
        if flags & !unmap != 0 || (discard && flags & unmap != 0) {
            return status(UNSUPP);
        }
        if count > MAX_RANGE_SECTORS {
            return status(IOERR);
        }
        match sector.checked_add(u64::from(count)) {
            Some(end) if end <= l.sectors => zero.push((sector, count)),
            _ => return status(IOERR),
        }
    }
    for (sector, count) in zero {
        let at = (sector * SECTOR) as usize;
        disk[at..at + (u64::from(count) * SECTOR) as usize].fill(0);
    }
    status(OK)
}

/// Both sides and what the model expects.
struct Model {
    mem: Arc<GuestMemoryMmap>,
    ring: DriverRing,
    rq: ReqQueue,
    disk: Checked,
    counters: (QueueCounters, BlkCounters),
    limits: Limits,
    event_idx: bool,
    /// The driver's picture of the disk.
    shadow: Vec<u8>,
    pending: VecDeque<Posted>,
    /// Slots in use.
    used_slots: u64,
    /// The driver kicked since the device's last pass, or a pass said it has more.
    woken: bool,
    /// A chain with no writable byte was posted: the queue may stop.
    may_fault: bool,
    stopped: bool,
    seq: u8,
    /// The queue waits for its rate limiter's tokens: the model's time its timer fires at.
    throttled: Option<u64>,
    /// The device polls its emptied ring (`poll_us=`, the setup's choice).
    poll: bool,
    /// It is polling now: notifications held off, the ring looked at without a kick.
    polling: bool,
}

impl Model {
    fn new(size: u16, event_idx: bool, limits: Limits, rate: Option<RateSpec>) -> Option<Model> {
        let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).ok()?);
        let ring = DriverRing::new(&mem, RINGS, size, event_idx);
        let mut rq = ReqQueue::new(ring.device_queue(&mem), limits);
        rq.rate = rate.map(|r| Arc::new(SharedLimiter::on_clock(&r, model_now)));
        Some(Model {
            disk: Checked::new(limits.sectors, limits.readonly),
            shadow: vec![0; (limits.sectors * SECTOR) as usize],
            mem,
            ring,
            rq,
            counters: (QueueCounters::default(), BlkCounters::default()),
            limits,
            event_idx,
            pending: VecDeque::new(),
            used_slots: 0,
            woken: false,
            may_fault: false,
            stopped: false,
            seq: 0,
            throttled: None,
            poll: false,
            polling: false,
        })
    }

    /// Posts a request of `header`, `out` readable and `in_len` writable bytes, and a status
    /// byte unless `no_status`; publishes it and kicks when the device asked for kicks.
    fn post(&mut self, header: Vec<u8>, out: Vec<u8>, in_len: u32, no_status: bool) {
        if self.stopped || self.used_slots.count_ones() as u64 >= SLOTS {
            return;
        }
        let slot = u64::from((!self.used_slots).trailing_zeros());
        let (hdr, st, data) = (HDRS + 64 * slot, STATUS + slot, DATA + SLOT * slot);
        let _ = self.mem.write_slice(&header, GuestAddress(hdr));
        let _ = self.mem.write_slice(&out, GuestAddress(data));
        let _ = self.mem.write_obj(0xeeu8, GuestAddress(st));
        let mut bufs = Vec::new();
        if !header.is_empty() {
            bufs.push(Buf {
                addr: hdr,
                len: header.len() as u32,
                write: false,
            });
        }
        if !out.is_empty() {
            bufs.push(Buf {
                addr: data,
                len: out.len() as u32,
                write: false,
            });
        }
        if in_len > 0 {
            bufs.push(Buf {
                addr: data + out.len() as u64,
                len: in_len,
                write: true,
            });
        }
        if !no_status {
            bufs.push(Buf {
                addr: st,
                len: 1,
                write: true,
            });
        }
        let Some(head) = self.ring.add(&self.mem, &bufs) else {
            return;
        };
        self.used_slots |= 1 << slot;
        // Without a status buffer the last data byte is where the status goes; without
        // either, there is nowhere to answer.
        let w = u64::from(in_len) + u64::from(!no_status);
        self.may_fault |= w == 0;
        let write_at = data + out.len() as u64;
        let status_at = if no_status {
            (write_at + u64::from(in_len)).saturating_sub(1)
        } else {
            st
        };
        let mut readable = header;
        readable.extend_from_slice(&out);
        self.pending.push_back(Posted {
            head,
            slot,
            readable,
            w,
            write_at,
            status_at,
        });
        if self.ring.publish(&self.mem) {
            self.woken = true;
        }
    }

    /// The device thread runs a pass if something woke it (with polling, one that holds
    /// notifications off and then polls); the driver handles the interrupt.
    fn device(&mut self) {
        if !self.woken || self.stopped {
            return;
        }
        self.woken = false;
        if self.throttled.is_some() {
            // A kick while the queue waits for tokens starts nothing: its timer runs it.
            return;
        }
        self.polling = self.pass(self.poll) && self.poll;
    }

    /// While polling, the thread looks at the ring: a request there is answered by a pass
    /// that keeps notifications off (one that does not settle ends the polling, its outcome
    /// carried out as the thread does).
    fn look(&mut self) {
        if !self.polling || self.stopped {
            return;
        }
        if self.rq.dq.has_available().unwrap_or(true) {
            self.polling = self.pass(true);
        }
    }

    /// The polling's window ends: a pass turns notifications on and looks once more.
    fn end_poll(&mut self) {
        if std::mem::take(&mut self.polling) && !self.stopped {
            self.pass(false);
        }
    }

    /// One pass (notifications held off at an emptied ring when `hold`), checked and carried
    /// out; whether it settled (nothing left for the thread to carry out).
    fn pass(&mut self, hold: bool) -> bool {
        let old = self.ring.used_idx(&self.mem);
        let (qc, bc) = (&self.counters.0, &self.counters.1);
        self.rq.hold = hold;
        let o = req_pass(&mut self.rq, &self.mem, &self.disk, qc, bc, || true);
        if let Some(f) = o.fault {
            assert!(
                self.may_fault && matches!(f, QueueFault::Chain(_)),
                "the queue stopped ({f:?}) though every chain had a status byte"
            );
            self.stopped = true;
            return false;
        }
        let wants = self.ring.wants_interrupt(&self.mem, old);
        match o.irq {
            Irq::Wanted => assert!(wants, "an interrupt the driver did not ask for"),
            Irq::Suppressed => assert!(!wants, "no interrupt where the driver asked for one"),
            Irq::None => assert_eq!(o.handled, 0, "requests answered without a decision"),
        }
        self.woken |= o.more;
        if let Some(w) = o.throttled {
            assert!(
                self.rq.rate.is_some(),
                "a pass without a limiter was throttled"
            );
            self.throttled = Some(model_now() + w);
        }
        if o.irq == Irq::Wanted {
            self.done();
        }
        !o.more && o.throttled.is_none()
    }

    /// The rate timer fires (when the queue waits): the model's time moves to its deadline
    /// and the queue runs.
    fn timer(&mut self) {
        if let Some(at) = self.throttled.take() {
            CLOCK.with(|c| c.set(c.get().max(at)));
            self.woken = true;
            self.device();
        }
    }

    /// `virtblk_done`: takes every answer (callbacks off meanwhile), until enabling them finds
    /// nothing new.
    fn done(&mut self) {
        loop {
            self.ring.disable_cb(&self.mem);
            while let Some((head, len)) = self.ring.pop_used(&self.mem) {
                self.check(head, len);
            }
            if self.ring.enable_cb(&self.mem) {
                break;
            }
        }
    }

    /// Checks the answer to the oldest request (the queue answers in order).
    fn check(&mut self, head: u16, len: u32) {
        let p = self
            .pending
            .pop_front()
            .expect("an answer to a request never posted");
        assert_eq!(head, p.head, "answers come in order");
        self.used_slots &= !(1 << p.slot);
        let want = expect(&p, &self.limits, &mut self.shadow);
        let got: u8 = self.mem.read_obj(GuestAddress(p.status_at)).unwrap_or(0xee);
        assert_eq!(
            (got, len),
            (want.status, want.used),
            "status and used length of {p:?}"
        );
        if let Some(data) = want.data {
            let mut back = vec![0u8; data.len()];
            let _ = self.mem.read_slice(&mut back, GuestAddress(p.write_at));
            assert_eq!(back, data, "what a read or GET_ID returned");
        }
    }

    /// A request of kind `k` from the next bytes.
    fn request(&mut self, k: u8, a: &[u8]) {
        self.seq = self.seq.wrapping_add(1);
        let b = |i: usize| a.get(i).copied().unwrap_or(0);
        let sectors = self.limits.sectors;
        let sector = u64::from(b(0)) % (sectors + 2);
        let n = u64::from(b(1) % 8) + 1;
        let hdr = |ty: u32, sector: u64| {
            let mut h = ty.to_le_bytes().to_vec();
            h.extend([0; 4]);
            h.extend(sector.to_le_bytes());
            h
        };
        let seq = self.seq;
        match k {
            0 => {
                let out = (0..n * SECTOR).map(|i| (i as u8) ^ seq).collect();
                self.post(hdr(VIRTIO_BLK_T_OUT, sector), out, 0, false);
            }
            1 => self.post(
                hdr(VIRTIO_BLK_T_IN, sector),
                Vec::new(),
                (n * SECTOR) as u32,
                false,
            ),
            2 => self.post(hdr(VIRTIO_BLK_T_FLUSH, 0), Vec::new(), 0, false),
            3 => self.post(
                hdr(VIRTIO_BLK_T_GET_ID, 0),
                Vec::new(),
                u32::from(b(0) % 24),
                false,
            ),
            4 => {
                let ty = if b(2) & 1 == 0 {
                    VIRTIO_BLK_T_DISCARD
                } else {
                    VIRTIO_BLK_T_WRITE_ZEROES
                };
                let mut out = Vec::new();
                for r in 0..usize::from(b(2) >> 1) % 3 + 1 {
                    out.extend((u64::from(b(3 + r)) % (sectors + 1)).to_le_bytes());
                    out.extend(u32::from(b(6 + r) % 16).to_le_bytes());
                    let f = b(9 + r);
                    let flags = if f & 0xc0 == 0xc0 {
                        u32::from(f & 3)
                    } else {
                        0
                    };
                    out.extend(flags.to_le_bytes());
                }
                self.post(hdr(ty, 0), out, 0, false);
            }
            _ => {
                // Malformed: a short or odd header, data both ways or unaligned, an unknown
                // type; rarely no status byte at all.
                let ty = [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_GET_ID, 99]
                    [usize::from(b(2) & 3)];
                let mut h = hdr(ty, sector);
                if b(3) & 0x10 != 0 {
                    h.truncate(usize::from(b(3) % 16));
                }
                let out = vec![seq; usize::from(b(4)) * 9 % 1100];
                let in_len = u32::from(b(5)) * 7 % 1100;
                self.post(h, out, in_len, b(6) == 0xff);
            }
        }
    }
}

/// Runs the model over `data` (see the module's comment).
pub fn run(data: &[u8]) {
    let Some((&[a, b], actions)) = data.split_first_chunk::<2>() else {
        return;
    };
    let size = 1u16 << (a % 9);
    let limits = limits_of(b, u64::from(a >> 4) * 8 + 8);
    let rate = rate_of(b & 0x01 != 0, a);
    let Some(mut m) = Model::new(size, b & 0x10 != 0, limits, rate) else {
        return;
    };
    m.poll = b & 0x02 != 0;
    let mut i = 0;
    while i < actions.len() && i < 4096 {
        let op = actions[i];
        let args = &actions[i + 1..actions.len().min(i + 13)];
        match op % 10 {
            k @ 0..=5 => {
                m.request(k, args);
                i += 13;
                continue;
            }
            6 => m.device(),
            7 if m.throttled.is_some() => m.timer(),
            // Polling: the thread looks at the ring, or its window ends.
            7 if m.polling && (op / 10) % 2 == 0 => m.look(),
            7 if m.polling => m.end_poll(),
            7 => m.device(),
            8 => m.done(),
            // The driver is in its completion handler: callbacks off until it finishes.
            _ => m.ring.disable_cb(&m.mem),
        }
        i += 1;
    }
    quiesce(&mut m);
}

/// Drives both sides until nothing is pending, then checks that nothing was left behind.
fn quiesce(m: &mut Model) {
    // A completion handler in progress finishes (it takes what is there, callbacks on).
    m.done();
    for _ in 0..QUIESCE_STEPS {
        if m.stopped {
            break;
        }
        if m.polling {
            // Polling that finds nothing ends.
            m.look();
            m.end_poll();
        } else if m.throttled.is_some() {
            m.timer();
        } else if m.woken {
            m.device();
        } else {
            break;
        }
    }
    if m.stopped {
        return;
    }
    assert!(
        !m.woken && m.throttled.is_none() && !m.polling,
        "the device never settles"
    );
    assert!(
        m.pending.is_empty(),
        "{} requests left without a kick or an interrupt (event_idx {}): {:?}",
        m.pending.len(),
        m.event_idx,
        m.pending.front()
    );
    assert_eq!(m.ring.outstanding(), 0);
    assert_eq!(
        &*m.disk.inner.bytes.borrow(),
        &m.shadow,
        "the disk holds what the answered requests leave"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Setup bytes: queue size 2^a%9, the disk's offers in b (0x01: a rate limit, sized by a).
    fn input(a: u8, b: u8, actions: &[u8]) -> Vec<u8> {
        let mut v = vec![a, b];
        v.extend_from_slice(actions);
        v
    }

    /// A request action with its 12 argument bytes.
    fn req(k: u8, args: [u8; 12]) -> Vec<u8> {
        let mut v = vec![k];
        v.extend(args);
        v
    }

    #[test]
    fn a_polling_device_takes_requests_without_kicks_and_leaves_none_behind() {
        for event_idx in [true, false] {
            let limits = limits_of(0, 64);
            let mut m = Model::new(64, event_idx, limits, None).unwrap();
            m.poll = true;
            m.request(0, &[1, 1]);
            assert!(m.woken, "the first request is kicked");
            m.device();
            assert!(m.polling && m.pending.is_empty());
            // While the thread polls, the driver's requests come without a kick.
            for i in 0..5u8 {
                m.request(i % 3, &[i, i % 5]);
            }
            assert!(!m.woken, "no kick while polling (event_idx {event_idx})");
            assert!(!m.pending.is_empty());
            m.look();
            assert!(m.polling && m.pending.is_empty(), "the look answers them");
            // A request made as the window ends is taken by the closing pass.
            m.request(1, &[9, 2]);
            m.end_poll();
            assert!(!m.polling);
            assert!(m.pending.is_empty(), "the closing pass looked once more");
            m.request(1, &[3, 3]);
            assert!(m.woken, "kicked again once the polling ended");
            quiesce(&mut m);
        }
        // And through the fuzzer's bytes: looks (7) and window ends (17) between requests.
        let mut actions = Vec::new();
        for i in 0..40u8 {
            actions.extend(req(i % 3, [i, i % 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
            actions.push([6, 7, 17, 8][usize::from(i % 4)]);
        }
        for b in [0x02, 0x12, 0x13] {
            run(&input(0x74, b, &actions));
        }
    }

    #[test]
    fn writes_reads_and_flushes_in_a_burst_past_the_ring() {
        for (a, b) in [(0x72, 0xc0), (0x74, 0xd0), (0x31, 0x10), (0xf8, 0x08)] {
            let mut actions = Vec::new();
            for i in 0..40u8 {
                actions.extend(req(i % 3, [i, i % 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
                if i % 7 == 0 {
                    actions.push(6);
                }
            }
            run(&input(a, b, &actions));
        }
    }

    #[test]
    fn discards_get_ids_and_malformed_requests_are_answered() {
        let mut actions = Vec::new();
        for i in 0..30u8 {
            actions.extend(req(
                3 + i % 3,
                [i, i, i, i.wrapping_mul(7), 3, 9, 1, 2, 3, 4, 5, 6],
            ));
            actions.push(if i % 2 == 0 { 6 } else { 8 });
        }
        for b in [0xc0, 0xe0, 0x00] {
            run(&input(0x75, b, &actions));
        }
    }

    #[test]
    fn answers_while_the_driver_has_callbacks_off_come_without_an_interrupt() {
        for b in [0x00, 0x10] {
            let mut actions = Vec::new();
            for i in 0..12u8 {
                actions.extend(req(i % 2, [i, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
                actions.extend([9, 6, 6]);
                if i % 3 == 2 {
                    actions.push(8);
                }
            }
            run(&input(0x74, b, &actions));
        }
    }

    #[test]
    fn a_chain_without_a_status_byte_stops_the_queue_and_nothing_else_does() {
        let actions = req(5, [0, 0, 0, 0, 0, 0, 0xff, 0, 0, 0, 0, 0]);
        run(&input(0x74, 0, &actions));
    }

    #[test]
    fn a_rate_limited_queue_waits_for_its_timer_and_leaves_nothing() {
        // Writes and reads past small buckets: the pass stops for tokens (the model's clock
        // moves only when the timer fires), kicks meanwhile start nothing, and at quiescence
        // every request was answered all the same.
        for (a, b) in [(0x74, 0x01), (0x73, 0x11), (0xf6, 0xc1)] {
            let mut actions = Vec::new();
            for i in 0..30u8 {
                actions.extend(req(i % 3, [i, 1 + i % 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
                actions.push(if i % 4 == 0 { 7 } else { 6 });
            }
            let t0 = model_now();
            run(&input(a, b, &actions));
            assert!(
                model_now() > t0,
                "({a:#x}, {b:#x}): no pass waited for tokens"
            );
        }
    }

    #[test]
    fn pseudo_random_inputs_hold_every_property() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200 {
            let len = (x % 400) as usize + 2;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            super::super::blk::blk(&data);
        }
    }
}

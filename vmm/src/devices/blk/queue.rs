//! A request queue and the pass over it: the chains the guest made available are taken with
//! the notification discipline of every queue, each answered ([`super::request::serve`]),
//! given back and counted, and the interrupt decided. Pure of the event loop: the queue's
//! thread ([`super::worker`]) and the fuzzer's model of the driver run the same pass and
//! carry out its [`Outcome`].
//!
//! Data flow: at each activation the thread builds its [`ReqQueue`] (the queue, with its
//! scratch made once: the chain's buffers and `iovec`s, a queue's size each, so a request
//! allocates nothing) and the disk's [`Limits`] as negotiated. On a kick it runs
//! [`req_pass`]: notifications off, up to [`REQ_BUDGET`] requests, each timed from the moment
//! its chain is taken to the moment it is given back (its service time, by type, into
//! [`BlkCounters`]), the epoch checked before each one; then the interrupt decision. A pass
//! that stops at its budget with chains left says `more` (the thread runs it again without
//! waiting for a kick); a malformed chain ends it with a fault (NEEDS_RESET). With a rate
//! limiter (`--disk …,rate=`) each request takes its tokens (one op, and its data buffers'
//! bytes) before it is served; one the buckets cannot pay for yet is put back and the pass
//! ends saying how long to wait (`throttled`).

use ppa_vmm_api::{BlkRequestKind, BlkStatus, HistogramJson};

use std::sync::Arc;

use super::file::Disk;
use super::merge::Batch;
use super::request::{data_of, serve, Done, Limits, Why};
use crate::accounting::histogram::{Histogram, HistogramSnapshot, DEFAULT_FRAC_BITS};
use crate::devices::rate::SharedLimiter;
use crate::devices::virtio::chain::{ChainError, Direction, Segments};
use crate::devices::virtio::counters::QueueCounters;
use crate::devices::virtio::pass::{end_pass, Irq};
use crate::devices::virtio::queue::{DeviceQueue, QueueFault};
use crate::sync::{now_ns, Counter};
use virtio_queue::DescriptorChain;
use vm_memory::GuestMemoryMmap;

/// Requests a pass answers before the thread looks at its other events.
pub const REQ_BUDGET: u64 = 256;
/// A request's bytes that are not its data: the 16-byte header and the status byte.
const REQ_OVERHEAD: u64 = 17;

const KINDS: usize = BlkRequestKind::COUNT;

/// What one queue's requests did, by type and status; single writer (the queue's thread).
#[derive(Debug)]
pub struct BlkCounters {
    requests: [Counter; KINDS],
    errors: [Counter; BlkStatus::COUNT],
    read: Counter,
    written: Counter,
    merged: Counter,
    service: [Histogram; KINDS],
}

impl Default for BlkCounters {
    fn default() -> Self {
        BlkCounters {
            requests: Default::default(),
            errors: Default::default(),
            read: Counter::default(),
            written: Counter::default(),
            merged: Counter::default(),
            service: std::array::from_fn(|_| {
                Histogram::new(DEFAULT_FRAC_BITS).expect("the default fraction bits are valid")
            }),
        }
    }
}

/// A reading of [`BlkCounters`] (summed over a device's queues by its readers).
#[derive(Debug, Clone)]
pub struct BlkCounts {
    /// Requests by [`BlkRequestKind::index`].
    pub requests: [u64; KINDS],
    /// Errors by [`BlkStatus::index`].
    pub errors: [u64; BlkStatus::COUNT],
    /// Bytes read into the guest.
    pub read: u64,
    /// Bytes written from the guest.
    pub written: u64,
    /// Reads and writes whose data went in the call of the request before them.
    pub merged: u64,
    /// Service times by [`BlkRequestKind::index`].
    pub service: Vec<HistogramSnapshot>,
}

impl BlkCounts {
    /// No request yet.
    pub fn empty() -> Self {
        BlkCounts {
            requests: [0; KINDS],
            errors: [0; BlkStatus::COUNT],
            read: 0,
            written: 0,
            merged: 0,
            service: (0..KINDS)
                .map(|_| HistogramSnapshot::empty(DEFAULT_FRAC_BITS))
                .collect(),
        }
    }

    /// Adds `o` (another queue's).
    pub fn merge(&mut self, o: &BlkCounts) {
        for (a, b) in self.requests.iter_mut().zip(o.requests) {
            *a += b;
        }
        for (a, b) in self.errors.iter_mut().zip(o.errors) {
            *a += b;
        }
        self.read += o.read;
        self.written += o.written;
        self.merged += o.merged;
        for (a, b) in self.service.iter_mut().zip(&o.service) {
            a.merge(b);
        }
    }

    /// These less `base` (a `reset`'s baseline), each counter at least 0.
    pub fn since(&self, base: &BlkCounts) -> BlkCounts {
        BlkCounts {
            requests: std::array::from_fn(|i| self.requests[i].saturating_sub(base.requests[i])),
            errors: std::array::from_fn(|i| self.errors[i].saturating_sub(base.errors[i])),
            read: self.read.saturating_sub(base.read),
            written: self.written.saturating_sub(base.written),
            merged: self.merged.saturating_sub(base.merged),
            service: self
                .service
                .iter()
                .zip(&base.service)
                .map(|(a, b)| a.since(b))
                .collect(),
        }
    }

    /// Requests of `kind`.
    pub fn requests(&self, kind: BlkRequestKind) -> u64 {
        self.requests[kind.index()]
    }

    /// The service-time histograms of the types that had a request, for the protocol.
    pub fn service_json(&self) -> std::collections::BTreeMap<BlkRequestKind, HistogramJson> {
        BlkRequestKind::ALL
            .iter()
            .zip(&self.service)
            .filter(|(_, h)| h.count() > 0)
            .map(|(k, h)| (*k, h.to_json()))
            .collect()
    }
}

impl BlkCounters {
    /// Counts request `d`, served in `ns`.
    #[inline]
    pub fn record(&self, d: &Done, ns: u64) {
        let k = d.kind.index();
        self.requests[k].add(1);
        self.service[k].record(ns);
        if let Some((s, _)) = d.error {
            self.errors[s.index()].add(1);
        }
        self.read.add(d.read);
        self.written.add(d.written);
    }

    /// The counts now.
    pub fn counts(&self) -> BlkCounts {
        BlkCounts {
            requests: std::array::from_fn(|i| self.requests[i].get()),
            errors: std::array::from_fn(|i| self.errors[i].get()),
            read: self.read.get(),
            written: self.written.get(),
            merged: self.merged.get(),
            service: self.service.iter().map(Histogram::snapshot).collect(),
        }
    }
}

/// A request queue and its scratch (made once per activation).
#[derive(Debug)]
pub struct ReqQueue {
    /// The queue.
    pub dq: DeviceQueue,
    /// What the disk offers, as negotiated.
    pub limits: Limits,
    /// The disk's rate limiter, while the thread can wait for it.
    pub rate: Option<Arc<SharedLimiter>>,
    /// The pass leaves the driver's notifications off when it empties the ring (the thread
    /// polls it next, then runs a pass without this, which turns them on).
    pub hold: bool,
    segs: Segments,
    iov: Vec<libc::iovec>,
    batch: Batch,
}

impl ReqQueue {
    /// The next chain: [`DeviceQueue::pop`] (notifications on at an emptied ring), or, while
    /// `hold`, [`DeviceQueue::try_pop`] (left off: the thread polls next).
    fn next<'m>(
        &mut self,
        mem: &'m GuestMemoryMmap,
    ) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap>>, QueueFault> {
        if self.hold {
            self.dq.try_pop(mem)
        } else {
            self.dq.pop(mem)
        }
    }

    /// `dq` with its scratch, answering under `limits`.
    pub fn new(dq: DeviceQueue, limits: Limits) -> Self {
        let n = usize::from(dq.size());
        ReqQueue {
            dq,
            limits,
            rate: None,
            hold: false,
            segs: Segments::with_capacity(n),
            iov: Vec::with_capacity(n),
            batch: Batch::default(),
        }
    }
}

/// What a pass did and what the thread must do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Requests answered.
    pub handled: u64,
    /// Chains are left that no kick will announce: run the pass again soon.
    pub more: bool,
    /// The epoch ended during the pass: the rest was left.
    pub abandoned: bool,
    /// The driver broke the queue: the device needs a reset.
    pub fault: Option<QueueFault>,
    /// The interrupt decision (`Irq::None` after a fault or an abandoned pass).
    pub irq: Irq,
    /// The reasons of the error statuses given in this pass, a bit per [`Why::index`].
    pub whys: u8,
    /// The rate limiter stopped the pass: the next request's tokens are there in this many ns
    /// (its chain was put back).
    pub throttled: Option<u64>,
}

impl Default for Outcome {
    fn default() -> Self {
        Outcome {
            handled: 0,
            more: false,
            abandoned: false,
            fault: None,
            irq: Irq::None,
            whys: 0,
            throttled: None,
        }
    }
}

impl Outcome {
    /// The reasons in `whys`.
    pub fn reasons(&self) -> impl Iterator<Item = Why> + '_ {
        Why::ALL
            .into_iter()
            .filter(|w| self.whys & (1 << w.index()) != 0)
    }
}

/// Answers what the guest made available in `rq`, up to [`REQ_BUDGET`] requests, on `disk`;
/// counts into `q` (chains, requests, bytes) and `b` (types, errors, service times). `go_on`
/// is asked before each request (false: a reset came, leave the rest). Reads or writes that
/// follow each other in the file are merged ([`super::merge`]).
pub fn req_pass<D: Disk>(
    rq: &mut ReqQueue,
    mem: &GuestMemoryMmap,
    disk: &D,
    q: &QueueCounters,
    b: &BlkCounters,
    go_on: impl Fn() -> bool,
) -> Outcome {
    let mut o = Outcome::default();
    if let Err(f) = rq.dq.quiet(mem) {
        o.fault = Some(f);
        return o;
    }
    let t = Tally { q, b };
    take(rq, mem, disk, t, &go_on, &mut o);
    if o.abandoned {
        // A reset takes the queue back: the batch's requests are left unanswered, as the
        // chains the pass did not take are (their buffers are the driver's again).
        rq.batch.clear();
        return o;
    }
    // What waits in the batch was taken before anything that ended the pass.
    if let Err(f) = run_batch(rq, mem, disk, t, &mut o) {
        o.fault.get_or_insert(f);
    }
    if o.fault.is_none() {
        o.irq = end_pass(&mut rq.dq);
    }
    o
}

/// The pass's loop: takes chains until none is left, the budget is spent, the rate limiter
/// stops it, the epoch ends or a chain is malformed (said in `o`). Reads and writes that
/// continue the batch join it; anything else runs the batch first and is then served alone.
fn take<D: Disk>(
    rq: &mut ReqQueue,
    mem: &GuestMemoryMmap,
    disk: &D,
    t: Tally<'_>,
    go_on: &impl Fn() -> bool,
    o: &mut Outcome,
) {
    loop {
        if !go_on() {
            o.abandoned = true;
            return;
        }
        if o.handled + rq.batch.len() as u64 >= REQ_BUDGET {
            // Chains may be left: if so, say so; if not, `pop` turned notifications on
            // (unless held: the thread polls next).
            match rq.next(mem) {
                Ok(Some(_)) => {
                    rq.dq.unpop(1);
                    o.more = true;
                }
                Ok(None) => {}
                Err(f) => o.fault = Some(f),
            }
            return;
        }
        let chain = match rq.next(mem) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(f) => {
                o.fault = Some(f);
                return;
            }
        };
        let t0 = now_ns();
        if let Err(e) = rq.segs.load(chain, mem, Direction::ReadThenWrite, 1) {
            t.q.chains.add(1);
            o.fault = Some(QueueFault::Chain(e));
            return;
        }
        if let Some(r) = rq.rate.as_deref().filter(|r| r.limits()) {
            if let Err(wait) = r.try_take(rq.segs.total().saturating_sub(REQ_OVERHEAD)) {
                rq.dq.unpop(1);
                o.throttled = Some(wait);
                return;
            }
        }
        t.q.chains.add(1);
        let buffers = rq.segs.list().len();
        if let Some(d) = data_of(&rq.segs, mem, &rq.limits).filter(|_| Batch::fits(buffers)) {
            if !rq.batch.is_empty() && !rq.batch.takes(&d, buffers) {
                if let Err(f) = run_batch(rq, mem, disk, t, o) {
                    o.fault = Some(f);
                    return;
                }
            }
            if rq.batch.push(&rq.segs, d, t0) {
                continue;
            }
        }
        if let Err(f) = run_batch(rq, mem, disk, t, o) {
            o.fault = Some(f);
            return;
        }
        let Ok(done) = serve(&rq.segs, mem, disk, &rq.limits, &mut rq.iov) else {
            // No writable byte: nowhere to put a status.
            o.fault = Some(QueueFault::Chain(ChainError::WrongDirection));
            return;
        };
        rq.iov.clear();
        if let Err(f) = t.answered(
            &mut rq.dq,
            o,
            rq.segs.head(),
            &done,
            now_ns().saturating_sub(t0),
        ) {
            o.fault = Some(f);
            return;
        }
    }
}

/// Moves the batch's data and answers its requests, each timed from its chain's taking.
fn run_batch<D: Disk>(
    rq: &mut ReqQueue,
    mem: &GuestMemoryMmap,
    disk: &D,
    t: Tally<'_>,
    o: &mut Outcome,
) -> Result<(), QueueFault> {
    let writeback = rq.limits.writeback;
    let dq = &mut rq.dq;
    let mut now = None;
    // SAFETY: every request in the batch was pushed in this pass from a chain loaded against
    // `mem`, which the caller holds for the whole pass.
    let merged = unsafe {
        rq.batch.run(disk, mem, writeback, |p, done| {
            let at = *now.get_or_insert_with(now_ns);
            t.answered(dq, o, p.head, done, at.saturating_sub(p.t0))
        })
    }?;
    t.b.merged.add(merged);
    Ok(())
}

/// Where a pass counts its answers.
#[derive(Clone, Copy)]
struct Tally<'a> {
    q: &'a QueueCounters,
    b: &'a BlkCounters,
}

impl Tally<'_> {
    /// Gives back the chain `head`, answered `done` in `ns`, and counts it.
    fn answered(
        self,
        dq: &mut DeviceQueue,
        o: &mut Outcome,
        head: u16,
        done: &Done,
        ns: u64,
    ) -> Result<(), QueueFault> {
        dq.add_used(head, done.used)?;
        self.q.packets.add(1);
        self.q.bytes.add(done.read + done.written);
        if let Some((_, why)) = done.error {
            o.whys |= 1 << why.index();
        }
        self.b.record(done, ns);
        o.handled += 1;
        Ok(())
    }
}

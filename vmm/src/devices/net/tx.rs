//! The transmit side of a queue pair: the guest's frames out to the tap, straight from guest
//! memory.
//!
//! Data flow: on a kick the queue pair's thread calls [`TxQueue::run`]: with the driver's
//! notifications off, it takes each available chain, checks it ([`Segments::load`]: readable
//! buffers, inside RAM, ending, at least the 12-byte header) and gathers its buffers into the
//! batch's `iovec` list (the header goes first, as the tap expects with `IFF_VNET_HDR`). A
//! batch of up to [`BATCH`] frames goes to the sink in one [`FrameSink::write_frames`] call:
//! on the tap, one `io_uring_enter` for the batch ([`super::tap::ring::TapRing`]),
//! or one `writev` a frame where the kernel gives no ring. Only then are the batch's chains
//! given back, in the order they were taken, each frame counted or its drop and reason. A
//! pass writes what it took before it returns, for whatever reason it ends.
//! When the ring is empty [`DeviceQueue::pop`] turns notifications back on and
//! looks once more, so a frame made available meanwhile is not left behind. A pass stops at
//! its budget (so receive and the other queues get their turn) and says `more` when chains
//! are left: the thread runs it again without waiting for a kick the driver will not send.
//! The epoch is checked before each chain: a reset ends the pass at once (the batch taken
//! goes out first). With a transmit
//! rate limiter (`--net …,rate=tx-…`) each frame takes its tokens before it goes; a frame the
//! buckets cannot pay for yet is put back (popped again next pass) and the pass ends saying
//! how long to wait (`throttled`), with the driver's notifications still off: the thread's
//! timer, not a kick, runs the next pass.

use std::io;
use std::ops::Range;

use ppa_vmm_api::DropReason;
use vm_memory::GuestMemoryMmap;

use super::queues::QueueCounters;
use super::tap::VNET_HDR_LEN;
use crate::devices::rate::SharedLimiter;
use crate::devices::virtio::chain::{Direction, Segment, Segments};
use crate::devices::virtio::queue::{DeviceQueue, QueueFault};

/// The largest frame a transmit chain may carry after its header: a 64 KiB TSO frame.
pub const MAX_TX_FRAME: u64 = 65_535;

/// Where transmitted frames go (the tap; a socket pair in tests).
pub trait FrameSink {
    /// Writes one frame gathered from `iov`.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for reads of its length during the call.
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize>;

    /// Writes frame `i` from `iov[spans[i]]` for each span, in order, and pushes each one's
    /// result to `out` (one result a span). By default one [`Self::write_frame`] each; the
    /// tap's worker batches them into one system call ([`crate::devices::uring`]).
    ///
    /// # Safety
    /// Every `iovec` in `iov` must describe memory valid for reads of its length during the
    /// call.
    unsafe fn write_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        for span in spans {
            // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
            out.push(unsafe { self.write_frame(&iov[span.clone()]) });
        }
    }
}

impl FrameSink for super::tap::Tap {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.writev(iov) }
    }
}

/// Why the tap refused a frame, as a drop reason.
pub fn drop_reason(e: &io::Error) -> DropReason {
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::ENOBUFS) => DropReason::TapWouldBlock,
        Some(libc::EIO) | Some(libc::EBADFD) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
            DropReason::TapDown
        }
        _ => DropReason::TapError,
    }
}

/// Frames a pass gathers before it writes them with one [`FrameSink::write_frames`] call.
pub const BATCH: usize = crate::devices::uring::DEPTH as usize;

/// A chain taken into the batch, waiting for its write.
#[derive(Debug, Clone, Copy)]
struct Staged {
    head: u16,
    frame: u64,
    /// False: too large to send, dropped as oversized.
    send: bool,
}

/// A transmit queue and its scratch (made once; nothing allocates per frame: the lists keep
/// their capacity from batch to batch).
#[derive(Debug)]
pub struct TxQueue {
    /// The queue.
    pub dq: DeviceQueue,
    segs: Segments,
    /// Every buffer of the batch's frames, in order.
    iov: Vec<libc::iovec>,
    /// Each frame's buffers in `iov`.
    spans: Vec<Range<usize>>,
    staged: Vec<Staged>,
    results: Vec<io::Result<usize>>,
}

/// How far a transmit pass may go.
#[derive(Debug, Clone, Copy)]
pub struct TxBudget<'a> {
    /// Chains it takes at most.
    pub chains: u64,
    /// The device's transmit rate limiter, asked before each frame.
    pub rate: Option<&'a SharedLimiter>,
}

impl From<u64> for TxBudget<'_> {
    fn from(chains: u64) -> Self {
        TxBudget { chains, rate: None }
    }
}

/// What a pass over the queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxPass {
    /// Chains given back.
    pub chains: u64,
    /// Frames handled (sent or dropped): the chains that carried a frame.
    pub frames: u64,
    /// The pass stopped at its budget with chains still available: it must run again
    /// without waiting for a kick (the driver does not kick for what it already made
    /// available).
    pub more: bool,
    /// The pass stopped because the device's epoch ended (a reset) or it was stopped.
    pub abandoned: bool,
    /// The tap refused a frame as gone or down (its errno): the backend failed.
    pub tap_down: Option<i32>,
    /// A fault that needs a reset, after which nothing more was taken.
    pub fault: Option<QueueFault>,
    /// The rate limiter stopped the pass: the next frame's tokens are there in this many ns
    /// (its chain was put back; notifications stay off).
    pub throttled: Option<u64>,
}

impl TxQueue {
    /// `dq` with its scratch.
    pub fn new(dq: DeviceQueue) -> Self {
        let n = usize::from(dq.size());
        let batch = n.min(BATCH);
        TxQueue {
            dq,
            segs: Segments::with_capacity(n),
            iov: Vec::with_capacity(n),
            spans: Vec::with_capacity(batch),
            staged: Vec::with_capacity(batch),
            results: Vec::with_capacity(batch),
        }
    }

    /// Sends what the driver made available, at most `budget.chains` chains and what its rate
    /// limiter allows; counts into `c`.
    /// `go_on` is asked before each chain (false: a reset came, leave the rest). Returns with
    /// notifications on and the ring empty, or with `more` set.
    pub fn run<'r>(
        &mut self,
        mem: &GuestMemoryMmap,
        sink: &impl FrameSink,
        c: &QueueCounters,
        budget: impl Into<TxBudget<'r>>,
        go_on: impl Fn() -> bool,
    ) -> TxPass {
        let budget = budget.into();
        let mut pass = TxPass::default();
        if let Err(f) = self.dq.quiet(mem) {
            pass.fault = Some(f);
            return pass;
        }
        loop {
            if !go_on() {
                // What was taken goes out and is given back (a reset drops the rings anyway;
                // this keeps every frame taken counted once).
                self.flush(sink, c, &mut pass);
                pass.abandoned = true;
                return pass;
            }
            if pass.chains + self.staged.len() as u64 >= budget.chains {
                self.flush(sink, c, &mut pass);
                if pass.fault.is_some() {
                    return pass;
                }
                // Chains may be left: if so, say so (the thread runs the pass again); if not,
                // `pop` has turned notifications on, so the driver's next frame kicks.
                match self.dq.pop(mem) {
                    Ok(Some(_)) => {
                        self.dq.unpop(1);
                        pass.more = true;
                    }
                    Ok(None) => {}
                    Err(f) => pass.fault = Some(f),
                }
                return pass;
            }
            let chain = match self.dq.pop(mem) {
                Ok(Some(chain)) => chain,
                Ok(None) => {
                    self.flush(sink, c, &mut pass);
                    return pass;
                }
                Err(f) => {
                    self.flush(sink, c, &mut pass);
                    pass.fault = Some(f);
                    return pass;
                }
            };
            if let Err(e) = self
                .segs
                .load(chain, mem, Direction::Read, VNET_HDR_LEN as u64)
            {
                self.flush(sink, c, &mut pass);
                c.chains.add(1);
                c.drop_one(DropReason::BadChain);
                pass.frames += 1;
                pass.fault = Some(QueueFault::Chain(e));
                return pass;
            }
            let frame = self.segs.total() - VNET_HDR_LEN as u64;
            if let Some(rate) = budget.rate.filter(|_| frame <= MAX_TX_FRAME) {
                if let Err(wait) = rate.try_take(frame) {
                    self.dq.unpop(1);
                    self.flush(sink, c, &mut pass);
                    pass.throttled = Some(wait);
                    return pass;
                }
            }
            c.chains.add(1);
            self.stage(frame);
            if self.staged.len() >= BATCH {
                self.flush(sink, c, &mut pass);
                if pass.fault.is_some() {
                    return pass;
                }
            }
        }
    }

    /// Takes the chain loaded last into the batch: its buffers go out at the next
    /// [`Self::flush`] (an oversized frame is only counted there).
    fn stage(&mut self, frame: u64) {
        let send = frame <= MAX_TX_FRAME;
        if send {
            let from = self.iov.len();
            self.iov.extend(self.segs.list().iter().map(Segment::iovec));
            self.spans.push(from..self.iov.len());
        }
        self.staged.push(Staged {
            head: self.segs.head(),
            frame,
            send,
        });
    }

    /// Writes the batch to `sink` (one call for all its frames), then counts each frame or
    /// its drop and gives its chain back, in the order they were taken.
    fn flush(&mut self, sink: &impl FrameSink, c: &QueueCounters, pass: &mut TxPass) {
        if self.staged.is_empty() {
            return;
        }
        self.results.clear();
        // SAFETY: each iovec points into a guest memory region, checked when its chain was
        // loaded this pass; guest memory stays mapped for the VM's life (the caller's `mem`,
        // borrowed for the whole pass, is that memory), and no chain of the batch is given
        // back to the guest before this call returns.
        unsafe { sink.write_frames(&self.iov, &self.spans, &mut self.results) };
        let mut results = self.results.drain(..);
        let mut given = 0;
        for s in &self.staged {
            if !s.send {
                c.drop_one(DropReason::OversizedFrame);
            } else {
                match results.next() {
                    Some(Ok(_)) => {
                        c.packets.add(1);
                        c.bytes.add(s.frame);
                    }
                    Some(Err(e)) => {
                        let reason = drop_reason(&e);
                        if reason == DropReason::TapDown {
                            pass.tap_down = e.raw_os_error();
                        }
                        c.drop_one(reason);
                    }
                    None => c.drop_one(DropReason::TapError),
                }
            }
            pass.frames += 1;
            if let Err(f) = self.dq.add_used(s.head, 0) {
                pass.fault = Some(f);
                break;
            }
            given += 1;
        }
        drop(results);
        pass.chains += given;
        self.staged.clear();
        self.spans.clear();
        self.iov.clear();
    }
}

#[cfg(test)]
mod tests;

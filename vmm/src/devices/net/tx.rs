//! The transmit side of a queue pair: the guest's frames out to the tap, straight from guest
//! memory.
//!
//! Data flow: on a kick the queue pair's thread calls [`TxQueue::run`]: with the driver's
//! notifications off, it takes each available chain, checks it ([`Segments::load`]: readable
//! buffers, inside RAM, ending, at least the 12-byte header), gathers its buffers into an
//! `iovec` list and writes it to the tap with one `writev` (the header goes first, as the tap
//! expects with `IFF_VNET_HDR`), gives the chain back, and counts the frame or the drop and
//! its reason. When the ring is empty [`DeviceQueue::pop`] turns notifications back on and
//! looks once more, so a frame made available meanwhile is not left behind. A pass stops at
//! its budget (so receive and the other queues get their turn) and says `more` when chains
//! are left: the thread runs it again without waiting for a kick the driver will not send.
//! The epoch is checked before each chain: a reset ends the pass at once. With a transmit
//! rate limiter (`--net …,rate=tx-…`) each frame takes its tokens before it goes; a frame the
//! buckets cannot pay for yet is put back (popped again next pass) and the pass ends saying
//! how long to wait (`throttled`), with the driver's notifications still off: the thread's
//! timer, not a kick, runs the next pass.

use std::io;

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

/// A transmit queue and its scratch (made once; nothing allocates per frame).
#[derive(Debug)]
pub struct TxQueue {
    /// The queue.
    pub dq: DeviceQueue,
    segs: Segments,
    iov: Vec<libc::iovec>,
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
        TxQueue {
            dq,
            segs: Segments::with_capacity(n),
            iov: Vec::with_capacity(n),
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
                pass.abandoned = true;
                return pass;
            }
            if pass.chains >= budget.chains {
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
                Ok(None) => return pass,
                Err(f) => {
                    pass.fault = Some(f);
                    return pass;
                }
            };
            if let Err(e) = self
                .segs
                .load(chain, mem, Direction::Read, VNET_HDR_LEN as u64)
            {
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
                    pass.throttled = Some(wait);
                    return pass;
                }
            }
            c.chains.add(1);
            if let Err(e) = self.send(sink, c) {
                if drop_reason(&e) == DropReason::TapDown {
                    pass.tap_down = e.raw_os_error();
                }
            }
            pass.frames += 1;
            if let Err(f) = self.dq.add_used(self.segs.head(), 0) {
                pass.fault = Some(f);
                return pass;
            }
            pass.chains += 1;
        }
    }

    /// Writes the chain loaded last to `sink`; counts the frame or its drop. The tap's error,
    /// when it refused the frame.
    fn send(&mut self, sink: &impl FrameSink, c: &QueueCounters) -> io::Result<()> {
        let frame = self.segs.total() - VNET_HDR_LEN as u64;
        if frame > MAX_TX_FRAME {
            c.drop_one(DropReason::OversizedFrame);
            return Ok(());
        }
        self.iov.clear();
        self.iov.extend(self.segs.list().iter().map(Segment::iovec));
        // SAFETY: each iovec points into a guest memory region, checked when the chain was
        // loaded this pass; guest memory stays mapped for the VM's life (the caller's `mem`,
        // borrowed for the whole pass, is that memory).
        let r = unsafe { sink.write_frame(&self.iov) };
        self.iov.clear();
        match r {
            Ok(_) => {
                c.packets.add(1);
                c.bytes.add(frame);
                Ok(())
            }
            Err(e) => {
                c.drop_one(drop_reason(&e));
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;

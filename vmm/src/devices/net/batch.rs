//! The queues one queue-pair thread serves and the passes it runs over them: receive from the
//! tap into the guest, transmit the guest's frames, answer the control queue. Pure of the
//! event loop: a pass takes its frame source or sink and a `go_on` check, and returns an
//! [`Outcome`] that says what the thread must do next (re-run itself, stop reading the tap,
//! raise the interrupt, apply a pair count, stop the device). The queue pair's thread
//! ([`super::worker`]) and the fuzzer's model of Linux's driver (`crate::fuzzing`) run the
//! same passes, so the model checks the code that runs.
//!
//! Data flow: at each activation [`build`] makes the thread's queues from the transport's
//! registers, with the features the driver negotiated (EVENT_IDX for every queue, the control
//! queue where [`super::layout`] puts it). Each pass is bounded (a budget of frames or
//! requests), checks `go_on` (the epoch) before each frame or chain and abandons the rest when
//! a reset came, and ends with [`end_pass`]: the interrupt decision for the used entries it
//! added (`crate::devices::virtio::pass`, shared with every device). Each returns the frames it handled (delivered, sent or dropped), which the
//! per-frame CPU figures count.

use std::io;
use std::sync::Arc;

use ppa_vmm_api::DropReason;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_GUEST_UFO,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use vm_memory::GuestMemoryMmap;

use super::ctrl::CtrlQueue;
use super::layout::{self, Negotiated, Served};
use super::queues::QueueCounters;
use super::rx::{FrameSource, RxParams, RxQueue, Step};
use super::tap::VNET_HDR_LEN;
use super::tx::{FrameSink, TxBudget, TxQueue};
use crate::devices::rate::SharedLimiter;
use crate::devices::virtio::pass::device_queue;
pub use crate::devices::virtio::pass::{end_pass, Irq};
use crate::devices::virtio::queue::QueueFault;
use crate::devices::virtio::status::Violation;
use crate::devices::virtio::VirtioShared;

/// Frames a readable tap gives per pass before the loop looks at its other events.
pub const RX_BUDGET: usize = 256;
/// Chains a transmit pass takes before it lets the other queues have their turn.
pub const TX_BUDGET: u64 = 256;
/// Requests a control pass answers at most.
pub const CTRL_BUDGET: u64 = 64;

/// The queues one thread serves in an epoch.
#[derive(Debug, Default)]
pub struct Queues {
    /// Which indices they are.
    pub served: Served,
    /// The receive queue.
    pub rx: Option<RxQueue>,
    /// The transmit queue.
    pub tx: Option<TxQueue>,
    /// The control queue (pair 0).
    pub ctrl: Option<CtrlQueue>,
}

/// What the driver negotiated of the layout.
pub fn negotiated(virtio: &VirtioShared) -> Negotiated {
    Negotiated {
        ctrl: virtio.has_feature(VIRTIO_NET_F_CTRL_VQ),
        mq: virtio.has_feature(VIRTIO_NET_F_MQ),
    }
}

/// The queues thread `pair` of a device of `max_pairs` pairs and `mtu` serves now, built
/// from the transport's registers and the negotiated features (an error: the driver set a
/// queue up wrongly, NEEDS_RESET).
pub fn build(
    virtio: &VirtioShared,
    pair: usize,
    max_pairs: u16,
    mtu: u16,
    mem: &Arc<GuestMemoryMmap>,
) -> Result<Queues, Violation> {
    let n = negotiated(virtio);
    let served = layout::served_by(pair, max_pairs, n);
    let has = |bit: u32| virtio.has_feature(bit);
    let params = RxParams {
        mergeable: has(VIRTIO_NET_F_MRG_RXBUF),
        gso: has(VIRTIO_NET_F_GUEST_TSO4)
            || has(VIRTIO_NET_F_GUEST_TSO6)
            || has(VIRTIO_NET_F_GUEST_UFO),
        mtu,
    };
    Ok(Queues {
        served,
        rx: device_queue(virtio, served.rx, mem)?.map(|q| RxQueue::new(q, params)),
        tx: device_queue(virtio, served.tx, mem)?.map(TxQueue::new),
        ctrl: device_queue(virtio, served.ctrl, mem)?.map(|q| CtrlQueue::new(q, max_pairs, n.mq)),
    })
}

/// What a pass did and what the thread must do next.
#[derive(Debug)]
pub struct Outcome {
    /// Frames handled (delivered or sent, and dropped).
    pub handled: u64,
    /// Work is left that no kick will announce: run the pass again soon.
    pub more: bool,
    /// (Receive) The guest has no room: stop reading the tap until its rx kick.
    pub blocked: bool,
    /// The epoch ended during the pass: the rest was left.
    pub abandoned: bool,
    /// The driver broke the queue: the device needs a reset.
    pub fault: Option<QueueFault>,
    /// The tap failed (receive: a read error; transmit: a frame refused as gone or down).
    pub tap_error: Option<io::Error>,
    /// (Receive) At least one frame came through the tap.
    pub tap_ok: bool,
    /// (Control) The pair count the driver asked for.
    pub pairs: Option<u16>,
    /// The rate limiter stopped the pass: its next frame's tokens are there in this many ns.
    /// The thread stops serving the queue (receive: stops reading the tap) until then.
    pub throttled: Option<u64>,
    /// The interrupt decision (`Irq::None` after a fault or an abandoned pass).
    pub irq: Irq,
}

impl Default for Outcome {
    fn default() -> Self {
        Outcome {
            handled: 0,
            more: false,
            blocked: false,
            abandoned: false,
            fault: None,
            tap_error: None,
            tap_ok: false,
            pairs: None,
            throttled: None,
            irq: Irq::None,
        }
    }
}

/// Delivers what `src` holds into `rxq`, up to [`RX_BUDGET`] frames and what `rate` allows
/// (a frame goes while its buckets hold a token and is charged its length once read: see
/// [`crate::devices::rate`]); counts into `c`.
pub fn rx_pass(
    rxq: &mut RxQueue,
    mem: &GuestMemoryMmap,
    src: &impl FrameSource,
    c: &QueueCounters,
    rate: Option<&SharedLimiter>,
    go_on: impl Fn() -> bool,
) -> Outcome {
    let mut o = Outcome::default();
    // No kicks wanted while the device has buffers (without EVENT_IDX the driver reads
    // NO_NOTIFY; with it nothing is written): running dry turns them back on.
    if let Err(f) = rxq.dq.quiet(mem) {
        o.fault = Some(f);
        return o;
    }
    let mut left = RX_BUDGET;
    while left > 0 {
        if !go_on() {
            o.abandoned = true;
            return o;
        }
        if let Some(Err(wait)) = rate.map(SharedLimiter::admit) {
            o.throttled = Some(wait);
            break;
        }
        // Without a rate limiter (which admits frame by frame) frames come in batches, one
        // system call each on the tap; otherwise, or where a batch does not apply, one by one.
        let batch = match rate {
            None => {
                let o = &mut o;
                rxq.receive_batch(mem, src, left, |s| {
                    tally(s, c, o, None, false);
                })
            }
            Some(_) => None,
        };
        let step = match batch {
            Some((frames, end)) => {
                left = left.saturating_sub(frames.max(1));
                end
            }
            None => {
                left -= 1;
                Some(rxq.receive(mem, src))
            }
        };
        let Some(step) = step else {
            continue;
        };
        let pending = rxq.has_pending();
        match tally(step, c, &mut o, rate, pending) {
            Flow::Go => {}
            Flow::Stop => break,
            Flow::Fault => return o,
        }
    }
    o.irq = end_pass(&mut rxq.dq);
    o
}

/// What a receive pass does after a step.
enum Flow {
    /// Takes the next frame.
    Go,
    /// Ends, with the interrupt decision.
    Stop,
    /// Ends at once: the queue is broken.
    Fault,
}

/// Counts one receive step into `c` and `o` (charging `rate` a delivered frame's bytes);
/// `pending`: a frame waited in the host buffer when the step was taken.
fn tally(
    step: Step,
    c: &QueueCounters,
    o: &mut Outcome,
    rate: Option<&SharedLimiter>,
    pending: bool,
) -> Flow {
    match step {
        Step::Delivered {
            chains,
            bytes,
            copied,
        } => {
            if let Some(r) = rate {
                r.charge(bytes.saturating_sub(VNET_HDR_LEN) as u64);
            }
            c.chains.add(u64::from(chains));
            c.packets.add(1);
            c.bytes.add(bytes.saturating_sub(VNET_HDR_LEN) as u64);
            if copied {
                c.copied.add(1);
            }
            o.handled += 1;
            o.tap_ok = true;
            Flow::Go
        }
        Step::Dropped(why) => {
            c.drop_one(why);
            o.handled += 1;
            Flow::Go
        }
        Step::Idle => Flow::Stop,
        Step::NoRoom => {
            o.blocked = true;
            Flow::Stop
        }
        Step::TapFailed(e) => {
            o.tap_error = Some(e);
            Flow::Stop
        }
        Step::Fault(f) => {
            if pending {
                c.drop_one(DropReason::BadChain);
            }
            o.fault = Some(f);
            Flow::Fault
        }
    }
}

/// Sends what the guest made available in `txq`, up to [`TX_BUDGET`] chains and what `rate`
/// allows; `more` when chains are left, `throttled` when the rate stopped it.
pub fn tx_pass(
    txq: &mut TxQueue,
    mem: &GuestMemoryMmap,
    sink: &impl FrameSink,
    c: &QueueCounters,
    rate: Option<&SharedLimiter>,
    go_on: impl Fn() -> bool,
) -> Outcome {
    let budget = TxBudget {
        chains: TX_BUDGET,
        rate,
    };
    let pass = txq.run(mem, sink, c, budget, go_on);
    let mut o = Outcome {
        handled: pass.frames,
        more: pass.more,
        throttled: pass.throttled,
        abandoned: pass.abandoned,
        fault: pass.fault,
        tap_error: pass.tap_down.map(io::Error::from_raw_os_error),
        tap_ok: pass.frames > 0 && pass.tap_down.is_none(),
        ..Outcome::default()
    };
    if o.fault.is_none() && !o.abandoned {
        o.irq = end_pass(&mut txq.dq);
    }
    o
}

/// Answers the control queue's requests, up to [`CTRL_BUDGET`].
pub fn ctrl_pass(
    q: &mut CtrlQueue,
    mem: &GuestMemoryMmap,
    c: &QueueCounters,
    go_on: impl Fn() -> bool,
) -> Outcome {
    let pass = q.run(mem, c, CTRL_BUDGET, go_on);
    let mut o = Outcome {
        more: pass.more,
        abandoned: pass.abandoned,
        fault: pass.fault,
        pairs: pass.pairs,
        ..Outcome::default()
    };
    if o.fault.is_none() && !o.abandoned {
        o.irq = end_pass(&mut q.dq);
    }
    o
}

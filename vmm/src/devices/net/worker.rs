//! One queue pair's thread (`net0-qp0`, …): an event loop on event-manager that serves the
//! pair's receive and transmit queues (and, on pair 0, the control queue) against its tap
//! queue, and accounts its own time ([`crate::accounting::worker`]).
//!
//! Data flow: the loop waits on its wake eventfd (the transport's activation or reset, a
//! change of the pairs in use, the VMM's stop, and work a budgeted pass left), the kick
//! eventfds of the queues it serves in the current epoch (ioeventfds the guest's QueueNotify
//! writes signal; which queues, [`super::layout::served_by`] says from the negotiated
//! features) and, while it has somewhere to put frames, its tap. On a new epoch it drops its
//! queues (a batch in progress ends at its next chain: every pass checks the epoch), stops
//! watching their kicks, and builds them again from the transport's registers (or not, after
//! a reset), then says which epoch it serves ([`VirtioShared::thread_serves`], which completes
//! an activation that waited for it). It attaches or detaches its own tap queue as the pairs
//! in use change, after it stops reading it, so no thread reads a queue another detached.
//! The queues and the passes over them are in [`super::batch`], shared with the fuzzer's
//! model of the driver; this loop carries out what each pass's outcome says. A malformed chain stops the device until
//! the driver resets it (NEEDS_RESET, for the epoch the thread serves only). With a rate
//! limiter a pass it stopped leaves its way (receive or transmit) waiting on the thread's
//! timer ([`crate::devices::rate::wait`]): the way is not served (receive stops reading the
//! tap; kicks are counted) until the timer says its tokens are there.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use ppa_vmm_api::DropReason;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
};
use vm_memory::GuestMemoryMmap;

use super::batch::{self, Outcome, Queues};
use super::layout;
use super::rx::RxQueue;
use super::tap::ring::TapRing;
use super::NetShared;
use crate::accounting::{AccountingControl, Level};
use crate::devices::rate::wait::Waits;
use crate::devices::uring::Ring;
use crate::devices::virtio::pass::signal;
use crate::devices::virtio::queue::QueueFault;
use crate::devices::virtio::{kicks, VirtioShared};

/// CPU parts of a queue pair's thread ([`crate::accounting::worker::PARTS`] indexes).
pub const PART_RX: usize = 0;
/// Transmit work.
pub const PART_TX: usize = 1;
/// Control-queue work.
pub const PART_CTRL: usize = 2;
/// The loop itself.
pub const PART_OTHER: usize = 3;

/// Work a budgeted pass left, run again from the wake eventfd.
const AGAIN_TX: u8 = 1;
/// The control queue's.
const AGAIN_CTRL: u8 = 2;

/// Receive, as the rate limiter's waits index the ways.
const WAY_RX: usize = 0;
/// Transmit.
const WAY_TX: usize = 1;

/// One queue pair's state, owned by its thread.
pub struct Worker {
    pair: usize,
    net: Arc<NetShared>,
    virtio: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    control: Arc<AccountingControl>,
    /// The queues served in this epoch (their kick eventfds are watched).
    q: Queues,
    /// The epoch served.
    epoch: u32,
    listening: bool,
    /// The receive queue has no room: the tap is left unread until the guest's rx kick.
    rx_blocked: bool,
    tap_attached: bool,
    tap_down_logged: bool,
    /// Work a budgeted pass left ([`AGAIN_TX`], [`AGAIN_CTRL`]).
    again: u8,
    /// The device's `rate_changes` this thread has followed.
    rate_seen: u32,
    /// The ways waiting for their rate limiter (None only when its timer could not be made).
    waits: Option<Waits>,
    /// The tap queue's io_uring, which sends a pass's frames in batches (None where the
    /// kernel gives none: one `writev` a frame).
    ring: Option<Ring>,
    /// The thread's name (`net0-qp1`), for the log.
    name: String,
}

impl Worker {
    /// The worker of queue pair `pair`.
    pub fn new(
        pair: usize,
        net: Arc<NetShared>,
        virtio: Arc<VirtioShared>,
        mem: Arc<GuestMemoryMmap>,
        control: Arc<AccountingControl>,
    ) -> Self {
        // Every thread has its timer, so that `set-rate` can limit a device started without.
        let waits = Waits::new()
            .map_err(|e| {
                log::error!(
                    "{}: cannot make the rate limiter's timer ({e}); queue pair {pair} runs unlimited",
                    net.id
                )
            })
            .ok();
        let name = net.thread_name(pair);
        // Made here, before the thread's seccomp filter, which allows only io_uring_enter.
        let ring = Ring::new(net.taps[pair].as_raw_fd())
            .map_err(|e| {
                log::info!("{name}: no io_uring for the tap ({e}); one writev a frame");
            })
            .ok();
        Worker {
            pair,
            net,
            virtio,
            mem,
            control,
            q: Queues::default(),
            epoch: 0,
            listening: false,
            rx_blocked: false,
            // The device attaches only the first tap queue until a driver asks for more.
            tap_attached: pair == 0,
            tap_down_logged: false,
            again: 0,
            rate_seen: 0,
            waits,
            ring,
            name,
        }
    }

    /// Whether `way` waits for its rate limiter's tokens.
    fn throttled(&self, way: usize) -> bool {
        self.waits.as_ref().is_some_and(|w| w.waiting(way))
    }

    /// The counters of `way`'s queue.
    fn way_queue(&self, way: usize) -> usize {
        if way == WAY_RX {
            layout::rx(self.pair)
        } else {
            layout::tx(self.pair)
        }
    }

    /// The rate limiter stopped `way`'s pass: it waits `wait_ns`.
    fn throttle(&mut self, way: usize, wait_ns: u64) {
        let q = self.way_queue(way);
        if let Some(w) = self.waits.as_mut() {
            w.throttle(way, wait_ns, &self.net.queues[q], crate::sync::now_ns());
        }
    }

    /// The rate timer fired: the ways whose tokens are there run again.
    fn on_rate_timer(&mut self, ops: &mut EventOps) {
        let (rx, tx) = (layout::rx(self.pair), layout::tx(self.pair));
        let net = Arc::clone(&self.net);
        let Some(w) = self.waits.as_mut() else {
            return;
        };
        let due = w.due(crate::sync::now_ns(), |way| {
            &net.queues[if way == WAY_RX { rx } else { tx }]
        });
        if due[WAY_RX] {
            self.refresh_tap(ops);
            if self.listening {
                self.batch(ops, PART_RX);
            }
        }
        if due[WAY_TX] {
            self.batch(ops, PART_TX);
        }
    }

    /// Every rate wait ends (a new epoch).
    fn end_waits(&mut self) {
        let (rx, tx) = (layout::rx(self.pair), layout::tx(self.pair));
        let net = Arc::clone(&self.net);
        if let Some(w) = self.waits.as_mut() {
            w.clear(crate::sync::now_ns(), |way| {
                &net.queues[if way == WAY_RX { rx } else { tx }]
            });
        }
    }

    fn tap(&self) -> &super::tap::Tap {
        &self.net.taps[self.pair]
    }

    /// Whether the CPU marks are taken (not at level off).
    fn marking(&self) -> bool {
        self.control.level() != Level::Off
    }

    fn set_listening(&mut self, ops: &mut EventOps, on: bool) {
        if on == self.listening {
            return;
        }
        let r = if on {
            ops.add(Events::new(self.tap(), EventSet::IN))
        } else {
            ops.remove(Events::empty(self.tap()))
        };
        match r {
            Ok(()) => self.listening = on,
            Err(e) => log::warn!("{}: cannot watch its tap: {e:?}", self.net.id),
        }
    }

    /// Watches the kicks of the queues in `q` instead of those served so far, and serves `q`.
    fn serve(&mut self, ops: &mut EventOps, q: Queues) {
        for i in self.q.served.indices() {
            let _ = ops.remove(Events::empty(&self.net.kicks[i]));
        }
        for i in q.served.indices() {
            if let Err(e) = ops.add(Events::new(&self.net.kicks[i], EventSet::IN)) {
                log::error!(
                    "{}: cannot watch the kicks of queue {i}: {e:?}",
                    self.net.id
                );
            }
        }
        self.q = q;
    }

    /// Follows the transport's epoch: drops the queues, and builds them again when active.
    fn follow_epoch(&mut self, ops: &mut EventOps) {
        let w = self.virtio.word();
        if w.epoch() == self.epoch {
            return;
        }
        if self.q.rx.as_ref().is_some_and(RxQueue::has_pending) {
            self.net.queues[layout::rx(self.pair)].drop_one(DropReason::DeviceReset);
        }
        self.again = 0;
        self.rx_blocked = false;
        self.end_waits();
        self.set_listening(ops, false);
        self.serve(ops, Queues::default());
        self.epoch = w.epoch();
        if w.active() && !self.virtio.stopped() {
            match batch::build(
                &self.virtio,
                self.pair,
                self.net.pairs,
                self.net.mtu,
                &self.mem,
            ) {
                Ok(q) => {
                    self.serve(ops, q);
                    if self.pair == 0 {
                        self.set_offloads();
                    }
                    // A kick that came while this thread still held the old queues went to
                    // those (a stale pass reads the eventfd and abandons): the new epoch
                    // starts with a pass over what the driver already made available.
                    self.requeue(AGAIN_TX | AGAIN_CTRL);
                }
                Err(v) => self.virtio.needs_reset_in(self.epoch, v),
            }
        } else if self.pair == 0 {
            // Reset: the tap takes no offloads until a driver says it can.
            if let Err(e) = self.tap().set_offload(0) {
                log::warn!("{}: {e}", self.net.id);
            }
        }
        self.virtio.thread_serves(self.pair, self.epoch);
    }

    /// Pair 0 tells the tap which offloads the guest takes on what it receives.
    fn set_offloads(&self) {
        let has = |bit: u32| self.virtio.has_feature(bit);
        let mut offload = 0;
        if has(VIRTIO_NET_F_GUEST_CSUM) {
            offload |= libc::TUN_F_CSUM;
            if has(VIRTIO_NET_F_GUEST_TSO4) {
                offload |= libc::TUN_F_TSO4;
            }
            if has(VIRTIO_NET_F_GUEST_TSO6) {
                offload |= libc::TUN_F_TSO6;
            }
        }
        if let Err(e) = self.tap().set_offload(offload) {
            log::warn!("{}: {e}", self.net.id);
        }
    }

    /// Whether this pair carries frames now: the device runs, the driver uses this pair.
    fn enabled(&self) -> bool {
        self.q.served.rx.is_some()
            && self.virtio.serves(self.epoch)
            && self.pair < usize::from(self.net.active_pairs.load(Ordering::Acquire))
    }

    /// Attaches or detaches this pair's own tap queue as the pairs in use say (pair 0 stays
    /// attached), and reads the tap while the pair is enabled and the guest has room.
    fn refresh_tap(&mut self, ops: &mut EventOps) {
        let enabled = self.enabled();
        if self.net.pairs > 1 {
            let attach = self.pair == 0 || enabled;
            if attach != self.tap_attached {
                if !attach {
                    self.set_listening(ops, false);
                }
                match self.tap().enable(attach) {
                    Ok(()) => self.tap_attached = attach,
                    Err(e) => log::warn!("{}: {e}", self.net.id),
                }
            }
        }
        let want = enabled && self.q.rx.is_some() && !self.rx_blocked && !self.throttled(WAY_RX);
        self.set_listening(ops, want);
    }

    /// The driver now uses `n` pairs (pair 0, from the control queue): every thread follows.
    fn set_pairs(&self, n: u16) {
        self.net.active_pairs.store(n, Ordering::Release);
        self.virtio.wake_all();
    }

    fn fault(&mut self, f: QueueFault, ops: &mut EventOps) {
        if let QueueFault::Chain(e) = f {
            log::warn!("{}: {}", self.net.id, e.describe());
        }
        self.virtio.needs_reset_in(self.epoch, f.violation());
        self.set_listening(ops, false);
    }

    /// The tap failed: said once in the log and in the device's figures (`backend_error`);
    /// receive stops reading it until the guest adds buffers (a tap that came back is read
    /// again then).
    fn tap_failed(&mut self, e: &io::Error, ops: &mut EventOps) {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        self.net.tap_errors[self.pair].store(errno, Ordering::Relaxed);
        if !self.tap_down_logged {
            self.tap_down_logged = true;
            log::warn!(
                "{}: its tap {} failed ({e}){}; frames to and from the host stop until it works again",
                self.net.id,
                self.tap().name(),
                if matches!(errno, libc::EBADFD | libc::ENODEV | libc::ENXIO | libc::EIO) {
                    ": the tap is gone or down"
                } else {
                    ""
                }
            );
        }
        self.set_listening(ops, false);
    }

    /// Frames went through the tap: a failure is over (and is logged again if it comes back).
    fn tap_ok(&mut self) {
        if self.tap_down_logged {
            self.tap_down_logged = false;
            self.net.tap_errors[self.pair].store(0, Ordering::Relaxed);
        }
    }

    fn on_wake(&mut self, ops: &mut EventOps) {
        if let Some(w) = self.virtio.wake_fd(self.pair) {
            let _ = w.read();
        }
        let changes = self.net.rate_changes.load(Ordering::Acquire);
        if changes != self.rate_seen {
            // `set-rate`: a way waiting for the old buckets asks the new ones (the tap is
            // read again below; transmit runs its pass).
            self.rate_seen = changes;
            self.end_waits();
            self.again |= AGAIN_TX;
        }
        self.follow_epoch(ops);
        self.refresh_tap(ops);
        let again = std::mem::take(&mut self.again);
        // A transmit queue waiting for its tokens runs when its timer says so.
        if again & AGAIN_TX != 0 && !self.throttled(WAY_TX) {
            self.batch(ops, PART_TX);
        }
        if again & AGAIN_CTRL != 0 {
            self.batch(ops, PART_CTRL);
        }
    }

    /// Runs one pass of `part`'s work and, while marks are taken, charges its CPU to the
    /// part and, with the frames it handled, to the part's per-frame figures.
    fn batch(&mut self, ops: &mut EventOps, part: usize) {
        let marking = self.marking();
        if marking {
            self.net.meters[self.pair].cpu_mark(PART_OTHER);
        }
        let frames = match part {
            PART_RX => self.rx(ops),
            PART_TX => self.tx(ops),
            _ => self.ctrl(ops),
        };
        if marking {
            let cpu = self.net.meters[self.pair].cpu_mark(part);
            self.net.frame_cpu[self.pair].record(part, cpu, frames);
        }
        // The first pass of each kind after a limit's hold: the frames that waited for it.
        self.net.meters[self.pair]
            .hold
            .after_pass(1 << part, frames);
    }

    /// Carries out what a pass on queue `index` says (`again`: its bit to re-run it).
    fn after(&mut self, ops: &mut EventOps, index: usize, o: &Outcome, again: u8) -> u64 {
        if let Some(f) = o.fault {
            self.fault(f, ops);
            return o.handled;
        }
        signal(&self.virtio, o.irq, &self.net.queues[index]);
        if o.more && !o.abandoned {
            self.requeue(again);
        }
        o.handled
    }

    fn rx(&mut self, ops: &mut EventOps) -> u64 {
        let (Some(index), Some(mut rxq)) = (self.q.served.rx, self.q.rx.take()) else {
            return 0;
        };
        let (virtio, epoch, net) = (Arc::clone(&self.virtio), self.epoch, Arc::clone(&self.net));
        let rate = Some(&net.rx_rate).filter(|r| r.limits() && self.waits.is_some());
        let src = TapRing {
            tap: &net.taps[self.pair],
            ring: self.ring.as_ref(),
            name: &self.name,
        };
        let o = batch::rx_pass(&mut rxq, &self.mem, &src, &net.queues[index], rate, || {
            virtio.serves(epoch)
        });
        self.q.rx = Some(rxq);
        if let Some(wait) = o.throttled {
            self.throttle(WAY_RX, wait);
            self.set_listening(ops, false);
        }
        if o.tap_ok {
            self.tap_ok();
        }
        if let Some(e) = &o.tap_error {
            self.tap_failed(e, ops);
        }
        if o.blocked {
            self.rx_blocked = true;
            self.set_listening(ops, false);
        }
        if o.abandoned {
            self.set_listening(ops, false);
        }
        self.after(ops, index, &o, 0)
    }

    fn tx(&mut self, ops: &mut EventOps) -> u64 {
        let (Some(index), Some(mut txq)) = (self.q.served.tx, self.q.tx.take()) else {
            return 0;
        };
        let (virtio, epoch, net) = (Arc::clone(&self.virtio), self.epoch, Arc::clone(&self.net));
        let rate = Some(&net.tx_rate).filter(|r| r.limits() && self.waits.is_some());
        let sink = TapRing {
            tap: &net.taps[self.pair],
            ring: self.ring.as_ref(),
            name: &self.name,
        };
        let o = batch::tx_pass(&mut txq, &self.mem, &sink, &net.queues[index], rate, || {
            virtio.serves(epoch)
        });
        self.q.tx = Some(txq);
        if let Some(wait) = o.throttled {
            self.throttle(WAY_TX, wait);
        }
        if o.tap_ok {
            self.tap_ok();
        }
        if let Some(e) = &o.tap_error {
            self.tap_failed(e, ops);
        }
        self.after(ops, index, &o, AGAIN_TX)
    }

    fn ctrl(&mut self, ops: &mut EventOps) -> u64 {
        let (Some(index), Some(mut q)) = (self.q.served.ctrl, self.q.ctrl.take()) else {
            return 0;
        };
        let (virtio, epoch, net) = (Arc::clone(&self.virtio), self.epoch, Arc::clone(&self.net));
        let o = batch::ctrl_pass(&mut q, &self.mem, &net.queues[index], || {
            virtio.serves(epoch)
        });
        self.q.ctrl = Some(q);
        if let Some(n) = o.pairs {
            self.set_pairs(n);
        }
        self.after(ops, index, &o, AGAIN_CTRL);
        // Control requests are not frames.
        0
    }

    /// Asks the thread to run the passes in `again` soon (its own wake eventfd), after the
    /// other events now waiting.
    fn requeue(&mut self, again: u8) {
        self.again |= again;
        if let Some(w) = self.virtio.wake_fd(self.pair) {
            let _ = w.write(1);
        }
    }
}

impl MutEventSubscriber for Worker {
    fn init(&mut self, ops: &mut EventOps) {
        if let Some(w) = self.virtio.wake_fd(self.pair) {
            if let Err(e) = ops.add(Events::new(w, EventSet::IN)) {
                log::error!("{}: cannot watch its wake eventfd: {e:?}", self.net.id);
            }
            // The first pass follows whatever epoch the device is in already.
            let _ = w.write(1);
        }
        if let Some(t) = &self.waits {
            if let Err(e) = ops.add(Events::new(t, EventSet::IN)) {
                log::error!("{}: cannot watch its rate timer: {e:?}", self.net.id);
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.net.meters[self.pair].wait_end();
        let fd = events.fd();
        let net = Arc::clone(&self.net);
        if self
            .virtio
            .wake_fd(self.pair)
            .is_some_and(|w| w.as_raw_fd() == fd)
        {
            self.on_wake(ops);
            return;
        }
        if self.waits.as_ref().is_some_and(|w| w.as_raw_fd() == fd) {
            self.on_rate_timer(ops);
            return;
        }
        if fd == self.tap().as_raw_fd() {
            if events
                .event_set()
                .intersects(EventSet::ERROR | EventSet::HANG_UP)
            {
                let e = io::Error::from_raw_os_error(libc::EIO);
                self.tap_failed(&e, ops);
            } else if !self.throttled(WAY_RX) {
                self.batch(ops, PART_RX);
            }
            return;
        }
        let served = self.q.served;
        if let Some(i) = served.rx.filter(|&i| net.kicks[i].as_raw_fd() == fd) {
            net.queues[i].notifications.add(kicks(&net.kicks[i]));
            self.rx_blocked = false;
            self.refresh_tap(ops);
            if !self.throttled(WAY_RX) {
                self.batch(ops, PART_RX);
            }
        } else if let Some(i) = served.tx.filter(|&i| net.kicks[i].as_raw_fd() == fd) {
            net.queues[i].notifications.add(kicks(&net.kicks[i]));
            if !self.throttled(WAY_TX) {
                self.batch(ops, PART_TX);
            }
        } else if let Some(i) = served.ctrl.filter(|&i| net.kicks[i].as_raw_fd() == fd) {
            net.queues[i].notifications.add(kicks(&net.kicks[i]));
            self.batch(ops, PART_CTRL);
        }
    }
}

/// The body of queue pair `pair`'s thread: runs the loop until the device stops.
pub fn run(worker: Worker) {
    let net = Arc::clone(&worker.net);
    let pair = worker.pair;
    let name = worker.name.clone();
    crate::devices::virtio::thread::run(
        crate::devices::virtio::thread::ThreadParams {
            name: &name,
            meter: &net.meters[pair],
            stop: &net.stop,
            seccomp: crate::seccomp::Kind::Device,
            held_kinds: 1 << PART_RX | 1 << PART_TX,
        },
        worker,
    );
}

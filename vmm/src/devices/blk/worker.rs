//! One request queue's thread (`blk0-q0`, …): an event loop on event-manager that answers its
//! queue's requests against the disk file, and accounts its own time
//! ([`crate::accounting::worker`]): a thread asleep in `fdatasync` or in a read from a cold
//! cache is not runnable outside its loop's wait, so that time is its `blocked_ns`.
//!
//! Data flow: the loop waits on its wake eventfd (the transport's activation or reset, the
//! VMM's stop, work a budgeted pass left) and, in an active epoch, its queue's kick eventfd
//! (an ioeventfd the guest's QueueNotify signals). On a new epoch it drops its queue, stops
//! watching its kicks, builds it again from the transport's registers (or not, after a
//! reset) with the disk's limits as negotiated, says which epoch it serves
//! ([`VirtioShared::thread_serves`], which completes an activation that waited for it), and
//! runs a pass over it (kicks that came while it held the old queue went to that one). On a
//! kick it runs [`super::queue::req_pass`] and carries out its outcome: the interrupt, a
//! re-run through its own wake eventfd when the pass stopped at its budget, NEEDS_RESET for a
//! malformed chain (for the epoch it serves only), the first log line of each error reason.
//! With a rate limiter a pass it stopped leaves the queue waiting on the thread's timer
//! ([`crate::devices::rate::wait`]): kicks are counted and the queue is not served until the
//! timer says its tokens are there.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vm_memory::GuestMemoryMmap;

use super::queue::{req_pass, Outcome, ReqQueue};
use super::BlkShared;
use crate::accounting::{AccountingControl, Level};
use crate::devices::rate::wait::Waits;
use crate::devices::virtio::pass::{device_queue, signal};
use crate::devices::virtio::queue::QueueFault;
use crate::devices::virtio::{kicks, VirtioShared};

/// CPU parts of a request queue's thread ([`crate::accounting::worker::PARTS`] indexes):
/// answering requests.
pub const PART_REQ: usize = 0;
/// Polling the emptied ring (`poll_us=`).
pub const PART_POLL: usize = 1;
/// The loop itself.
pub const PART_OTHER: usize = 3;
/// The longest polling before the thread goes back to its loop (its other events: a
/// stop, a reset, the rate timer), ns; above the longest window (`poll_us=1000`).
pub const POLL_CAP_NS: u64 = 2_000_000;

/// Whether a pass ended at an emptied ring with nothing left for the thread to carry out
/// (no fault, no re-run, no rate wait, not abandoned): only then does the thread poll.
fn settled(o: &Outcome) -> bool {
    o.fault.is_none() && !o.more && !o.abandoned && o.throttled.is_none()
}

/// One request queue's state, owned by its thread.
pub struct Worker {
    queue: usize,
    blk: Arc<BlkShared>,
    virtio: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    control: Arc<AccountingControl>,
    /// The queue served in this epoch (its kick eventfd is watched).
    q: Option<ReqQueue>,
    /// The epoch served.
    epoch: u32,
    /// A budgeted pass left work, run again from the wake eventfd.
    again: bool,
    /// The queue's wait for the rate limiter.
    waits: Option<Waits>,
    /// The disk's `rate_changes` this thread has followed.
    rate_seen: u32,
}

impl Worker {
    /// The worker of request queue `queue`.
    pub fn new(
        queue: usize,
        blk: Arc<BlkShared>,
        virtio: Arc<VirtioShared>,
        mem: Arc<GuestMemoryMmap>,
        control: Arc<AccountingControl>,
    ) -> Self {
        // Every thread has its timer, so that `set-rate` can limit a disk started without.
        let waits = Waits::new()
            .map_err(|e| {
                log::error!(
                    "{}: cannot make the rate limiter's timer ({e}); queue {queue} runs unlimited",
                    blk.id
                )
            })
            .ok();
        Worker {
            queue,
            blk,
            virtio,
            mem,
            control,
            q: None,
            epoch: 0,
            again: false,
            waits,
            rate_seen: 0,
        }
    }

    /// Whether the queue waits for its rate limiter's tokens.
    fn throttled(&self) -> bool {
        self.waits.as_ref().is_some_and(|w| w.waiting(0))
    }

    /// The rate timer fired: the queue runs again when its tokens are there.
    fn on_rate_timer(&mut self, ops: &mut EventOps) {
        let q = &self.blk.queues[self.queue];
        let Some(w) = self.waits.as_mut() else {
            return;
        };
        if w.due(crate::sync::now_ns(), |_| q)[0] {
            self.pass(ops);
        }
    }

    /// Follows the transport's epoch: drops the queue, and builds it again when active.
    fn follow_epoch(&mut self, ops: &mut EventOps) {
        let w = self.virtio.word();
        if w.epoch() == self.epoch {
            return;
        }
        let kick = &self.blk.kicks[self.queue];
        if self.q.take().is_some() {
            let _ = ops.remove(Events::empty(kick));
        }
        self.again = false;
        let q = &self.blk.queues[self.queue];
        if let Some(waits) = self.waits.as_mut() {
            waits.clear(crate::sync::now_ns(), |_| q);
        }
        self.epoch = w.epoch();
        if w.active() && !self.virtio.stopped() {
            match device_queue(&self.virtio, Some(self.queue), &self.mem) {
                Ok(Some(dq)) => {
                    if let Err(e) = ops.add(Events::new(kick, EventSet::IN)) {
                        log::error!(
                            "{}: cannot watch the kicks of queue {}: {e:?}",
                            self.blk.id,
                            self.queue
                        );
                    }
                    let mut rq = ReqQueue::new(dq, self.blk.limits(&self.virtio));
                    rq.rate = Some(Arc::clone(&self.blk.rate)).filter(|_| self.waits.is_some());
                    self.q = Some(rq);
                    // A kick that came while this thread still held the old queue went to
                    // that one: the new epoch starts with a pass.
                    self.requeue();
                }
                Ok(None) => {}
                Err(v) => self.virtio.needs_reset_in(self.epoch, v),
            }
        }
        self.virtio.thread_serves(self.queue, self.epoch);
    }

    fn on_wake(&mut self, ops: &mut EventOps) {
        if let Some(w) = self.virtio.wake_fd(self.queue) {
            let _ = w.read();
        }
        let changes = self.blk.rate_changes.load(Ordering::Acquire);
        if changes != self.rate_seen {
            // `set-rate`: a queue waiting for the old buckets asks the new ones.
            self.rate_seen = changes;
            let q = &self.blk.queues[self.queue];
            if let Some(waits) = self.waits.as_mut() {
                waits.clear(crate::sync::now_ns(), |_| q);
            }
            self.again = true;
        }
        self.follow_epoch(ops);
        // A queue waiting for its tokens runs when its timer says so.
        if std::mem::take(&mut self.again) && !self.throttled() {
            self.pass(ops);
        }
    }

    /// Answers the queue: a pass, then, with `poll_us=`, the polling of the emptied ring
    /// ([`Worker::poll`]).
    fn pass(&mut self, ops: &mut EventOps) {
        let polls = self.blk.poll_ns > 0;
        if self.one_pass(ops, polls).is_some_and(|o| settled(&o)) && polls {
            self.poll(ops);
        }
    }

    /// Runs one pass (leaving the driver's notifications off at an empty ring when `hold`)
    /// and carries out its outcome; while marks are taken its CPU is the request work. None
    /// without a queue.
    fn one_pass(&mut self, ops: &mut EventOps, hold: bool) -> Option<Outcome> {
        let mut rq = self.q.take()?;
        rq.hold = hold;
        let marking = self.control.level() != Level::Off;
        let meter = &self.blk.meters[self.queue];
        if marking {
            meter.cpu_mark(PART_OTHER);
        }
        let (virtio, epoch) = (Arc::clone(&self.virtio), self.epoch);
        let o = req_pass(
            &mut rq,
            &self.mem,
            &self.blk.disk,
            &self.blk.queues[self.queue],
            &self.blk.requests[self.queue],
            || virtio.serves(epoch),
        );
        if marking {
            meter.cpu_mark(PART_REQ);
        }
        self.q = Some(rq);
        self.after(ops, &o);
        Some(o)
    }

    /// Polls the emptied ring (`poll_us=`, as QEMU's iothreads and vhost's busy loop do): the
    /// driver's notifications stay off, so it does not kick (an exit) for the requests it
    /// makes meanwhile, and the thread does not sleep and wake for them. Each request found
    /// is answered by a pass that keeps notifications off, and the polling goes on; it stops
    /// when a window of `poll_ns` passes with nothing, after [`POLL_CAP_NS`] in all (so the
    /// loop sees its other events), at a reset or a stop, or when a pass did not settle (its
    /// outcome was carried out: a re-run, the rate timer, a fault). Then, unless a reset or
    /// a stop ended it, a last pass turns notifications on and looks at the ring once more,
    /// as every queue does before it waits. The looking is the thread's `poll` CPU.
    fn poll(&mut self, ops: &mut EventOps) {
        let marking = self.control.level() != Level::Off;
        let start = crate::sync::now_ns();
        loop {
            let found = self.look(start);
            if marking {
                self.blk.meters[self.queue].cpu_mark(PART_POLL);
            }
            if !found {
                break;
            }
            if !self.one_pass(ops, true).is_some_and(|o| settled(&o)) {
                return;
            }
        }
        // After a reset or at a stop the queue is not this epoch's to touch: the loop follows
        // the new epoch (a new queue, which starts with a pass) or ends.
        if self.virtio.serves(self.epoch) && !self.blk.stop.load(Ordering::Relaxed) {
            let _ = self.one_pass(ops, false);
        }
    }

    /// Looks at the ring until a request is there (true; also when its index is broken, which
    /// the pass then reports), or until a window of `poll_ns` passes, [`POLL_CAP_NS`] since
    /// `start`, the epoch ends or the device stops (false).
    fn look(&mut self, start: u64) -> bool {
        let Some(rq) = self.q.as_mut() else {
            return false;
        };
        let window = crate::sync::now_ns().saturating_add(self.blk.poll_ns);
        loop {
            if rq.dq.has_available().unwrap_or(true) {
                return true;
            }
            let now = crate::sync::now_ns();
            if now >= window
                || now.saturating_sub(start) >= POLL_CAP_NS
                || !self.virtio.serves(self.epoch)
                || self.blk.stop.load(Ordering::Relaxed)
            {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Carries out what a pass says.
    fn after(&mut self, ops: &mut EventOps, o: &Outcome) {
        for why in o.reasons() {
            self.blk.log_once(why);
        }
        if let Some(f) = o.fault {
            if let QueueFault::Chain(e) = f {
                log::warn!("{}: {}", self.blk.id, e.describe());
            }
            self.virtio.needs_reset_in(self.epoch, f.violation());
            if self.q.take().is_some() {
                let _ = ops.remove(Events::empty(&self.blk.kicks[self.queue]));
            }
            return;
        }
        signal(&self.virtio, o.irq, &self.blk.queues[self.queue]);
        if o.more && !o.abandoned {
            self.requeue();
        }
        if let (Some(wait), Some(w)) = (o.throttled, self.waits.as_mut()) {
            let q = &self.blk.queues[self.queue];
            w.throttle(0, wait, q, crate::sync::now_ns());
        }
    }

    /// Asks the thread to run a pass soon (its own wake eventfd), after the other events now
    /// waiting.
    fn requeue(&mut self) {
        self.again = true;
        if let Some(w) = self.virtio.wake_fd(self.queue) {
            let _ = w.write(1);
        }
    }
}

impl MutEventSubscriber for Worker {
    fn init(&mut self, ops: &mut EventOps) {
        if let Some(w) = self.virtio.wake_fd(self.queue) {
            if let Err(e) = ops.add(Events::new(w, EventSet::IN)) {
                log::error!("{}: cannot watch its wake eventfd: {e:?}", self.blk.id);
            }
            // The first pass follows whatever epoch the device is in already.
            let _ = w.write(1);
        }
        if let Some(t) = &self.waits {
            if let Err(e) = ops.add(Events::new(t, EventSet::IN)) {
                log::error!("{}: cannot watch its rate timer: {e:?}", self.blk.id);
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.blk.meters[self.queue].wait_end();
        let fd = events.fd();
        if self
            .virtio
            .wake_fd(self.queue)
            .is_some_and(|w| w.as_raw_fd() == fd)
        {
            self.on_wake(ops);
            return;
        }
        if self.waits.as_ref().is_some_and(|w| w.as_raw_fd() == fd) {
            self.on_rate_timer(ops);
            return;
        }
        let kick = &self.blk.kicks[self.queue];
        if self.q.is_some() && kick.as_raw_fd() == fd {
            self.blk.queues[self.queue].notifications.add(kicks(kick));
            if !self.throttled() {
                self.pass(ops);
            }
        }
    }
}

/// The body of a request queue's thread, called `name`: runs the loop until the device stops.
pub fn run(name: &str, worker: Worker) {
    let blk = Arc::clone(&worker.blk);
    crate::devices::virtio::thread::run(
        crate::devices::virtio::thread::ThreadParams {
            name,
            meter: &blk.meters[worker.queue],
            stop: &blk.stop,
            seccomp: crate::seccomp::Kind::Disk,
            // A disk counts no frames that waited for a hold.
            held_kinds: 0,
        },
        worker,
    );
}

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
/// The loop itself.
pub const PART_OTHER: usize = 3;

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

    /// Runs one pass and, while marks are taken, charges its CPU to the request work.
    fn pass(&mut self, ops: &mut EventOps) {
        let Some(mut rq) = self.q.take() else {
            return;
        };
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

//! One queue pair's thread (`net0-qp0`, …): an event loop on event-manager that serves the
//! pair's receive and transmit queues (and, on pair 0, the control queue) against its tap
//! queue, and accounts its own time ([`crate::accounting::worker`]).
//!
//! Data flow: the loop waits on its wake eventfd (the transport's activation or reset, and
//! the VMM's stop), its queues' kick eventfds (ioeventfds the guest's QueueNotify writes
//! signal) and, while it has somewhere to put frames, its tap. On a new epoch it drops its
//! queues and builds them again from the transport's registers (or not, after a reset), and
//! says so ([`super::NetShared::served`]); a tx kick sends what the guest made available
//! ([`super::tx`]); a readable tap delivers frames into the guest ([`super::rx`]) until the
//! guest has no room, when the tap is left unread until the guest adds buffers (its rx
//! kick); a control request sets the queue pairs in use ([`super::ctrl`]). A malformed chain
//! stops the device until the driver resets it (NEEDS_RESET). Every batch ends with the
//! driver's interrupt, unless EVENT_IDX or its flags say it does not want one.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use ppa_vmm_api::DropReason;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::ctrl;
use super::queues::QueueCounters;
use super::rx::{Delivery, QueueFault, RxQueue};
use super::tx::TxQueue;
use super::NetShared;
use crate::accounting::{AccountingControl, Level};
use crate::devices::virtio::chain::Segments;
use crate::devices::virtio::status::Violation;
use crate::devices::virtio::VirtioShared;

/// CPU parts of a queue pair's thread ([`crate::accounting::worker::PARTS`] indexes).
pub const PART_RX: usize = 0;
/// Transmit work.
pub const PART_TX: usize = 1;
/// Control-queue work.
pub const PART_CTRL: usize = 2;
/// The loop itself.
pub const PART_OTHER: usize = 3;
/// Frames a readable tap gives per wake-up before the loop looks at its other events.
const RX_BUDGET: usize = 256;
/// The receive buffer: a 64 KiB frame and its header.
const RX_BUF: usize = 65_536 + 64;

/// One queue pair's state, owned by its thread.
pub struct Worker {
    pair: usize,
    net: Arc<NetShared>,
    virtio: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    control: Arc<AccountingControl>,
    rx: Option<RxQueue>,
    tx: Option<TxQueue>,
    ctrl: Option<Queue>,
    ctrl_segs: Segments,
    served: u64,
    buf: Vec<u8>,
    pending: Option<usize>,
    listening: bool,
    tap_down_logged: bool,
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
        Worker {
            pair,
            net,
            virtio,
            mem,
            control,
            rx: None,
            tx: None,
            ctrl: None,
            ctrl_segs: Segments::with_capacity(super::QUEUE_SIZE as usize),
            served: 0,
            buf: vec![0; RX_BUF],
            pending: None,
            listening: false,
            tap_down_logged: false,
        }
    }

    fn rx_index(&self) -> usize {
        2 * self.pair
    }

    fn tx_index(&self) -> usize {
        2 * self.pair + 1
    }

    fn counters(&self, queue: usize) -> &QueueCounters {
        &self.net.queues[queue]
    }

    fn tap(&self) -> &super::tap::Tap {
        &self.net.taps[self.pair]
    }

    fn mark(&self, part: usize) {
        if self.control.level() != Level::Off {
            self.net.meters[self.pair].cpu_mark(part);
        }
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

    fn build(&self, index: usize, event_idx: bool) -> Result<Option<Queue>, Violation> {
        match (self.virtio.queue(index), self.virtio.max_size(index)) {
            (Some(regs), Some(max)) => regs.to_queue(max, event_idx, &self.mem),
            _ => Ok(None),
        }
    }

    /// Follows the transport's epoch: drops the queues, and builds them again when active.
    fn follow_epoch(&mut self, ops: &mut EventOps) {
        let (epoch, active) = self.virtio.epoch();
        if epoch == self.served {
            return;
        }
        if self.pending.take().is_some() {
            self.counters(self.rx_index())
                .drop_one(DropReason::DeviceReset);
        }
        self.rx = None;
        self.tx = None;
        self.ctrl = None;
        self.set_listening(ops, false);
        if active && !self.virtio.stopped() {
            self.activate(ops);
        }
        self.served = epoch;
        self.net.served[self.pair].store(epoch, Ordering::Release);
    }

    fn activate(&mut self, ops: &mut EventOps) {
        let f = self.virtio.driver_features();
        let has = |bit: u32| f & (1u64 << bit) != 0;
        let event_idx = has(VIRTIO_RING_F_EVENT_IDX);
        let built = self
            .build(self.rx_index(), event_idx)
            .and_then(|rx| Ok((rx, self.build(self.tx_index(), event_idx)?)));
        let (rx, tx) = match built {
            Ok(v) => v,
            Err(v) => return self.virtio.needs_reset(v),
        };
        self.rx = rx.map(|q| RxQueue::new(q, has(VIRTIO_NET_F_MRG_RXBUF)));
        self.tx = tx.map(TxQueue::new);
        if self.pair == 0 {
            self.activate_pair0(f);
        }
        let enabled = self.pair < usize::from(self.net.active_pairs.load(Ordering::Acquire));
        self.set_listening(ops, enabled);
    }

    /// Pair 0 sets what is per device: the tap's offloads, the control queue and the pairs
    /// in use (one until the driver asks for more).
    fn activate_pair0(&mut self, f: u64) {
        let has = |bit: u32| f & (1u64 << bit) != 0;
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
        // One pair until the driver asks for more through the control queue (virtio 1.2,
        // 5.1.6.5.5); without MQ only the first pair exists for the driver at all. The other
        // tap queues are detached, so the kernel sends nothing to queues nobody reads.
        self.set_pairs(1);
        if self.net.ctrl {
            match self.build(2 * usize::from(self.net.pairs), false) {
                Ok(q) => self.ctrl = q,
                Err(v) => self.virtio.needs_reset(v),
            }
        }
    }

    fn set_pairs(&self, n: u16) {
        self.net.active_pairs.store(n, Ordering::Release);
        if self.net.pairs > 1 {
            for (i, tap) in self.net.taps.iter().enumerate() {
                if let Err(e) = tap.enable(i < usize::from(n)) {
                    log::warn!("{}: {e}", self.net.id);
                }
            }
            // The other pairs' threads start or stop reading their tap queues.
            for (i, w) in self.net.wakes.iter().enumerate() {
                if i != self.pair {
                    let _ = w.write(1);
                }
            }
        }
    }

    /// Reads the tap while this pair is in use, has a receive queue and the device runs.
    fn refresh_listening(&mut self, ops: &mut EventOps) {
        let enabled = self.pair < usize::from(self.net.active_pairs.load(Ordering::Acquire));
        let want = enabled && self.rx.is_some() && !self.virtio.stopped();
        if want != self.listening {
            self.set_listening(ops, want);
        }
    }

    fn fault(&mut self, f: QueueFault, ops: &mut EventOps) {
        let v = match f {
            QueueFault::Chain(e) => {
                log::warn!("{}: {}", self.net.id, e.describe());
                Violation::BadChain
            }
            QueueFault::AvailIndex => Violation::AvailIndex,
            QueueFault::UsedRing => Violation::BadQueue,
        };
        self.virtio.needs_reset(v);
        self.set_listening(ops, false);
    }

    /// Raises the used-buffer interrupt of `q` if the driver wants it.
    fn notify(&self, q: &mut Queue, index: usize) {
        let raised = match q.needs_notification(self.mem.as_ref()) {
            Ok(true) => self.virtio.signal_used(),
            _ => false,
        };
        self.counters(index).interrupt(raised);
    }

    fn read_frame(&mut self, ops: &mut EventOps) -> Option<usize> {
        if let Some(n) = self.pending {
            return Some(n);
        }
        let net = Arc::clone(&self.net);
        match net.taps[self.pair].read(&mut self.buf) {
            Ok(n) => {
                self.pending = Some(n);
                Some(n)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => {
                self.tap_failed(&e, ops);
                None
            }
        }
    }

    fn tap_failed(&mut self, e: &io::Error, ops: &mut EventOps) {
        if !self.tap_down_logged {
            self.tap_down_logged = true;
            log::warn!(
                "{}: its tap {} failed ({e}); frames from the host stop until the guest adds buffers again",
                self.net.id,
                self.tap().name()
            );
        }
        self.set_listening(ops, false);
    }

    fn rx(&mut self, ops: &mut EventOps) {
        let index = self.rx_index();
        let mut delivered = 0u64;
        for _ in 0..RX_BUDGET {
            if self.virtio.stopped() {
                self.set_listening(ops, false);
                break;
            }
            let Some(len) = self.read_frame(ops) else {
                break;
            };
            let Some(rxq) = self.rx.as_mut() else {
                self.pending = None;
                self.net.queues[index].drop_one(DropReason::NoRxBuffer);
                continue;
            };
            let c = &self.net.queues[index];
            match rxq.deliver(&self.mem, &self.buf[..len]) {
                Delivery::Delivered(chains) => {
                    self.pending = None;
                    c.chains.add(u64::from(chains));
                    c.packets.add(1);
                    c.bytes
                        .add(len.saturating_sub(super::tap::VNET_HDR_LEN) as u64);
                    delivered += 1;
                }
                Delivery::NoRoom => {
                    self.set_listening(ops, false);
                    break;
                }
                Delivery::TooLarge => {
                    self.pending = None;
                    c.chains.add(1);
                    c.drop_one(DropReason::OversizedFrame);
                }
                Delivery::Bad(f) => {
                    self.pending = None;
                    c.drop_one(DropReason::BadChain);
                    self.fault(f, ops);
                    break;
                }
            }
        }
        if delivered > 0 {
            if let Some(mut rxq) = self.rx.take() {
                self.notify(&mut rxq.q, index);
                self.rx = Some(rxq);
            }
        }
    }

    fn tx(&mut self, ops: &mut EventOps) {
        if self.virtio.stopped() {
            return;
        }
        let index = self.tx_index();
        let Some(mut txq) = self.tx.take() else {
            return;
        };
        let pass = txq.run(&self.mem, self.tap(), &self.net.queues[index]);
        if let Some(f) = pass.fault {
            self.fault(f, ops);
        } else if pass.chains > 0 {
            self.notify(&mut txq.q, index);
        }
        self.tx = Some(txq);
    }

    fn ctrl(&mut self, ops: &mut EventOps) {
        if self.virtio.stopped() {
            return;
        }
        let index = 2 * usize::from(self.net.pairs);
        let Some(mut q) = self.ctrl.take() else {
            return;
        };
        let pass = ctrl::run(
            &mut q,
            &self.mem,
            &mut self.ctrl_segs,
            self.net.pairs,
            &self.net.queues[index],
        );
        if let Some(n) = pass.pairs {
            self.set_pairs(n);
        }
        match pass.fault {
            Some(f) => self.fault(f, ops),
            None => self.notify(&mut q, index),
        }
        self.ctrl = Some(q);
    }

    /// The guest added receive buffers: deliver what waits, and read the tap again.
    fn rx_kick(&mut self, ops: &mut EventOps) {
        let enabled = self.pair < usize::from(self.net.active_pairs.load(Ordering::Acquire));
        if self.rx.is_some() && enabled && !self.virtio.stopped() {
            self.set_listening(ops, true);
            self.rx(ops);
        }
    }
}

/// Reads a kick eventfd: the number of kicks since the last read.
fn kicks(fd: &vmm_sys_util::eventfd::EventFd) -> u64 {
    fd.read().unwrap_or(0)
}

impl MutEventSubscriber for Worker {
    fn init(&mut self, ops: &mut EventOps) {
        let mut fds = vec![&self.net.wakes[self.pair]];
        fds.push(&self.net.kicks[self.rx_index()]);
        fds.push(&self.net.kicks[self.tx_index()]);
        if self.pair == 0 && self.net.ctrl {
            fds.push(&self.net.kicks[2 * usize::from(self.net.pairs)]);
        }
        for fd in fds {
            if let Err(e) = ops.add(Events::new(fd, EventSet::IN)) {
                log::error!("{}: cannot watch an eventfd: {e:?}", self.net.id);
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let meter = &self.net.meters[self.pair];
        meter.wait_end();
        self.mark(PART_OTHER);
        let fd = events.fd();
        let net = Arc::clone(&self.net);
        let rx = self.rx_index();
        let tx = self.tx_index();
        let ctrl = 2 * usize::from(net.pairs);
        use std::os::fd::AsRawFd;
        if fd == net.wakes[self.pair].as_raw_fd() {
            let _ = net.wakes[self.pair].read();
            self.follow_epoch(ops);
            self.refresh_listening(ops);
            self.mark(PART_OTHER);
        } else if fd == net.kicks[rx].as_raw_fd() {
            net.queues[rx].notifications.add(kicks(&net.kicks[rx]));
            self.rx_kick(ops);
            self.mark(PART_RX);
        } else if fd == net.kicks[tx].as_raw_fd() {
            net.queues[tx].notifications.add(kicks(&net.kicks[tx]));
            self.tx(ops);
            self.mark(PART_TX);
        } else if net.ctrl && self.pair == 0 && fd == net.kicks[ctrl].as_raw_fd() {
            net.queues[ctrl].notifications.add(kicks(&net.kicks[ctrl]));
            self.ctrl(ops);
            self.mark(PART_CTRL);
        } else if fd == self.tap().as_raw_fd() {
            if events
                .event_set()
                .intersects(EventSet::ERROR | EventSet::HANG_UP)
            {
                let e = io::Error::from_raw_os_error(libc::EIO);
                self.tap_failed(&e, ops);
            } else {
                self.rx(ops);
            }
            self.mark(PART_RX);
        }
    }
}

/// The body of queue pair `pair`'s thread: runs the loop until the device stops.
pub fn run(worker: Worker) {
    let net = Arc::clone(&worker.net);
    let pair = worker.pair;
    let meter = &net.meters[pair];
    meter.start();
    let mut em = match EventManager::<Worker>::new() {
        Ok(em) => em,
        Err(e) => {
            log::error!(
                "{}: cannot start the event loop of pair {pair}: {e:?}",
                net.id
            );
            meter.end();
            return;
        }
    };
    em.add_subscriber(worker);
    crate::seccomp::enter(crate::seccomp::Kind::Device);
    while !net.stop.load(Ordering::Acquire) {
        meter.wait_begin();
        let r = em.run();
        meter.wait_end();
        if let Err(e) = r {
            log::error!("{}: the event loop of pair {pair} failed: {e:?}", net.id);
            break;
        }
    }
    meter.end();
}

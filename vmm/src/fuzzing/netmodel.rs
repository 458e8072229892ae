//! The fuzzer's model of a Linux guest driving our virtio-net device: the driver
//! ([`guest::Guest`], over [`super::driver::DriverRing`]s) and the device's queue-pair thread
//! (played here, running the same queue builds and passes as the real thread:
//! [`crate::devices::net::batch`]) talk through real rings in guest memory and the real
//! transport ([`MmioTransport`]), step by step as the fuzzer's bytes say, with a host that
//! sends frames into a model tap and a sink for what the guest sends.
//!
//! What it asserts: a kick is the only way the driver wakes the device for a queue, and an
//! interrupt the only way the device wakes the driver, each exactly when the other side's
//! index says so (`vring_need_event`, or the NO_NOTIFY and NO_INTERRUPT flags); so at
//! quiescence (nothing pending on either side) nothing the driver published may be left: every
//! transmit and control chain taken and answered, every frame the host sent delivered or
//! dropped with a reason, every used entry seen by the driver. On the way: an interrupt
//! raised exactly when the driver asked for one; frames delivered whole and in order; after a
//! reset, nothing written into the old rings, the status reading 0, the re-probe taken
//! whether the device's thread has caught up or not, and the device never left stopped.
//!
//! With a rate limiter on receive or transmit (the setup's choice, small buckets on the
//! model's own clock), a pass the limiter stops leaves the rest for its timer, as the real
//! thread does: kicks and a readable tap of that way start nothing until the timer fires (the
//! model's clock then jumps to its deadline), and at quiescence nothing may be left either.
//!
//! Data flow: [`run`] reads the configuration from the first bytes, then one action per byte
//! (with arguments from the next ones) until the input ends, then drives both sides to
//! quiescence and checks.

use std::cell::Cell;
use std::sync::Arc;

use ppa_vmm_api::DropReason;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_mmio::*;
use virtio_bindings::bindings::virtio_net::*;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::devices::net::batch::{self, Irq, Outcome, Queues};
use crate::devices::net::queues::QueueCounters;
use crate::devices::net::tap::VNET_HDR_LEN;
use crate::devices::net::{config_space, layout, spec::Mac};
use crate::devices::rate::{BucketSpec, RateSpec, SharedLimiter};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::status;
use crate::devices::virtio::VirtioShared;
use crate::devices::{BusAccess, BusDevice};

mod ends;
pub mod guest;

pub use ends::ModelTap;
use ends::{ModelDevice, ModelSink};

use guest::{payload_byte, Guest, GuestConfig, MEM};

/// The device's pairs (the model drives pair 0 and the control queue).
const PAIRS: u16 = 2;
/// The device's MTU.
const MTU: u16 = 1500;
/// Steps at quiescence before the model calls it a livelock.
const QUIESCE_STEPS: usize = 200_000;
/// Frames the host sends at most in one input.
const MAX_FRAMES: u64 = 4096;

thread_local! {
    /// The model's clock (ns): it moves only when a rate timer fires.
    static CLOCK: Cell<u64> = const { Cell::new(1_000_000_000) };
}

fn model_now() -> u64 {
    CLOCK.with(Cell::get)
}

/// What the input chose.
#[derive(Debug, Clone, Copy)]
struct Setup {
    guest: GuestConfig,
    features: u64,
    /// The device's thread follows the epoch only when the input says (otherwise at once).
    lag: bool,
    /// Rate limits on receive and transmit.
    rate: [Option<RateSpec>; 2],
}

/// The device's queue-pair thread, played by the model.
struct Thread {
    q: Queues,
    epoch: u32,
    blocked: bool,
    again: [bool; 2],
    /// Kicks not yet taken: rx, tx, ctrl.
    kicks: [bool; 3],
    /// Receive and transmit waiting for their rate limiter's tokens: the model's time their
    /// timer fires at.
    throttled: [Option<u64>; 2],
}

/// The whole model.
struct Model {
    mem: Arc<GuestMemoryMmap>,
    virtio: Arc<VirtioShared>,
    transport: MmioTransport,
    setup: Setup,
    guest: Guest,
    area: usize,
    thread: Thread,
    counters: Vec<QueueCounters>,
    tap: ModelTap,
    sink: ModelSink,
    /// The rate limiters of receive and transmit, when the setup has them.
    limiters: [Option<SharedLimiter>; 2],
    /// The driver's interrupt line: raised and not yet taken.
    irq: bool,
    /// The driver is polling: its interrupts are off until it finishes.
    polling: bool,
    /// Frames the host sent: (sequence, payload length).
    host_sent: Vec<(u32, usize)>,
    /// The old receive ring's used ring and index after the last reset (nothing may move
    /// it).
    old_used: Option<(u64, u16)>,
}

fn bytes_at(data: &[u8], i: &mut usize) -> u8 {
    let b = data.get(*i).copied().unwrap_or(0);
    *i += 1;
    b
}

impl Model {
    fn new(setup: Setup) -> Option<Model> {
        let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).ok()?);
        let nq = layout::queue_count(PAIRS, true);
        let virtio = Arc::new(VirtioShared::new("model0".into(), &vec![1024; nq], 1, None).ok()?);
        virtio.threads_started();
        let dev = Arc::new(ModelDevice {
            config: config_space(Mac([2, 0, 0, 0, 0, 1]), PAIRS, MTU),
        });
        let transport =
            MmioTransport::new(0, dev, Arc::clone(&virtio), Arc::clone(&mem)).with_reset_wait(0);
        let guest = Guest::new(&mem, setup.guest, 0);
        let mut m = Model {
            mem,
            virtio,
            transport,
            setup,
            guest,
            area: 0,
            thread: Thread {
                q: Queues::default(),
                epoch: 0,
                blocked: false,
                again: [false; 2],
                kicks: [false; 3],
                throttled: [None; 2],
            },
            counters: (0..nq).map(|_| QueueCounters::default()).collect(),
            tap: ModelTap::default(),
            sink: ModelSink::default(),
            limiters: setup
                .rate
                .map(|r| r.map(|r| SharedLimiter::on_clock(&r, model_now))),
            irq: false,
            polling: false,
            host_sent: Vec::new(),
            old_used: None,
        };
        m.probe();
        Some(m)
    }

    fn w(&self, off: u32, v: u32) {
        let a = BusAccess {
            vcpu: 0,
            addr: u64::from(off),
            offset: u64::from(off),
        };
        self.transport.write(a, &v.to_le_bytes());
    }

    fn r(&self, off: u32) -> u32 {
        let a = BusAccess {
            vcpu: 0,
            addr: u64::from(off),
            offset: u64::from(off),
        };
        let mut b = [0u8; 4];
        self.transport.read(a, &mut b);
        u32::from_le_bytes(b)
    }

    /// The driver's probe: reset, features, queues, DRIVER_OK (Linux's order).
    fn probe(&mut self) {
        self.w(VIRTIO_MMIO_STATUS, 0);
        assert_eq!(self.r(VIRTIO_MMIO_STATUS), 0, "status reads 0 once reset");
        self.follow_unless_lagging();
        let f = self.setup.features;
        self.w(VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE);
        self.w(VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        for sel in 0..2 {
            self.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
            self.w(VIRTIO_MMIO_DRIVER_FEATURES, (f >> (32 * sel)) as u32);
        }
        let ready = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        self.w(VIRTIO_MMIO_STATUS, ready);
        assert_eq!(self.r(VIRTIO_MMIO_STATUS), ready, "features accepted");
        let g = &self.guest;
        let mut queues = vec![(0usize, &g.rx), (1, &g.tx)];
        if let (Some(i), Some(q)) = (g.cfg.ctrl_at, g.ctrl.as_ref()) {
            queues.push((i, q));
        }
        for (i, q) in queues {
            let (d, a, u) = q.addrs();
            self.w(VIRTIO_MMIO_QUEUE_SEL, i as u32);
            self.w(VIRTIO_MMIO_QUEUE_NUM, u32::from(q.size()));
            for (lo, addr) in [
                (VIRTIO_MMIO_QUEUE_DESC_LOW, d),
                (VIRTIO_MMIO_QUEUE_AVAIL_LOW, a),
                (VIRTIO_MMIO_QUEUE_USED_LOW, u),
            ] {
                self.w(lo, addr as u32);
                self.w(lo + 4, (addr >> 32) as u32);
            }
            self.w(VIRTIO_MMIO_QUEUE_READY, 1);
            assert_eq!(
                self.r(VIRTIO_MMIO_QUEUE_READY),
                1,
                "the queue write was taken"
            );
        }
        self.w(VIRTIO_MMIO_STATUS, ready | status::DRIVER_OK);
        assert_eq!(
            self.r(VIRTIO_MMIO_STATUS),
            ready | status::DRIVER_OK,
            "DRIVER_OK reads back"
        );
        self.follow_unless_lagging();
        // Linux fills the receive queue as it opens the device.
        let kick = self
            .guest
            .post_rx(&self.mem, usize::from(self.guest.cfg.size));
        self.thread.kicks[0] |= kick;
    }

    fn follow_unless_lagging(&mut self) {
        if !self.setup.lag {
            self.follow();
        }
    }

    /// The thread follows the device's epoch, as the real one does when woken.
    fn follow(&mut self) {
        let w = self.virtio.word();
        if w.epoch() == self.thread.epoch {
            return;
        }
        if self.thread.q.rx.as_ref().is_some_and(|r| r.has_pending()) {
            self.counters[0].drop_one(DropReason::DeviceReset);
        }
        self.thread.q = Queues::default();
        self.thread.blocked = false;
        self.thread.again = [false; 2];
        // A new epoch ends every rate wait, as the real thread's `end_waits`.
        self.thread.throttled = [None; 2];
        self.thread.epoch = w.epoch();
        if w.active() && !self.virtio.stopped() {
            match batch::build(&self.virtio, 0, PAIRS, MTU, &self.mem) {
                Ok(q) => self.thread.q = q,
                Err(v) => panic!("a queue the model's driver set up was refused: {v:?}"),
            }
            // As the real thread: a new epoch starts with a pass over each queue, since kicks
            // that came while it held the old queues went to those.
            self.thread.kicks = [true; 3];
        }
        self.virtio.thread_serves(0, self.thread.epoch);
        // A completed activation bumps the epoch again: follow it too.
        if self.virtio.word().epoch() != self.thread.epoch && !self.setup.lag {
            self.follow();
        }
    }

    fn listening(&self) -> bool {
        self.thread.q.rx.is_some() && self.virtio.serves(self.thread.epoch) && !self.thread.blocked
    }

    /// The limiter of way `way` (0 receive, 1 transmit) when it limits.
    fn rate(&self, way: usize) -> Option<&SharedLimiter> {
        self.limiters[way].as_ref().filter(|l| l.limits())
    }

    /// The pass of way `way` ended for want of tokens for `wait` more ns (or not).
    fn throttle(&mut self, way: usize, wait: Option<u64>) {
        if let Some(w) = wait {
            assert!(
                self.rate(way).is_some(),
                "a pass without a limiter was throttled"
            );
            self.thread.throttled[way] = Some(model_now() + w);
        }
    }

    /// Checks a pass's interrupt decision against what the driver asked, and raises it.
    fn interrupt(&mut self, o: &Outcome, wanted_by_driver: bool) {
        assert!(
            o.fault.is_none(),
            "the device found a fault in a valid driver's queue: {:?}",
            o.fault
        );
        match o.irq {
            Irq::Wanted => {
                assert!(wanted_by_driver, "an interrupt the driver asked not to get");
                self.irq = true;
            }
            Irq::Suppressed | Irq::None => {
                assert!(
                    !wanted_by_driver,
                    "no interrupt where the driver asked for one"
                );
            }
        }
    }

    /// Runs the device's pass for queue `which` (0 rx, 1 tx, 2 ctrl).
    fn pass(&mut self, which: usize) {
        let (virtio, epoch, mem) = (
            Arc::clone(&self.virtio),
            self.thread.epoch,
            Arc::clone(&self.mem),
        );
        let go_on = || virtio.serves(epoch);
        let served = self.thread.q.served;
        let (o, wanted) = match which {
            0 => {
                let (Some(i), Some(rxq)) = (served.rx, self.thread.q.rx.as_mut()) else {
                    return;
                };
                let before = self.guest.rx.used_idx(&mem);
                let rate = self.limiters[0].as_ref().filter(|l| l.limits());
                let o = batch::rx_pass(rxq, &mem, &self.tap, &self.counters[i], rate, go_on);
                self.thread.blocked |= o.blocked;
                self.throttle(0, o.throttled);
                (o, self.guest.rx.wants_interrupt(&mem, before))
            }
            1 => {
                let (Some(i), Some(txq)) = (served.tx, self.thread.q.tx.as_mut()) else {
                    return;
                };
                let before = self.guest.tx.used_idx(&mem);
                let rate = self.limiters[1].as_ref().filter(|l| l.limits());
                let o = batch::tx_pass(txq, &mem, &self.sink, &self.counters[i], rate, go_on);
                self.thread.again[0] |= o.more;
                self.throttle(1, o.throttled);
                (o, self.guest.tx.wants_interrupt(&mem, before))
            }
            _ => {
                let (Some(i), Some(q), Some(dq)) = (
                    served.ctrl,
                    self.thread.q.ctrl.as_mut(),
                    self.guest.ctrl.as_ref(),
                ) else {
                    return;
                };
                let before = dq.used_idx(&mem);
                let o = batch::ctrl_pass(q, &mem, &self.counters[i], go_on);
                self.thread.again[1] |= o.more;
                let wanted = self
                    .guest
                    .ctrl
                    .as_ref()
                    .is_some_and(|d| d.wants_interrupt(&mem, before));
                (o, wanted)
            }
        };
        if o.abandoned {
            return;
        }
        self.interrupt(&o, wanted);
    }

    /// The device handles one pending event (the `pick`-th of those pending); false when none.
    fn device_step(&mut self, pick: u8) -> bool {
        let mut pending: Vec<u8> = Vec::with_capacity(6);
        for (k, &on) in self.thread.kicks.iter().enumerate() {
            if on {
                pending.push(k as u8);
            }
        }
        if self.thread.again[0] {
            pending.push(3);
        }
        if self.thread.again[1] {
            pending.push(4);
        }
        let [rx_wait, tx_wait] = self.thread.throttled;
        if self.listening() && rx_wait.is_none() && !self.tap.frames.borrow().is_empty() {
            pending.push(5);
        }
        if rx_wait.is_some() {
            pending.push(6);
        }
        if tx_wait.is_some() {
            pending.push(7);
        }
        if pending.is_empty() {
            return false;
        }
        match pending[usize::from(pick) % pending.len()] {
            // A kick of a way that waits for its tokens is taken and starts nothing (its
            // timer runs the pass), as in the real thread.
            0 => {
                self.thread.kicks[0] = false;
                self.thread.blocked = false;
                if rx_wait.is_none() {
                    self.pass(0);
                }
            }
            1 => {
                self.thread.kicks[1] = false;
                if tx_wait.is_none() {
                    self.pass(1);
                }
            }
            2 => {
                self.thread.kicks[2] = false;
                self.pass(2);
            }
            3 => {
                self.thread.again[0] = false;
                if tx_wait.is_none() {
                    self.pass(1);
                }
            }
            4 => {
                self.thread.again[1] = false;
                self.pass(2);
            }
            // A rate timer fires: the model's time moves to its deadline, and the way runs
            // (receive only while it listens to the tap, as the real thread).
            w @ (6 | 7) => {
                let way = usize::from(w - 6);
                if let Some(at) = self.thread.throttled[way].take() {
                    CLOCK.with(|c| c.set(c.get().max(at)));
                }
                if way == 1 || self.listening() {
                    self.pass(way);
                }
            }
            _ => self.pass(0),
        }
        true
    }

    /// The driver takes its interrupt (or polls on its own): returns whether it did anything.
    fn driver_poll(&mut self) -> bool {
        self.guest.poll_begin(&self.mem);
        let (kick, took) = self.guest.poll(&self.mem);
        self.thread.kicks[0] |= kick;
        let had = self.irq || self.polling;
        self.irq = false;
        self.polling = false;
        took || kick || had
    }

    /// The host sends `n` frames of `len` payload bytes (`gso`: marked as a GSO frame).
    fn host_send(&mut self, n: u64, len: usize, gso: bool) {
        for _ in 0..n {
            if self.host_sent.len() as u64 >= MAX_FRAMES {
                return;
            }
            let seq = self.host_sent.len() as u32;
            let mut f = vec![0u8; VNET_HDR_LEN];
            if gso {
                f[0] = 1;
                f[1] = 1;
            }
            f.extend((0..len).map(|i| payload_byte(seq, i)));
            self.host_sent.push((seq, len));
            self.tap.frames.borrow_mut().push_back(f);
        }
        // Which reads of the next batch find the tap empty while frames wait: from the input.
        let late = (len as u64 ^ n.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.tap.late.set(late & late >> 7);
    }

    /// A reset and the driver's re-probe on fresh rings elsewhere.
    fn reset(&mut self) {
        self.check_old_rings();
        let (_, _, used) = self.guest.rx.addrs();
        self.w(VIRTIO_MMIO_STATUS, 0);
        assert_eq!(
            self.r(VIRTIO_MMIO_STATUS),
            0,
            "status reads 0 from the reset on"
        );
        self.old_used = Some((used, self.guest.rx.used_idx(&self.mem)));
        self.irq = false;
        self.polling = false;
        self.area += 1;
        self.guest = Guest::new(&self.mem, self.setup.guest, self.area);
        // The old rings' memory is the driver's again: it writes something else there.
        self.probe();
    }

    /// Nothing moved the used index of the rings the driver dropped at its last reset: a
    /// thread that had not caught up wrote nothing into memory the driver took back.
    fn check_old_rings(&self) {
        if let Some((used, idx)) = self.old_used {
            let now: u16 =
                vm_memory::Bytes::read_obj(&*self.mem, GuestAddress(used + 2)).unwrap_or(idx);
            assert_eq!(
                now, idx,
                "the device wrote into the rings of before the reset"
            );
        }
    }

    /// Drives both sides until nothing is pending, then checks that nothing was left.
    fn quiesce(&mut self) {
        self.setup.lag = false;
        self.follow();
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(
                steps < QUIESCE_STEPS,
                "the device and the driver keep each other busy"
            );
            if self.device_step(0) {
                continue;
            }
            if (self.irq || self.polling) && self.driver_poll() {
                continue;
            }
            // Nothing pending on either side. A driver with buffers to post posts them.
            let before = self.guest.rx.free();
            let kick = self
                .guest
                .post_rx(&self.mem, usize::from(self.guest.cfg.size));
            self.thread.kicks[0] |= kick;
            if self.guest.rx.free() != before || kick {
                continue;
            }
            break;
        }
        self.check_end();
    }

    fn check_end(&mut self) {
        assert!(
            !self.virtio.stopped(),
            "the device stopped (NEEDS_RESET) under a valid driver"
        );
        assert!(
            self.virtio.word().active(),
            "the device is not running after quiescence"
        );
        let mem = &self.mem;
        // Every chain the driver published was taken, and every used entry seen.
        assert_eq!(
            self.guest.tx.outstanding(),
            0,
            "transmit chains left without a kick or an interrupt"
        );
        assert_eq!(
            self.guest.tx_done, self.guest.sent,
            "transmit chains not given back"
        );
        if let Some(q) = self.guest.ctrl.as_ref() {
            assert_eq!(
                q.outstanding(),
                0,
                "control requests left without a kick or an interrupt"
            );
            assert_eq!(self.guest.ctrl_answered, self.guest.ctrl_sent);
        }
        assert!(
            !self.guest.rx.has_used(mem),
            "receive entries given back with no interrupt"
        );
        // Every frame the host sent is in the guest, dropped with a reason, or still at the
        // tap only when the guest has no buffer posted at all.
        let delivered = self.counters[0].packets.get();
        let dropped = self.counters[0].total_drops();
        let left = self.tap.frames.borrow().len() as u64;
        assert_eq!(
            delivered + dropped + left,
            self.host_sent.len() as u64,
            "frames unaccounted for: delivered {delivered}, dropped {dropped}, left {left}"
        );
        assert_eq!(
            left, 0,
            "frames left at the tap while the guest had buffers"
        );
        // What the guest received since the last reset is what the device delivered, in the
        // order sent, whole.
        let mut sent = self.host_sent.iter();
        for r in &self.guest.received {
            assert!(
                sent.any(|s| s == r),
                "frame {r:?} out of order or not as sent"
            );
        }
        assert!(self.sink.frames.get() <= self.counters[1].chains.get());
        self.check_old_rings();
    }
}

/// The configuration from the first three bytes.
fn setup(data: &[u8]) -> Setup {
    let (a, b, c) = (data[0], data[1], data[2]);
    let size = 1u16 << (a % 11);
    let event_idx = b & 1 != 0;
    let mergeable = b & 2 != 0;
    let ctrl = b & 4 != 0;
    let mq = ctrl && b & 8 != 0;
    let gso = b & 16 != 0;
    let lag = b & 32 != 0;
    // Small buckets, so that a few frames use them up: 1-8 frames and 2-17 KiB a millisecond.
    let bucket = |on: bool| {
        on.then(|| RateSpec {
            ops: (a & 0x40 == 0).then_some(BucketSpec {
                size: 1 + u64::from(c % 8),
                refill_ns: 1_000_000,
                burst: 0,
            }),
            bytes: Some(BucketSpec {
                size: 2048 + u64::from(c) * 64,
                refill_ns: 1_000_000,
                burst: u64::from(a & 0x80) * 16,
            }),
        })
    };
    let rate = [bucket(b & 64 != 0), bucket(b & 128 != 0)];
    let rx_buf = (u32::from(c) * 16).clamp(VNET_HDR_LEN as u32, guest::SLOT as u32);
    let rx_descs = (1 + u16::from(a >> 4) % 3).min(size);
    let mut features =
        (1u64 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MTU) | (1 << VIRTIO_NET_F_MAC);
    for (on, bit) in [
        (event_idx, VIRTIO_RING_F_EVENT_IDX),
        (mergeable, VIRTIO_NET_F_MRG_RXBUF),
        (ctrl, VIRTIO_NET_F_CTRL_VQ),
        (mq, VIRTIO_NET_F_MQ),
        (gso, VIRTIO_NET_F_GUEST_CSUM),
        (gso, VIRTIO_NET_F_GUEST_TSO4),
    ] {
        if on {
            features |= 1 << bit;
        }
    }
    Setup {
        guest: GuestConfig {
            size,
            event_idx,
            mergeable,
            rx_buf,
            rx_descs,
            // The driver's own reading of the spec (virtio 1.2, 5.1.2), not the device's.
            ctrl_at: ctrl.then_some(if mq { 2 * usize::from(PAIRS) } else { 2 }),
        },
        features,
        lag,
        rate,
    }
}

/// Runs the model on `data`: three bytes of setup, then actions.
pub fn run(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let Some(mut m) = Model::new(setup(data)) else {
        return;
    };
    let mut i = 3;
    while i < data.len() {
        let op = bytes_at(data, &mut i);
        match op % 10 {
            0 => {
                let n = usize::from(bytes_at(data, &mut i) % 32) + 1;
                let kick = m.guest.post_rx(&m.mem, n);
                m.thread.kicks[0] |= kick;
            }
            1 => {
                let n = usize::from(bytes_at(data, &mut i) % 16) + 1;
                let len = u32::from(bytes_at(data, &mut i)) * 8 + VNET_HDR_LEN as u32;
                let kick = m.guest.send(&m.mem, n, len);
                m.thread.kicks[1] |= kick;
            }
            2 => {
                let pairs = u16::from(bytes_at(data, &mut i) % 3);
                let kick = m.guest.control(&m.mem, pairs);
                m.thread.kicks[2] |= kick;
            }
            3 => {
                let n = u64::from(bytes_at(data, &mut i) % 64) + 1;
                let s = bytes_at(data, &mut i);
                // Mostly small frames; some around the MTU and past it.
                let len = match s % 4 {
                    0..=1 => 4 + usize::from(s) / 4,
                    2 => 1400 + usize::from(s),
                    _ => 1500 + 14 + usize::from(s) * 8,
                };
                m.host_send(n, len, op & 0x80 != 0);
            }
            4 => {
                let pick = bytes_at(data, &mut i);
                m.device_step(pick);
            }
            5 => {
                let pick = bytes_at(data, &mut i);
                for _ in 0..=(pick % 8) {
                    if !m.device_step(pick) {
                        break;
                    }
                }
            }
            6 => {
                if op & 0x40 != 0 && !m.polling {
                    // The driver starts a poll and leaves interrupts off while the device runs.
                    m.guest.poll_begin(&m.mem);
                    m.polling = true;
                } else if m.irq || m.polling || op & 0x80 != 0 {
                    m.driver_poll();
                }
            }
            7 => m.reset(),
            8 => m.follow(),
            _ => while m.device_step(0) {},
        }
    }
    m.quiesce();
}

#[cfg(test)]
mod tests;

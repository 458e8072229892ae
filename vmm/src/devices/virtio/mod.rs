//! Virtio devices (virtio 1.x, modern only) over the MMIO transport: the state a transport
//! shares with its device's threads, and the trait a device implements.
//!
//! Data flow: the VM builder makes a [`VirtioShared`] for each device (its queues' registers,
//! the state word, interrupt status, the interrupt line, one wake eventfd per device thread),
//! builds the device on it (e.g. `net`, which starts one thread per queue pair) and puts an
//! [`mmio::MmioTransport`] over both on the MMIO bus. A guest driver then talks to the
//! transport from its vCPUs (register reads and writes: exits), all through atomics: no lock a
//! device thread takes. The status register, the epoch the threads follow and whether the
//! device is active share one atomic word ([`state`]). A reset reads 0 at once and begins a new
//! inactive epoch; every device thread drops its queues (checking the epoch per chain, so a
//! batch in progress is abandoned) and says which epoch it serves. At DRIVER_OK the transport
//! checks the queues; the new active epoch begins at once when every thread has let go of the
//! old queues, otherwise the status reads DRIVER_OK and the activation completes when the last
//! thread catches up. Each thread then builds its queues from the registers and serves them
//! with one notification discipline ([`queue::DeviceQueue`]). Queue kicks reach the device
//! threads through ioeventfds (no userspace exit) or, where the hypervisor does not honour an
//! MMIO ioeventfd, through the transport's `QueueNotify` handler, which signals the same
//! eventfd. Device threads raise interrupts through [`VirtioShared::signal_used`] (irqfd).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::hypervisor::IrqLine;

pub mod chain;
pub mod counters;
pub mod mmio;
pub mod pass;
pub mod queue;
pub mod state;
pub mod stats;
pub mod status;
pub mod thread;

use state::Word;
use status::Violation;

/// Number of [`Violation`] kinds (the size of the per-device counters).
pub const VIOLATIONS: usize = 9;

/// One queue's registers, as the driver wrote them through the transport.
#[derive(Debug, Default)]
pub struct QueueRegs {
    size: AtomicU32,
    ready: AtomicBool,
    desc: AtomicU64,
    avail: AtomicU64,
    used: AtomicU64,
}

/// Which 32-bit half of a 64-bit queue address a write sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// Bits 0..32.
    Low,
    /// Bits 32..64.
    High,
}

/// Which ring address a write sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// The descriptor table.
    Desc,
    /// The driver (available) ring.
    Avail,
    /// The device (used) ring.
    Used,
}

impl QueueRegs {
    fn addr(&self, ring: Ring) -> &AtomicU64 {
        match ring {
            Ring::Desc => &self.desc,
            Ring::Avail => &self.avail,
            Ring::Used => &self.used,
        }
    }

    /// Sets one half of a ring address.
    pub fn set_addr(&self, ring: Ring, half: Half, value: u32) {
        let a = self.addr(ring);
        let old = a.load(Ordering::Relaxed);
        let new = match half {
            Half::Low => (old & !0xffff_ffff) | u64::from(value),
            Half::High => (old & 0xffff_ffff) | (u64::from(value) << 32),
        };
        a.store(new, Ordering::Relaxed);
    }

    /// One half of a ring address.
    pub fn get_addr(&self, ring: Ring, half: Half) -> u32 {
        let v = self.addr(ring).load(Ordering::Relaxed);
        match half {
            Half::Low => v as u32,
            Half::High => (v >> 32) as u32,
        }
    }

    /// Sets the queue size the driver chose.
    pub fn set_size(&self, size: u32) {
        self.size.store(size, Ordering::Relaxed);
    }

    /// The queue size the driver chose.
    pub fn size(&self) -> u32 {
        self.size.load(Ordering::Relaxed)
    }

    /// Sets whether the driver enabled the queue.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the driver enabled the queue.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn clear(&self, max_size: u16) {
        self.size.store(u32::from(max_size), Ordering::Relaxed);
        self.ready.store(false, Ordering::Relaxed);
        for r in [&self.desc, &self.avail, &self.used] {
            r.store(0, Ordering::Relaxed);
        }
    }

    /// A `virtio_queue::Queue` over these registers, checked against `mem` (sizes, alignment,
    /// rings inside guest memory), or None when the driver did not enable it or set it up
    /// wrongly (`Err`).
    pub fn to_queue(
        &self,
        max_size: u16,
        event_idx: bool,
        mem: &GuestMemoryMmap,
    ) -> Result<Option<Queue>, Violation> {
        if !self.ready() {
            return Ok(None);
        }
        let size = u16::try_from(self.size()).map_err(|_| Violation::BadQueue)?;
        let mut q = Queue::new(max_size).map_err(|_| Violation::BadQueue)?;
        q.try_set_size(size).map_err(|_| Violation::BadQueue)?;
        q.try_set_desc_table_address(GuestAddress(self.desc.load(Ordering::Relaxed)))
            .map_err(|_| Violation::BadQueue)?;
        q.try_set_avail_ring_address(GuestAddress(self.avail.load(Ordering::Relaxed)))
            .map_err(|_| Violation::BadQueue)?;
        q.try_set_used_ring_address(GuestAddress(self.used.load(Ordering::Relaxed)))
            .map_err(|_| Violation::BadQueue)?;
        q.set_event_idx(event_idx);
        q.set_ready(true);
        if !q.is_valid(mem) {
            return Err(Violation::BadQueue);
        }
        Ok(Some(q))
    }
}

/// Counters of one device's driver: single-purpose atomics that vCPU threads (register
/// accesses) and device threads (interrupts) add to. Not on any hot path: a few per driver
/// initialisation, one per interrupt.
#[derive(Debug, Default)]
pub struct DriverCounters {
    /// Violations by kind ([`Violation`] order), as seen.
    pub violations: [AtomicU64; VIOLATIONS],
    /// Kinds already logged (once each).
    logged: [AtomicBool; VIOLATIONS],
    /// Resets the driver asked for (status 0 written).
    pub resets: AtomicU64,
    /// Resets whose write returned to the guest before every device thread had let go of its
    /// queues (the write waits 20 ms at most; the reset completes when they do).
    pub resets_unsettled: AtomicU64,
    /// Activations (DRIVER_OK accepted).
    pub activations: AtomicU64,
    /// Queue kicks that reached the VMM as a userspace exit (no ioeventfd for them).
    pub notify_exits: AtomicU64,
    /// Configuration-change interrupts raised (NEEDS_RESET).
    pub config_interrupts: AtomicU64,
}

fn violation_index(v: Violation) -> usize {
    match v {
        Violation::ClearedBit => 0,
        Violation::OutOfOrder => 1,
        Violation::ReservedBit => 2,
        Violation::NoVersion1 => 3,
        Violation::UnofferedFeatures => 4,
        Violation::BadQueue => 5,
        Violation::LateWrite => 6,
        Violation::BadChain => 7,
        Violation::AvailIndex => 8,
    }
}

/// Every violation kind, in counter order.
pub const ALL_VIOLATIONS: [Violation; VIOLATIONS] = [
    Violation::ClearedBit,
    Violation::OutOfOrder,
    Violation::ReservedBit,
    Violation::NoVersion1,
    Violation::UnofferedFeatures,
    Violation::BadQueue,
    Violation::LateWrite,
    Violation::BadChain,
    Violation::AvailIndex,
];

/// What a transport and its device's threads share.
#[derive(Debug)]
pub struct VirtioShared {
    /// The device's name (`net0`), for logs and reports.
    pub name: String,
    /// Status register, epoch, active and pending activation: one word ([`state`]).
    state: AtomicU64,
    interrupt_status: AtomicU32,
    driver_features: AtomicU64,
    /// The last violation that set NEEDS_RESET or refused the features, as index + 1 (0: none).
    last_violation: AtomicU32,
    queues: Box<[QueueRegs]>,
    max_sizes: Box<[u16]>,
    /// The epoch each device thread serves (has let go of every older epoch's queues).
    served: Box<[AtomicU32]>,
    /// Each device thread's wake eventfd (epoch changes, stop, work it re-queued).
    wakes: Box<[EventFd]>,
    /// Whether the device's threads were started (before that, nobody holds a queue).
    started: AtomicBool,
    irq: Option<Arc<IrqLine>>,
    /// The driver's counters.
    pub counters: DriverCounters,
}

/// The device's health as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Working, or waiting for a driver.
    Ok,
    /// The device met an error (a bad descriptor chain, a rule the driver broke) and stops
    /// until the driver resets it.
    NeedsReset,
    /// The driver gave up on it (FAILED), e.g. after the device refused its features.
    Failed,
}

impl VirtioShared {
    /// State for a device called `name` with queues of `max_sizes`, served by `threads`
    /// device threads, raising interrupts on `irq` (None: the guest polls, as the tiny guest
    /// does).
    pub fn new(
        name: String,
        max_sizes: &[u16],
        threads: usize,
        irq: Option<Arc<IrqLine>>,
    ) -> std::io::Result<Self> {
        let queues: Box<[QueueRegs]> = max_sizes.iter().map(|_| QueueRegs::default()).collect();
        let wakes = (0..threads)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<std::io::Result<Box<[EventFd]>>>()?;
        let shared = VirtioShared {
            name,
            state: AtomicU64::new(0),
            interrupt_status: AtomicU32::new(0),
            driver_features: AtomicU64::new(0),
            last_violation: AtomicU32::new(0),
            queues,
            max_sizes: max_sizes.into(),
            served: (0..threads).map(|_| AtomicU32::new(0)).collect(),
            wakes,
            started: AtomicBool::new(false),
            irq,
            counters: DriverCounters::default(),
        };
        shared.clear_queues();
        Ok(shared)
    }

    fn clear_queues(&self) {
        for (q, max) in self.queues.iter().zip(self.max_sizes.iter()) {
            q.clear(*max);
        }
    }

    /// The state word now.
    pub fn word(&self) -> Word {
        Word(self.state.load(Ordering::Acquire))
    }

    /// Applies `f` to the state word until it sticks (compare-and-swap); `f` returning None
    /// changes nothing. Returns the word replaced and the new one.
    pub(crate) fn update(&self, mut f: impl FnMut(Word) -> Option<Word>) -> Option<(Word, Word)> {
        let mut cur = self.word();
        loop {
            let new = f(cur)?;
            match self.state.compare_exchange_weak(
                cur.0,
                new.0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some((cur, new)),
                Err(seen) => cur = Word(seen),
            }
        }
    }

    /// The status register.
    pub fn status(&self) -> u32 {
        self.word().status()
    }

    /// The features the driver acknowledged.
    pub fn driver_features(&self) -> u64 {
        self.driver_features.load(Ordering::Acquire)
    }

    /// Whether the driver acknowledged feature bit `bit`.
    pub fn has_feature(&self, bit: u32) -> bool {
        bit < 64 && self.driver_features() & (1u64 << bit) != 0
    }

    pub(crate) fn driver_features_atomic(&self) -> &AtomicU64 {
        &self.driver_features
    }

    /// The interrupt status register.
    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status.load(Ordering::Acquire)
    }

    pub(crate) fn ack_interrupt(&self, bits: u32) {
        self.interrupt_status.fetch_and(!bits, Ordering::AcqRel);
    }

    /// Queue `i`'s registers, if the device has that queue.
    pub fn queue(&self, i: usize) -> Option<&QueueRegs> {
        self.queues.get(i)
    }

    /// Queue `i`'s largest size, if the device has that queue.
    pub fn max_size(&self, i: usize) -> Option<u16> {
        self.max_sizes.get(i).copied()
    }

    /// Number of queues.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// The current epoch (bumped at each activation and reset) and whether the device is
    /// active in it. Device threads compare it with the epoch they serve.
    pub fn epoch(&self) -> (u64, bool) {
        let w = self.word();
        (u64::from(w.epoch()), w.active())
    }

    /// Whether a thread that built its queues in `epoch` may go on with them: checked per
    /// chain, so that a reset or NEEDS_RESET ends a batch at once.
    #[inline]
    pub fn serves(&self, epoch: u32) -> bool {
        self.word().serves(epoch)
    }

    /// Device thread `thread`'s wake eventfd.
    pub fn wake_fd(&self, thread: usize) -> Option<&EventFd> {
        self.wakes.get(thread)
    }

    /// Wakes every device thread (to follow a new epoch, or to stop).
    pub fn wake_all(&self) {
        for w in self.wakes.iter() {
            let _ = w.write(1);
        }
    }

    /// Says the device's threads run from now on (until then nobody holds a queue).
    pub fn threads_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// Whether every device thread has let go of the queues of every epoch before `epoch`.
    pub fn caught_up(&self, epoch: u32) -> bool {
        !self.started.load(Ordering::Acquire)
            || self
                .served
                .iter()
                .all(|s| s.load(Ordering::Acquire) == epoch)
    }

    /// Device thread `thread` now serves `epoch` (it dropped every older queue); completes an
    /// activation that waited for it.
    pub fn thread_serves(&self, thread: usize, epoch: u32) {
        if let Some(s) = self.served.get(thread) {
            s.store(epoch, Ordering::Release);
        }
        self.complete_activation();
    }

    /// Completes a pending activation once every thread has caught up (from the transport's
    /// next register access or from the last thread to let go, whichever comes first).
    /// Returns whether this call completed it.
    pub fn complete_activation(&self) -> bool {
        let done = self
            .update(|w| {
                if w.pending() && self.caught_up(w.epoch()) {
                    w.complete()
                } else {
                    None
                }
            })
            .is_some();
        if done {
            self.counters.activations.fetch_add(1, Ordering::Relaxed);
            self.wake_all();
        }
        done
    }

    pub(crate) fn reset_registers(&self) {
        self.driver_features.store(0, Ordering::Release);
        self.interrupt_status.store(0, Ordering::Release);
        self.last_violation.store(0, Ordering::Release);
        self.clear_queues();
    }

    /// Counts `v`, logs it the first time, and remembers it as the last one.
    pub fn record_violation(&self, v: Violation) {
        let i = violation_index(v);
        self.counters.violations[i].fetch_add(1, Ordering::Relaxed);
        self.last_violation.store(i as u32 + 1, Ordering::Release);
        if !self.counters.logged[i].swap(true, Ordering::Relaxed) {
            log::warn!("{}: {} (logged once)", self.name, v.describe());
        }
    }

    /// The last violation that stopped or refused the device since the last reset.
    pub fn last_violation(&self) -> Option<Violation> {
        match self.last_violation.load(Ordering::Acquire) {
            0 => None,
            n => ALL_VIOLATIONS.get(n as usize - 1).copied(),
        }
    }

    /// The device's health now.
    pub fn health(&self) -> Health {
        let s = self.status();
        if s & status::NEEDS_RESET != 0 {
            Health::NeedsReset
        } else if s & status::FAILED != 0 {
            Health::Failed
        } else {
            Health::Ok
        }
    }

    /// Sets NEEDS_RESET for `why`, in the current epoch (the transport's own findings).
    pub fn needs_reset(&self, why: Violation) {
        self.needs_reset_in(self.word().epoch(), why);
    }

    /// Sets NEEDS_RESET for `why`, found by a thread serving `epoch`, and tells the driver with
    /// a configuration-change interrupt once it runs. Nothing is set when `epoch` has ended (a
    /// reset came first: the finding is about queues the driver has dropped). The device's
    /// threads stop serving their queues until the driver resets the device.
    pub fn needs_reset_in(&self, epoch: u32, why: Violation) {
        self.record_violation(why);
        if let Some((_, new)) = self.update(|w| w.needs_reset(epoch)) {
            if new.tells_driver() {
                self.interrupt_status
                    .fetch_or(VIRTIO_MMIO_INT_CONFIG, Ordering::AcqRel);
                self.counters
                    .config_interrupts
                    .fetch_add(1, Ordering::Relaxed);
                self.trigger();
            }
        }
    }

    /// Whether the device is stopped until a reset.
    pub fn stopped(&self) -> bool {
        self.status() & status::NEEDS_RESET != 0
    }

    /// Raises the used-buffer interrupt. Returns whether an interrupt line carried it (false:
    /// the guest polls).
    pub fn signal_used(&self) -> bool {
        self.interrupt_status
            .fetch_or(VIRTIO_MMIO_INT_VRING, Ordering::AcqRel);
        self.trigger()
    }

    fn trigger(&self) -> bool {
        match &self.irq {
            Some(line) => {
                if let Err(e) = line.trigger() {
                    log::warn!("{}: cannot raise its interrupt: {e}", self.name);
                }
                true
            }
            None => false,
        }
    }

    /// Whether the device has an interrupt line.
    pub fn has_irq(&self) -> bool {
        self.irq.is_some()
    }

    /// The interrupt line's GSI, if it has one.
    pub fn gsi(&self) -> Option<u32> {
        self.irq.as_ref().map(|l| l.gsi())
    }
}

/// A virtio device behind an MMIO transport. Calls come from vCPU threads (the transport's
/// register accesses); none may block or take a lock a device thread holds.
pub trait VirtioDevice: Send + Sync {
    /// The virtio device id (1 = network).
    fn device_type(&self) -> u32;
    /// The features the device offers (VIRTIO_F_VERSION_1 always).
    fn features(&self) -> u64;
    /// Reads the device-specific configuration space at `offset`; bytes past its end read 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver reset the device: what the device's threads read at their next activation
    /// returns to its reset state (e.g. the queue pairs in use). Called before the new epoch
    /// begins; a device thread may still be finishing a chain of the old one.
    fn on_reset(&self) {}
    /// The eventfd that queue `queue`'s kicks signal, if the device has that queue.
    fn kick_fd(&self, queue: usize) -> Option<&EventFd>;
}

/// Reads a kick eventfd: the number of kicks since the last read.
pub fn kicks(fd: &EventFd) -> u64 {
    fd.read().unwrap_or(0)
}

/// `n` non-blocking eventfds (a device's kicks).
pub fn eventfds(n: usize) -> std::io::Result<Vec<EventFd>> {
    (0..n).map(|_| EventFd::new(EFD_NONBLOCK)).collect()
}

/// Copies the configuration space `config` from `offset` into `data`; bytes past its end
/// read 0 (what [`VirtioDevice::read_config`] answers).
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o))
            .copied()
            .unwrap_or(0);
    }
}

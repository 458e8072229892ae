//! The transport driven as a guest driver drives it, register by register, against a device
//! that records what it is told.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::devices::virtio::Health;

/// A device with two queues of 16 and one device thread, which the test plays: it follows
/// the epoch when told (`thread_serves`), or lags.
struct Probe {
    kicks: Vec<EventFd>,
    resets: AtomicUsize,
}

impl VirtioDevice for Probe {
    fn device_type(&self) -> u32 {
        1
    }
    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | 0b10_0000
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = (offset as u8).wrapping_add(i as u8);
        }
    }
    fn on_reset(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
    fn kick_fd(&self, queue: usize) -> Option<&EventFd> {
        self.kicks.get(queue)
    }
}

struct Rig {
    t: MmioTransport,
    dev: Arc<Probe>,
    shared: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    /// The device thread lets go of old epochs only while this is false.
    lag: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const BASE: u64 = 0xC000_0000;

impl Rig {
    fn new() -> Rig {
        let mem =
            Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap());
        let shared = Arc::new(VirtioShared::new("probe0".into(), &[16, 16], 1, None).unwrap());
        shared.threads_started();
        let dev = Arc::new(Probe {
            kicks: (0..2)
                .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
                .collect(),
            resets: AtomicUsize::new(0),
        });
        let t = MmioTransport::new(
            BASE,
            Arc::clone(&dev) as Arc<dyn VirtioDevice>,
            Arc::clone(&shared),
            Arc::clone(&mem),
        );
        let (lag, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        // The device's one thread: it follows each epoch as it is woken, unless told to lag.
        let thread = {
            let (shared, lag, stop) = (Arc::clone(&shared), Arc::clone(&lag), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if !lag.load(Ordering::Relaxed) {
                        let _ = shared.wake_fd(0).unwrap().read();
                        shared.thread_serves(0, shared.word().epoch());
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            })
        };
        Rig {
            t,
            dev,
            shared,
            mem,
            lag,
            stop,
            thread: Some(thread),
        }
    }

    fn r(&self, off: u32) -> u32 {
        let mut b = [0u8; 4];
        self.t.read(access(off), &mut b);
        u32::from_le_bytes(b)
    }

    fn w(&self, off: u32, v: u32) {
        self.t.write(access(off), &v.to_le_bytes());
    }

    /// Sets up queue `i` on rings made by a mock queue at `at`.
    fn queue(&self, i: u32, at: u64) {
        let vq = MockSplitQueue::create(self.mem.as_ref(), GuestAddress(at), 16);
        self.w(VIRTIO_MMIO_QUEUE_SEL, i);
        self.w(VIRTIO_MMIO_QUEUE_NUM, 16);
        for (lo, hi, a) in [
            (
                VIRTIO_MMIO_QUEUE_DESC_LOW,
                VIRTIO_MMIO_QUEUE_DESC_HIGH,
                vq.desc_table_addr(),
            ),
            (
                VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
                vq.avail_addr(),
            ),
            (
                VIRTIO_MMIO_QUEUE_USED_LOW,
                VIRTIO_MMIO_QUEUE_USED_HIGH,
                vq.used_addr(),
            ),
        ] {
            self.w(lo, a.0 as u32);
            self.w(hi, (a.0 >> 32) as u32);
        }
        self.w(VIRTIO_MMIO_QUEUE_READY, 1);
    }

    /// The driver's sequence up to FEATURES_OK with `features`; returns the status read back.
    fn negotiate(&self, features: u64) -> u32 {
        self.w(VIRTIO_MMIO_STATUS, 0);
        self.negotiate_without_reset(features)
    }

    /// [`Rig::negotiate`] after a reset the driver already made.
    fn negotiate_without_reset(&self, features: u64) -> u32 {
        self.w(VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE);
        self.w(VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        for sel in 0..2 {
            self.w(VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
            self.w(VIRTIO_MMIO_DRIVER_FEATURES, (features >> (32 * sel)) as u32);
        }
        self.w(
            VIRTIO_MMIO_STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
        self.r(VIRTIO_MMIO_STATUS)
    }
}

fn access(off: u32) -> BusAccess {
    BusAccess {
        vcpu: 0,
        addr: BASE + u64::from(off),
        offset: u64::from(off),
    }
}

const V1: u64 = 1 << VIRTIO_F_VERSION_1;
const READY: u32 = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;

#[test]
fn identification_and_features_read_as_virtio_mmio_version_2() {
    let rig = Rig::new();
    assert_eq!(rig.r(VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
    assert_eq!(rig.r(VIRTIO_MMIO_VERSION), 2);
    assert_eq!(rig.r(VIRTIO_MMIO_DEVICE_ID), 1);
    assert_eq!(rig.r(VIRTIO_MMIO_VENDOR_ID), VENDOR_ID);
    rig.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    assert_eq!(rig.r(VIRTIO_MMIO_DEVICE_FEATURES), 0b10_0000);
    rig.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(rig.r(VIRTIO_MMIO_DEVICE_FEATURES), 1, "VERSION_1 is bit 32");
    rig.w(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
    assert_eq!(rig.r(VIRTIO_MMIO_DEVICE_FEATURES), 0);
    rig.w(VIRTIO_MMIO_QUEUE_SEL, 1);
    assert_eq!(rig.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
    rig.w(VIRTIO_MMIO_QUEUE_SEL, 2);
    assert_eq!(rig.r(VIRTIO_MMIO_QUEUE_NUM_MAX), 0, "no such queue");
    // Configuration space goes to the device; unaligned register reads are zeros.
    let mut b = [0u8; 2];
    rig.t.read(access(0x104), &mut b);
    assert_eq!(b, [4, 5]);
    let mut b = [0xffu8; 2];
    rig.t.read(access(0x2), &mut b);
    assert_eq!(b, [0, 0]);
}

#[test]
fn a_driver_that_follows_the_rules_activates_the_device_once() {
    let rig = Rig::new();
    assert_eq!(rig.negotiate(V1 | 0b10_0000), READY);
    assert_eq!(rig.shared.driver_features(), V1 | 0b10_0000);
    rig.queue(0, 0x1_0000);
    rig.queue(1, 0x2_0000);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    assert_eq!(rig.r(VIRTIO_MMIO_STATUS), READY | status::DRIVER_OK);
    assert_eq!(rig.shared.epoch(), (2, true), "reset, then activation");
    assert_eq!(rig.shared.counters.activations.load(Ordering::Relaxed), 1);
    assert_eq!(rig.shared.health(), Health::Ok);
    // Queue registers are frozen now: a late write is ignored and counted.
    rig.w(VIRTIO_MMIO_QUEUE_SEL, 0);
    rig.w(VIRTIO_MMIO_QUEUE_NUM, 4);
    assert_eq!(rig.r(VIRTIO_MMIO_QUEUE_NUM), 16);
    assert_eq!(
        rig.shared.counters.violations[6].load(Ordering::Relaxed),
        1,
        "late_write"
    );
}

#[test]
fn a_legacy_driver_is_refused_and_the_device_reports_failed() {
    let rig = Rig::new();
    // Without VERSION_1: FEATURES_OK does not stick.
    assert_eq!(
        rig.negotiate(0b10_0000),
        status::ACKNOWLEDGE | status::DRIVER
    );
    assert_eq!(rig.shared.last_violation(), Some(Violation::NoVersion1));
    // The driver gives up.
    rig.w(
        VIRTIO_MMIO_STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FAILED,
    );
    assert_eq!(rig.shared.health(), Health::Failed);
    // Features the device never offered are refused too.
    assert_eq!(
        rig.negotiate(V1 | 1 << 40),
        status::ACKNOWLEDGE | status::DRIVER
    );
    assert_eq!(
        rig.shared.last_violation(),
        Some(Violation::UnofferedFeatures)
    );
}

#[test]
fn a_queue_outside_guest_memory_at_driver_ok_needs_a_reset() {
    let rig = Rig::new();
    rig.negotiate(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_QUEUE_SEL, 1);
    rig.w(VIRTIO_MMIO_QUEUE_NUM, 16);
    rig.w(VIRTIO_MMIO_QUEUE_USED_LOW, 0xfff0_0000);
    rig.w(VIRTIO_MMIO_QUEUE_READY, 1);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    let st = rig.r(VIRTIO_MMIO_STATUS);
    assert_ne!(st & status::NEEDS_RESET, 0, "{st:#x}");
    assert_eq!(st & status::DRIVER_OK, 0, "not activated");
    assert_eq!(rig.shared.epoch(), (1, false), "only the reset");
    assert_eq!(rig.shared.health(), Health::NeedsReset);
    assert_eq!(rig.shared.last_violation(), Some(Violation::BadQueue));
    // A size that is not a power of two is refused the same way.
    rig.negotiate(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_QUEUE_NUM, 12);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    assert_ne!(rig.r(VIRTIO_MMIO_STATUS) & status::NEEDS_RESET, 0);
    // A reset clears it all.
    rig.w(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(rig.r(VIRTIO_MMIO_STATUS), 0);
    assert_eq!(rig.shared.health(), Health::Ok);
    assert_eq!(rig.shared.last_violation(), None);
}

#[test]
fn a_reset_reads_zero_at_once_and_takes_the_re_probe_while_a_thread_still_lets_go() {
    let rig = Rig::new();
    rig.negotiate(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    assert_eq!(rig.shared.epoch(), (2, true));
    // The device's thread is slow to let go (a batch in progress): the reset still reads 0
    // at once, and the driver's writes of the re-probe are taken.
    rig.lag.store(true, Ordering::Relaxed);
    rig.w(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(
        rig.r(VIRTIO_MMIO_STATUS),
        0,
        "status reads 0 from the reset write on"
    );
    assert_eq!(rig.shared.epoch(), (3, false));
    assert_eq!(
        rig.dev.resets.load(Ordering::Relaxed),
        2,
        "the device heard of it"
    );
    assert_eq!(
        rig.shared.counters.resets_unsettled.load(Ordering::Relaxed),
        1,
        "the write returned before the thread let go, and says so"
    );
    assert_eq!(rig.negotiate_without_reset(V1 | 0b10_0000), READY);
    rig.queue(0, 0x3_0000);
    rig.w(VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(
        rig.r(VIRTIO_MMIO_QUEUE_READY),
        1,
        "the re-probe's queue writes were taken"
    );
    assert_eq!(
        rig.r(VIRTIO_MMIO_QUEUE_DESC_LOW),
        0x3_0000,
        "the new ring, not the old one"
    );
    // DRIVER_OK reads back, and the activation waits for the thread.
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    assert_eq!(rig.r(VIRTIO_MMIO_STATUS), READY | status::DRIVER_OK);
    assert_eq!(
        rig.shared.epoch(),
        (3, false),
        "not active while a thread holds old queues"
    );
    assert!(rig.shared.word().pending());
    assert_eq!(
        rig.shared.counters.violations[6].load(Ordering::Relaxed),
        0,
        "no late write"
    );
    // The thread lets go: the activation completes (from the thread's side here).
    rig.lag.store(false, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rig.shared.epoch() != (4, true) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(rig.shared.epoch(), (4, true));
    assert_eq!(rig.shared.counters.activations.load(Ordering::Relaxed), 2);
    assert_eq!(rig.shared.driver_features(), V1 | 0b10_0000);
}

#[test]
fn a_thread_that_finds_a_broken_chain_after_a_reset_does_not_stop_the_re_probed_device() {
    let rig = Rig::new();
    rig.negotiate(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    let old = rig.shared.word().epoch();
    rig.w(VIRTIO_MMIO_STATUS, 0);
    // A thread still finishing a chain of the old epoch finds it broken: too late to matter.
    rig.shared.needs_reset_in(old, Violation::BadChain);
    assert_eq!(rig.r(VIRTIO_MMIO_STATUS), 0);
    assert_eq!(rig.shared.health(), Health::Ok);
    // In its own epoch the same finding stops the device, and a later status write of the
    // driver (computed before it) does not erase it.
    rig.negotiate_without_reset(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    rig.shared
        .needs_reset_in(rig.shared.word().epoch(), Violation::BadChain);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    assert_ne!(rig.r(VIRTIO_MMIO_STATUS) & status::NEEDS_RESET, 0);
    assert_eq!(rig.shared.health(), Health::NeedsReset);
}

#[test]
fn out_of_order_status_sets_needs_reset_and_raises_a_config_interrupt_once_running() {
    let rig = Rig::new();
    rig.w(VIRTIO_MMIO_STATUS, status::DRIVER);
    assert_ne!(rig.r(VIRTIO_MMIO_STATUS) & status::NEEDS_RESET, 0);
    assert_eq!(rig.shared.last_violation(), Some(Violation::OutOfOrder));
    // No interrupt before DRIVER_OK.
    assert_eq!(rig.r(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    rig.negotiate(V1);
    rig.queue(0, 0x1_0000);
    rig.w(VIRTIO_MMIO_STATUS, READY | status::DRIVER_OK);
    // A running device that a device thread finds broken: config interrupt.
    rig.shared.needs_reset(Violation::BadQueue);
    assert_eq!(rig.r(VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
    rig.shared.needs_reset(Violation::BadQueue);
    assert_eq!(
        rig.shared
            .counters
            .config_interrupts
            .load(Ordering::Relaxed),
        1,
        "once"
    );
    rig.w(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_CONFIG);
    assert_eq!(rig.r(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
}

#[test]
fn a_kick_that_exits_signals_the_queue_eventfd_and_is_counted() {
    let rig = Rig::new();
    rig.w(VIRTIO_MMIO_QUEUE_NOTIFY, 1);
    rig.w(VIRTIO_MMIO_QUEUE_NOTIFY, 1);
    rig.w(VIRTIO_MMIO_QUEUE_NOTIFY, 9);
    assert_eq!(rig.dev.kicks[1].read().unwrap(), 2);
    assert!(rig.dev.kicks[0].read().is_err(), "nothing for queue 0");
    assert_eq!(rig.shared.counters.notify_exits.load(Ordering::Relaxed), 3);
    // One ioeventfd per queue, a 32-bit match of its index at QueueNotify.
    let ev = rig.t.ioevents();
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[1].addr, IoAddr::Mmio(BASE + 0x50));
    assert_eq!(ev[1].datamatch, Some(1));
}

//! virtio-net on a tap (spec section 10, docs/design.md "Devices"): queue pairs each served
//! by a thread of their own, every frame, chain, drop, kick and interrupt counted, and each
//! thread's time accounted as exactly as a vCPU's.
//!
//! Data flow: the VM builder makes a [`NetDevice`] from a [`spec::NetSpec`]: it opens the
//! tap (one queue per pair), makes a kick eventfd per virtqueue (registered as ioeventfds at
//! the transport's QueueNotify) and a wake eventfd per thread, and shares a
//! [`crate::devices::virtio::VirtioShared`] with its MMIO transport. `Vm::run` starts one
//! thread per queue pair ([`worker`], named `net0-qp0`, …) before the vCPUs and stops them
//! after. Readers (`stats`, the report, metrics) take [`NetDevice::stats`]: the threads' own
//! meters and queue counters, single-writer atomics they read without a lock.
//!
//! Queues: rx0 = 0, tx0 = 1, rx1 = 2, tx1 = 3, …, and with several pairs the control queue
//! last. The configuration space (read-only) is the MAC, the link status (up), the pairs and
//! the MTU.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ppa_vmm_api::{
    DeviceCpu, DeviceHealth, DeviceKind, DeviceStats, DeviceThreadInfo, DeviceThreadStats,
    DriverStats, PerPacket, QueueKind,
};
use thiserror::Error;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::*;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::virtio::{Health, VirtioDevice, VirtioShared, ALL_VIOLATIONS};
use crate::accounting::worker::WorkerMeter;
use crate::accounting::AccountingControl;
use crate::hypervisor::IrqLine;

pub mod ctrl;
pub mod queues;
pub mod rx;
pub mod spec;
pub mod tap;
pub mod tx;
pub mod worker;

use queues::QueueCounters;
use spec::{Mac, NetSpec};
use tap::Tap;

/// Size of every queue.
pub const QUEUE_SIZE: u16 = 256;
/// virtio device id of a network card.
pub const DEVICE_ID: u32 = 1;

/// Why a network device could not be made.
#[derive(Debug, Error)]
pub enum NetError {
    /// The tap could not be opened.
    #[error("{id}: cannot use its tap")]
    Tap {
        /// Device id.
        id: String,
        /// Cause.
        #[source]
        source: tap::TapError,
    },
    /// More queue pairs than vCPUs.
    #[error(
        "{id}: {queues} queue pairs for {vcpus} vCPUs; a device takes at most one pair per vCPU"
    )]
    TooManyQueues {
        /// Device id.
        id: String,
        /// Queue pairs asked.
        queues: u16,
        /// vCPUs of the VM.
        vcpus: usize,
    },
    /// An eventfd could not be made.
    #[error("{id}: cannot make its eventfds")]
    EventFd {
        /// Device id.
        id: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// What a network device's threads and readers share.
#[derive(Debug)]
pub struct NetShared {
    /// Device id (`net0`).
    pub id: String,
    /// The guest's MAC address.
    pub mac: Mac,
    /// MTU offered.
    pub mtu: u16,
    /// Queue pairs.
    pub pairs: u16,
    /// Whether it has a control queue (with more than one pair).
    pub ctrl: bool,
    /// Features offered.
    pub features: u64,
    /// One tap queue per pair.
    pub taps: Vec<Tap>,
    /// One kick eventfd per virtqueue.
    pub kicks: Vec<EventFd>,
    /// One wake eventfd per thread (epoch changes, stop).
    pub wakes: Vec<EventFd>,
    /// The epoch each thread serves.
    pub served: Vec<AtomicU64>,
    /// Each thread's meter.
    pub meters: Vec<WorkerMeter>,
    /// Each virtqueue's counters.
    pub queues: Vec<QueueCounters>,
    /// Queue pairs the driver uses now.
    pub active_pairs: AtomicU16,
    /// Set to stop the threads.
    pub stop: AtomicBool,
    /// Whether the threads were started.
    pub started: AtomicBool,
    /// Whether the tap existed before the VMM opened it (false: the VMM created it).
    pub tap_existed: bool,
}

/// The features a device of `pairs` queue pairs offers.
pub fn offered_features(pairs: u16) -> u64 {
    let mut f = [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_NET_F_MAC,
        VIRTIO_NET_F_STATUS,
        VIRTIO_NET_F_MTU,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_MRG_RXBUF,
    ]
    .iter()
    .fold(0u64, |acc, b| acc | (1u64 << b));
    if pairs > 1 {
        f |= (1 << VIRTIO_NET_F_MQ) | (1 << VIRTIO_NET_F_CTRL_VQ);
    }
    f
}

/// The configuration space (`struct virtio_net_config`): MAC, status (link up), max queue
/// pairs, MTU.
pub fn config_space(mac: Mac, pairs: u16, mtu: u16) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[..6].copy_from_slice(&mac.0);
    c[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
    c[8..10].copy_from_slice(&pairs.to_le_bytes());
    c[10..12].copy_from_slice(&mtu.to_le_bytes());
    c
}

/// A virtio-net device.
pub struct NetDevice {
    net: Arc<NetShared>,
    virtio: Arc<VirtioShared>,
    mem: Arc<GuestMemoryMmap>,
    config: [u8; 12],
    mmio_base: u64,
    tap_name: String,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The figures at the last reset, which readers subtract (taken only by readers and
    /// `reset`: the device threads never touch it).
    baseline: Mutex<Option<DeviceStats>>,
}

/// What a network device is made from.
pub struct NetParams<'a> {
    /// Its configuration.
    pub spec: &'a NetSpec,
    /// Its id.
    pub id: String,
    /// Its place among the VM's network devices (for the default MAC).
    pub index: usize,
    /// vCPUs of the VM (the most queue pairs).
    pub vcpus: usize,
    /// Its interrupt line, when the guest has an interrupt controller.
    pub irq: Option<Arc<IrqLine>>,
    /// Guest RAM.
    pub memory: Arc<GuestMemoryMmap>,
    /// Its MMIO window's base.
    pub mmio_base: u64,
}

fn eventfds(n: usize, id: &str) -> Result<Vec<EventFd>, NetError> {
    (0..n)
        .map(|_| {
            EventFd::new(EFD_NONBLOCK).map_err(|source| NetError::EventFd {
                id: id.to_string(),
                source,
            })
        })
        .collect()
}

impl NetDevice {
    /// Opens the tap and makes the device (its threads start with [`NetDevice::start`]).
    pub fn new(p: NetParams<'_>) -> Result<(Arc<NetDevice>, Arc<VirtioShared>), NetError> {
        let pairs = p.spec.queues;
        if usize::from(pairs) > p.vcpus.max(1) {
            return Err(NetError::TooManyQueues {
                id: p.id,
                queues: pairs,
                vcpus: p.vcpus,
            });
        }
        let ctrl = pairs > 1;
        let nq = 2 * usize::from(pairs) + usize::from(ctrl);
        let existed = tap::exists(&p.spec.tap);
        let taps = Tap::open(&p.spec.tap, usize::from(pairs)).map_err(|source| NetError::Tap {
            id: p.id.clone(),
            source,
        })?;
        let mac = p.spec.mac_or_default(std::process::id(), p.index);
        let net = Arc::new(NetShared {
            id: p.id.clone(),
            mac,
            mtu: p.spec.mtu,
            pairs,
            ctrl,
            features: offered_features(pairs),
            taps,
            kicks: eventfds(nq, &p.id)?,
            wakes: eventfds(usize::from(pairs), &p.id)?,
            served: (0..pairs).map(|_| AtomicU64::new(0)).collect(),
            meters: (0..pairs).map(|_| WorkerMeter::default()).collect(),
            queues: (0..nq).map(|_| QueueCounters::default()).collect(),
            active_pairs: AtomicU16::new(1),
            stop: AtomicBool::new(false),
            started: AtomicBool::new(false),
            tap_existed: existed,
        });
        let virtio = Arc::new(VirtioShared::new(
            p.id.clone(),
            &vec![QUEUE_SIZE; nq],
            p.irq,
        ));
        log::info!(
            "{}: tap {} ({}), MAC {mac}, {pairs} queue pair(s)",
            p.id,
            p.spec.tap,
            if existed {
                "attached"
            } else {
                "created by this VMM"
            }
        );
        let dev = Arc::new(NetDevice {
            config: config_space(mac, pairs, p.spec.mtu),
            net,
            virtio: Arc::clone(&virtio),
            mem: p.memory,
            mmio_base: p.mmio_base,
            tap_name: p.spec.tap.clone(),
            threads: Mutex::new(Vec::new()),
            baseline: Mutex::new(None),
        });
        Ok((dev, virtio))
    }

    /// What the device's threads share (tests and benches look inside).
    pub fn shared(&self) -> &Arc<NetShared> {
        &self.net
    }

    fn kind_of(&self, index: usize) -> QueueKind {
        if self.net.ctrl && index == 2 * usize::from(self.net.pairs) {
            QueueKind::Ctrl
        } else if index % 2 == 0 {
            QueueKind::Rx
        } else {
            QueueKind::Tx
        }
    }

    fn thread_name(&self, pair: usize) -> String {
        format!("{}-qp{pair}", self.net.id)
    }
}

impl VirtioDevice for NetDevice {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    fn features(&self) -> u64 {
        self.net.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| self.config.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    fn epoch_changed(&self) {
        for w in &self.net.wakes {
            let _ = w.write(1);
        }
    }

    fn caught_up(&self) -> bool {
        let (epoch, _) = self.virtio.epoch();
        !self.net.started.load(Ordering::Acquire)
            || self
                .net
                .served
                .iter()
                .all(|s| s.load(Ordering::Acquire) == epoch)
    }

    fn kick_fd(&self, queue: usize) -> Option<&EventFd> {
        self.net.kicks.get(queue)
    }
}

impl super::Device for NetDevice {
    fn id(&self) -> &str {
        &self.net.id
    }

    fn start(&self, control: &Arc<AccountingControl>) -> io::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        self.net.started.store(true, Ordering::Release);
        for pair in 0..usize::from(self.net.pairs) {
            let (net, virtio, mem, control) = (
                Arc::clone(&self.net),
                Arc::clone(&self.virtio),
                Arc::clone(&self.mem),
                Arc::clone(control),
            );
            // Made on its thread: the worker's scratch holds raw I/O pointers between uses.
            threads.push(
                std::thread::Builder::new()
                    .name(self.thread_name(pair))
                    .spawn(move || {
                        worker::run(worker::Worker::new(pair, net, virtio, mem, control))
                    })?,
            );
        }
        Ok(())
    }

    fn stop(&self) {
        self.net.stop.store(true, Ordering::Release);
        for w in &self.net.wakes {
            let _ = w.write(1);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    fn threads(&self) -> Vec<DeviceThreadInfo> {
        (0..usize::from(self.net.pairs))
            .map(|pair| DeviceThreadInfo {
                device: self.net.id.clone(),
                name: self.thread_name(pair),
                host_tid: self.net.meters[pair].tid(),
            })
            .collect()
    }

    fn cpu_ns(&self) -> u64 {
        self.net.meters.iter().map(|m| m.times().used_ns).sum()
    }

    fn reset(&self) {
        let mut b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        *b = Some(self.raw_stats());
    }

    fn stats(&self) -> DeviceStats {
        // The baseline lock is held across the sample: a reader sees the figures wholly
        // before or wholly after a reset.
        let b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.raw_stats();
        match b.as_ref() {
            Some(base) => since(now, base),
            None => now,
        }
    }
}

/// `cur` less `base`, counter by counter (0 where a counter went down: a thread that was
/// not there at the reset).
pub fn since(mut cur: DeviceStats, base: &DeviceStats) -> DeviceStats {
    for t in &mut cur.threads {
        if let Some(b) = base.threads.iter().find(|b| b.name == t.name) {
            t.wall_ns = t.wall_ns.saturating_sub(b.wall_ns);
            t.used_ns = t.used_ns.saturating_sub(b.used_ns);
            t.steal_ns = t.steal_ns.saturating_sub(b.steal_ns);
            t.waiting_ns = t.waiting_ns.saturating_sub(b.waiting_ns);
            t.blocked_ns = t.blocked_ns.saturating_sub(b.blocked_ns);
            t.identity_error_ns =
                t.wall_ns as i64 - (t.used_ns + t.steal_ns + t.waiting_ns + t.blocked_ns) as i64;
        }
    }
    for q in &mut cur.queues {
        if let Some(b) = base.queues.iter().find(|b| b.index == q.index) {
            q.notifications = q.notifications.saturating_sub(b.notifications);
            q.interrupts = q.interrupts.saturating_sub(b.interrupts);
            q.interrupts_suppressed = q
                .interrupts_suppressed
                .saturating_sub(b.interrupts_suppressed);
            q.chains = q.chains.saturating_sub(b.chains);
            q.packets = q.packets.saturating_sub(b.packets);
            q.bytes = q.bytes.saturating_sub(b.bytes);
            for (r, n) in q.drops.iter_mut() {
                *n = n.saturating_sub(b.drops.get(r).copied().unwrap_or(0));
            }
            q.drops.retain(|_, n| *n > 0);
        }
    }
    cur.cpu_ns = cur.cpu_ns.saturating_sub(base.cpu_ns);
    cur.cpu.tx = cur.cpu.tx.saturating_sub(base.cpu.tx);
    cur.cpu.rx = cur.cpu.rx.saturating_sub(base.cpu.rx);
    cur.cpu.ctrl = cur.cpu.ctrl.saturating_sub(base.cpu.ctrl);
    cur.cpu.other = cur.cpu.other.saturating_sub(base.cpu.other);
    let packets = |k: QueueKind| -> u64 {
        cur.queues
            .iter()
            .filter(|q| q.kind == k)
            .map(|q| q.packets)
            .sum()
    };
    let per = |cpu: u64, n: u64| (n > 0).then(|| cpu / n);
    cur.cpu_ns_per_packet = cur.cpu_ns_per_packet.map(|_| PerPacket {
        tx: per(cur.cpu.tx, packets(QueueKind::Tx)),
        rx: per(cur.cpu.rx, packets(QueueKind::Rx)),
    });
    cur
}

impl NetDevice {
    /// Every figure since the device started.
    fn raw_stats(&self) -> DeviceStats {
        let times: Vec<_> = self.net.meters.iter().map(WorkerMeter::times).collect();
        let threads = times
            .iter()
            .enumerate()
            .map(|(pair, t)| DeviceThreadStats {
                name: self.thread_name(pair),
                host_tid: self.net.meters[pair].tid(),
                wall_ns: t.wall_ns,
                used_ns: t.used_ns,
                steal_ns: t.steal_ns,
                waiting_ns: t.waiting_ns,
                blocked_ns: t.blocked_ns,
                identity_error_ns: t.identity_error_ns(),
            })
            .collect();
        let queues: Vec<_> = self
            .net
            .queues
            .iter()
            .enumerate()
            .map(|(i, c)| c.stats(i as u16, self.kind_of(i)))
            .collect();
        let part = |p: usize| times.iter().map(|t| t.parts_ns[p]).sum::<u64>();
        let cpu_ns: u64 = times.iter().map(|t| t.used_ns).sum();
        let cpu = DeviceCpu {
            rx: part(worker::PART_RX),
            tx: part(worker::PART_TX),
            ctrl: part(worker::PART_CTRL),
            other: cpu_ns.saturating_sub(
                part(worker::PART_RX) + part(worker::PART_TX) + part(worker::PART_CTRL),
            ),
        };
        let packets = |k: QueueKind| {
            queues
                .iter()
                .filter(|q| q.kind == k)
                .map(|q| q.packets)
                .sum::<u64>()
        };
        let per = |cpu: u64, n: u64| (n > 0).then(|| cpu / n);
        let per_packet = PerPacket {
            tx: per(cpu.tx, packets(QueueKind::Tx)),
            rx: per(cpu.rx, packets(QueueKind::Rx)),
        };
        let c = &self.virtio.counters;
        let violations: BTreeMap<String, u64> = ALL_VIOLATIONS
            .iter()
            .zip(c.violations.iter())
            .map(|(v, n)| (v.name().to_string(), n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let (status, status_reason) = match self.virtio.health() {
            Health::Ok => (DeviceHealth::Ok, None),
            Health::NeedsReset => (
                DeviceHealth::NeedsReset,
                self.virtio
                    .last_violation()
                    .map(|v| v.describe().to_string()),
            ),
            Health::Failed => (
                DeviceHealth::Failed,
                Some(
                    self.virtio
                        .last_violation()
                        .map_or("the driver gave up on the device", |v| v.describe())
                        .to_string(),
                ),
            ),
        };
        DeviceStats {
            id: self.net.id.clone(),
            kind: DeviceKind::Net,
            backend: self.tap_name.clone(),
            mac: Some(self.net.mac.to_string()),
            mmio_base: self.mmio_base,
            gsi: self.virtio.gsi(),
            status,
            status_reason,
            threads,
            queues,
            cpu_ns,
            cpu_ns_per_packet: Some(per_packet),
            cpu,
            driver: DriverStats {
                features: self.virtio.driver_features(),
                activations: c.activations.load(Ordering::Relaxed),
                resets: c.resets.load(Ordering::Relaxed),
                notify_exits: c.notify_exits.load(Ordering::Relaxed),
                violations,
            },
        }
    }
}

#[cfg(test)]
mod tests;

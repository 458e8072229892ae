//! virtio-net on a tap (spec section 10, docs/design.md "Devices"): queue pairs each served
//! by a thread of their own, every frame, chain, drop, kick and interrupt counted, and each
//! thread's time accounted as exactly as a vCPU's.
//!
//! Data flow: the VM builder makes a [`NetDevice`] from a [`spec::NetSpec`]: it opens the
//! tap (one queue per pair, all but the first detached until a driver asks for them), makes a
//! kick eventfd per virtqueue (registered as ioeventfds at the transport's QueueNotify), and
//! shares a [`crate::devices::virtio::VirtioShared`] (with a wake eventfd per thread) with its
//! MMIO transport. `Vm::run` starts one thread per queue pair ([`worker`], named `net0-qp0`,
//! …) before the vCPUs and stops them after. Readers (`stats`, the report, metrics) take
//! [`NetDevice::stats`]: the threads' own meters and queue counters, single-writer atomics
//! they read without a lock.
//!
//! Queues ([`layout`]): rx0 = 0, tx0 = 1, rx1 = 2, tx1 = 3, …, and with several pairs the
//! control queue last (at 2 when the driver takes CTRL_VQ without MQ). The configuration
//! space (read-only) is the MAC, the link status (up), the pairs and the MTU.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ppa_vmm_api::{DeviceStats, DeviceThreadInfo, QueueKind};
use thiserror::Error;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::*;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::virtio::{eventfds, read_config_bytes, VirtioDevice, VirtioShared};
use crate::accounting::worker::WorkerMeter;
use crate::accounting::AccountingControl;
use crate::devices::rate::{RateSpecError, SharedLimiter};
use crate::hypervisor::IrqLine;

pub mod batch;
pub mod ctrl;
pub mod layout;
pub mod queues;
pub mod rx;
pub mod spec;
pub mod stats;
pub mod tap;
pub mod tx;
pub mod worker;

use queues::{FrameCpu, QueueCounters};
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
    /// The tap's MTU is below the device's and cannot be raised.
    #[error(
        "{id}: the tap {tap} has MTU {tap_mtu}, below the device's {mtu}, and this VMM cannot \
         raise it (that takes CAP_NET_ADMIN); set it first (ip link set {tap} mtu {mtu}) or give \
         --net mtu={tap_mtu}"
    )]
    Mtu {
        /// Device id.
        id: String,
        /// The tap.
        tap: String,
        /// The device's MTU.
        mtu: u16,
        /// The tap's.
        tap_mtu: u32,
        /// Cause.
        #[source]
        source: io::Error,
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
    /// Each thread's meter.
    pub meters: Vec<WorkerMeter>,
    /// Each thread's CPU per frame.
    pub frame_cpu: Vec<FrameCpu>,
    /// Each virtqueue's counters.
    pub queues: Vec<QueueCounters>,
    /// Queue pairs the driver uses now (1 after every reset).
    pub active_pairs: AtomicU16,
    /// Each pair's tap error (errno) while its tap fails; 0 while it works.
    pub tap_errors: Vec<AtomicI32>,
    /// Set to stop the threads.
    pub stop: AtomicBool,
    /// Whether the tap existed before the VMM opened it (false: the VMM created it).
    pub tap_existed: bool,
    /// The receive rate limiter (`rate=rx-…`), shared by the pairs' threads (limiting
    /// nothing until it has buckets: `set-rate`).
    pub rx_rate: SharedLimiter,
    /// The transmit rate limiter (`rate=tx-…`).
    pub tx_rate: SharedLimiter,
    /// Times `set-rate` changed the limiters: a thread that sees a new count ends its rate
    /// waits and asks the new buckets.
    pub rate_changes: AtomicU32,
}

impl NetShared {
    /// The name of queue pair `pair`'s thread (`net0-qp1`): the OS thread's, the log's and the
    /// figures'.
    pub fn thread_name(&self, pair: usize) -> String {
        format!("{}-qp{pair}", self.id)
    }
}

/// Makes the tap carry the device's MTU: one this VMM created gets it exactly; an existing
/// tap below it is raised, or the device refused with a sentence when that is not allowed; an
/// existing tap above it is left (the operator's), and frames over the device's MTU are
/// dropped on receive and counted (`over_mtu`).
fn match_mtu(id: &str, tap: &str, mtu: u16, created: bool) -> Result<(), NetError> {
    let tap_mtu = match tap::mtu(tap) {
        Ok(m) => m,
        Err(e) => {
            log::warn!("{id}: cannot read the MTU of the tap {tap}: {e}");
            return Ok(());
        }
    };
    if tap_mtu == u32::from(mtu) || (!created && tap_mtu > u32::from(mtu)) {
        if tap_mtu > u32::from(mtu) {
            log::info!(
                "{id}: the tap {tap} has MTU {tap_mtu}, above the device's {mtu}: larger frames from the host are dropped (over_mtu)"
            );
        }
        return Ok(());
    }
    match tap::set_mtu(tap, u32::from(mtu)) {
        Ok(()) => Ok(()),
        Err(_) if created => Ok(()),
        Err(source) => Err(NetError::Mtu {
            id: id.to_string(),
            tap: tap.to_string(),
            mtu,
            tap_mtu,
            source,
        }),
    }
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
    baseline: Mutex<Option<stats::Raw>>,
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
        let nq = layout::queue_count(pairs, ctrl);
        let existed = tap::exists(&p.spec.tap);
        let taps = Tap::open(&p.spec.tap, usize::from(pairs)).map_err(|source| NetError::Tap {
            id: p.id.clone(),
            source,
        })?;
        match_mtu(&p.id, &p.spec.tap, p.spec.mtu, !existed)?;
        let mac = p.spec.mac_or_default(std::process::id(), p.index);
        let net = Arc::new(NetShared {
            id: p.id.clone(),
            mac,
            mtu: p.spec.mtu,
            pairs,
            ctrl,
            features: offered_features(pairs),
            taps,
            kicks: eventfds(nq).map_err(|source| NetError::EventFd {
                id: p.id.clone(),
                source,
            })?,
            meters: (0..pairs).map(|_| WorkerMeter::default()).collect(),
            frame_cpu: (0..pairs).map(|_| FrameCpu::default()).collect(),
            queues: (0..nq).map(|_| QueueCounters::default()).collect(),
            active_pairs: AtomicU16::new(1),
            tap_errors: (0..pairs).map(|_| AtomicI32::new(0)).collect(),
            stop: AtomicBool::new(false),
            tap_existed: existed,
            rx_rate: SharedLimiter::always(&p.spec.rx_rate),
            tx_rate: SharedLimiter::always(&p.spec.tx_rate),
            rate_changes: AtomicU32::new(0),
        });
        // The reset state: one pair, the other tap queues detached (each thread attaches its
        // own when the driver asks for it).
        for t in net.taps.iter().skip(1) {
            if let Err(e) = t.enable(false) {
                log::warn!("{}: {e}", p.id);
            }
        }
        let virtio = Arc::new(
            VirtioShared::new(
                p.id.clone(),
                &vec![QUEUE_SIZE; nq],
                usize::from(pairs),
                p.irq,
            )
            .map_err(|source| NetError::EventFd {
                id: p.id.clone(),
                source,
            })?,
        );
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
        let n = layout::Negotiated {
            ctrl: self.virtio.has_feature(VIRTIO_NET_F_CTRL_VQ),
            mq: self.virtio.has_feature(VIRTIO_NET_F_MQ),
        };
        layout::kind_of(index, self.net.pairs, self.net.ctrl, n)
    }

    fn thread_name(&self, pair: usize) -> String {
        self.net.thread_name(pair)
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
        read_config_bytes(&self.config, offset, data);
    }

    fn on_reset(&self) {
        // Virtio 1.2, 5.1.6.5.5: after a reset the device uses one pair until told otherwise.
        self.net.active_pairs.store(1, Ordering::Release);
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
        self.virtio.threads_started();
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
        self.virtio.wake_all();
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
                ..Default::default()
            })
            .collect()
    }

    fn cpu_ns(&self) -> u64 {
        self.net.meters.iter().map(|m| m.times().used_ns).sum()
    }

    fn reset(&self) {
        let mut b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        *b = Some(self.raw());
    }

    fn wake_threads(&self) {
        // Each pair's thread runs its wake pass once (nothing to do in it): it moves to one of
        // its CPUs, and looks at its hold before it waits again.
        self.virtio.wake_all();
    }

    fn worker_meters(&self) -> &[WorkerMeter] {
        &self.net.meters
    }

    fn set_rate(&self, rate: &str) -> Result<Option<String>, RateSpecError> {
        let (rx, tx) = spec::parse_rate(rate)?;
        self.net.rx_rate.set(&rx);
        self.net.tx_rate.set(&tx);
        self.net.rate_changes.fetch_add(1, Ordering::AcqRel);
        self.virtio.wake_all();
        Ok(spec::rate_value(&rx, &tx))
    }

    fn stats(&self) -> DeviceStats {
        // The baseline lock is held across the sample: a reader sees the figures wholly
        // before or wholly after a reset.
        let b = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        self.raw().since(b.as_ref())
    }
}

#[cfg(test)]
mod tests;

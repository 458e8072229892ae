//! The figures every virtio device gives its readers in the same way: its health and its
//! driver's side (from the transport's shared state), each thread's accounting (from its
//! [`WorkerMeter`]), and the subtraction of a `reset`'s baseline from the parts all devices
//! have (threads, queues, CPU).
//!
//! Data flow: a device's `stats` (on a reader thread: `stats`, the report, the metrics) calls
//! [`health`], [`driver_stats`] and [`thread_stats`] to fill the common part of
//! `ppa_vmm_api::DeviceStats`, then adds its own; after a `reset` it subtracts the baseline
//! with [`since_common`] and then its own parts. Nothing here runs on a device thread.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use ppa_vmm_api::{DeviceHealth, DeviceStats, DeviceThreadStats, DriverStats};

use super::{Health, VirtioShared, ALL_VIOLATIONS};
use crate::accounting::worker::{WorkerMeter, WorkerTimes};

/// The device's status and, when it is not `ok`, why.
pub fn health(virtio: &VirtioShared) -> (DeviceHealth, Option<String>) {
    match virtio.health() {
        Health::Ok => (DeviceHealth::Ok, None),
        Health::NeedsReset => (
            DeviceHealth::NeedsReset,
            virtio.last_violation().map(|v| v.describe().to_string()),
        ),
        Health::Failed => (
            DeviceHealth::Failed,
            Some(
                virtio
                    .last_violation()
                    .map_or("the driver gave up on the device", |v| v.describe())
                    .to_string(),
            ),
        ),
    }
}

/// What the device's driver did (the transport's counters).
pub fn driver_stats(virtio: &VirtioShared) -> DriverStats {
    let c = &virtio.counters;
    let violations: BTreeMap<String, u64> = ALL_VIOLATIONS
        .iter()
        .zip(c.violations.iter())
        .map(|(v, n)| (v.name().to_string(), n.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect();
    DriverStats {
        features: virtio.driver_features(),
        activations: c.activations.load(Ordering::Relaxed),
        resets: c.resets.load(Ordering::Relaxed),
        resets_unsettled: c.resets_unsettled.load(Ordering::Relaxed),
        notify_exits: c.notify_exits.load(Ordering::Relaxed),
        violations,
    }
}

/// Thread `name`'s figures from its meter's reading `t`.
pub fn thread_stats(name: String, meter: &WorkerMeter, t: &WorkerTimes) -> DeviceThreadStats {
    DeviceThreadStats {
        name,
        host_tid: meter.tid(),
        wall_ns: t.wall_ns,
        used_ns: t.used_ns,
        steal_ns: t.steal_ns,
        waiting_ns: t.waiting_ns,
        blocked_ns: t.blocked_ns,
        limited_ns: t.limited_ns,
        held_frames: meter.hold.frames(),
        identity_error_ns: t.identity_error_ns(),
    }
}

/// `cur` less `base` in what every device has: each thread's times (its identity made again),
/// each queue's counters (drops that did not move left out), the CPU and its parts. Counters
/// that went down (a thread that was not there at the reset) give 0.
pub fn since_common(cur: &mut DeviceStats, base: &DeviceStats) {
    for t in &mut cur.threads {
        if let Some(b) = base.threads.iter().find(|b| b.name == t.name) {
            t.wall_ns = t.wall_ns.saturating_sub(b.wall_ns);
            t.used_ns = t.used_ns.saturating_sub(b.used_ns);
            t.steal_ns = t.steal_ns.saturating_sub(b.steal_ns);
            t.waiting_ns = t.waiting_ns.saturating_sub(b.waiting_ns);
            t.blocked_ns = t.blocked_ns.saturating_sub(b.blocked_ns);
            t.limited_ns = t.limited_ns.saturating_sub(b.limited_ns);
            t.held_frames = t.held_frames.saturating_sub(b.held_frames);
            t.identity_error_ns = t.wall_ns as i64
                - (t.used_ns + t.steal_ns + t.waiting_ns + t.blocked_ns + t.limited_ns) as i64;
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
            if let (Some(r), Some(rb)) = (q.requests.as_mut(), b.requests) {
                *r = r.saturating_sub(rb);
            }
            q.bytes = q.bytes.saturating_sub(b.bytes);
            q.copied = q.copied.saturating_sub(b.copied);
            q.throttles = q.throttles.saturating_sub(b.throttles);
            q.throttled_ns = q.throttled_ns.saturating_sub(b.throttled_ns);
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
    cur.cpu.req = cur.cpu.req.saturating_sub(base.cpu.req);
    cur.cpu.poll = cur.cpu.poll.saturating_sub(base.cpu.poll);
    cur.cpu.other = cur.cpu.other.saturating_sub(base.cpu.other);
}

//! Devices as text: one line per device (its status, CPU, frames each way, CPU per frame,
//! drops, kicks and interrupts), its threads with their time split, and where the VMM
//! process's CPU went. The final report, `ctl --text stats` and `ctl --text device` print it.
//!
//! Data flow: callers hand in the protocol's `DeviceStats` (and the VM's `HostCpuSplit`);
//! [`devices_text`] formats them. Pure: no I/O.

use std::fmt::Write as _;

use crate::{DeviceStats, HostCpuSplit, QueueKind};

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

fn sum(d: &DeviceStats, kind: QueueKind, f: impl Fn(&crate::QueueStats) -> u64) -> u64 {
    d.queues.iter().filter(|q| q.kind == kind).map(f).sum()
}

/// The host CPU line: `HOST CPU vCPUs X ms, devices Y ms, service Z ms (of T ms)`.
pub fn host_cpu_line(h: &HostCpuSplit) -> String {
    let total = h.total().max(1) as f64;
    let pct = |ns: u64| ns as f64 * 100.0 / total;
    format!(
        "HOST CPU {} ms: vCPU threads {} ms ({:.1} %), device threads {} ms ({:.1} %), service threads {} ms ({:.1} %)\n",
        ms(h.total()),
        ms(h.vcpus),
        pct(h.vcpus),
        ms(h.devices),
        pct(h.devices),
        ms(h.service),
        pct(h.service)
    )
}

/// A device's lines under its row: why it is not ok, its backend's failure, the spread of its
/// CPU a frame, and its drops by queue.
fn device_notes(out: &mut String, d: &DeviceStats) {
    if let Some(why) = &d.status_reason {
        let _ = writeln!(out, "  status: {why}");
    }
    if let Some(why) = &d.backend_error {
        let _ = writeln!(out, "  backend: {why}");
    }
    if let Some(f) = &d.frame_cpu {
        let way = |name: &str, n: u64, h: &crate::HistogramJson| {
            (n > 0).then(|| {
                format!(
                    "{name} {n} frames, per batch p50 {} p99 {} max {} ns ({} batches)",
                    h.p50, h.p99, h.max, h.count
                )
            })
        };
        let parts: Vec<String> = [
            way("tx", f.tx_frames, &f.tx_per_batch),
            way("rx", f.rx_frames, &f.rx_per_batch),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !parts.is_empty() {
            let _ = writeln!(out, "  CPU a frame: {}", parts.join("; "));
        }
    }
    for q in d.queues.iter().filter(|q| !q.drops.is_empty()) {
        let list: Vec<String> = q.drops.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = writeln!(
            out,
            "  drops on {} queue {}: {}",
            q.kind,
            q.index,
            list.join(", ")
        );
    }
}

/// The devices table; empty when there are none.
pub fn devices_text(devices: &[DeviceStats]) -> String {
    if devices.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:<10} {:<11} {:>9} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>12}",
        "DEVICE",
        "BACKEND",
        "STATUS",
        "CPU ms",
        "TX frames",
        "RX frames",
        "TX ns/fr",
        "RX ns/fr",
        "DROPS",
        "KICKS",
        "IRQS (supp)"
    );
    for d in devices {
        let per = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
        let (ptx, prx) = d
            .cpu_ns_per_packet
            .map_or(("-".into(), "-".into()), |p| (per(p.tx), per(p.rx)));
        let drops: u64 = d.queues.iter().map(|q| q.drops.values().sum::<u64>()).sum();
        let kicks: u64 = d.queues.iter().map(|q| q.notifications).sum();
        let irqs: u64 = d.queues.iter().map(|q| q.interrupts).sum();
        let supp: u64 = d.queues.iter().map(|q| q.interrupts_suppressed).sum();
        let _ = writeln!(
            out,
            "{:<8} {:<10} {:<11} {:>9} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>12}",
            d.id,
            d.backend,
            d.status.as_str(),
            ms(d.cpu_ns),
            sum(d, QueueKind::Tx, |q| q.packets),
            sum(d, QueueKind::Rx, |q| q.packets),
            ptx,
            prx,
            drops,
            kicks,
            format!("{irqs} ({supp})"),
        );
        device_notes(&mut out, d);
        let _ = writeln!(
            out,
            "  {:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "THREAD", "TID", "WALL ms", "USED ms", "STEAL", "WAITING", "BLKD", "IDENT"
        );
        for t in &d.threads {
            let _ = writeln!(
                out,
                "  {:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6.2}%",
                t.name,
                t.host_tid,
                ms(t.wall_ns),
                ms(t.used_ns),
                ms(t.steal_ns),
                ms(t.waiting_ns),
                ms(t.blocked_ns),
                t.identity_error_ns as f64 * 100.0 / t.wall_ns.max(1) as f64
            );
        }
    }
    out.push_str(
        "CPU is the device threads' CPU clocks; ns/fr is a mean: the CPU of the transmit \
         (receive) work over the frames it handled, sent (delivered) or dropped, while the CPU \
         marks were taken (not at level off); \"CPU a frame\" gives its spread over the batches. \
         A thread's WALL = USED + STEAL + WAITING (asleep in its event loop) + BLKD.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::{
        DeviceCpu, DeviceHealth, DeviceKind, DeviceThreadStats, DriverStats, DropReason, PerPacket,
        QueueStats,
    };

    use super::*;

    #[test]
    fn a_device_is_one_line_its_drops_and_its_threads() {
        let q = |index, kind, packets, drops: &[(DropReason, u64)]| QueueStats {
            index,
            kind,
            notifications: 3,
            interrupts: 2,
            interrupts_suppressed: 1,
            chains: packets,
            packets,
            bytes: 64 * packets,
            copied: 0,
            drops: drops.iter().copied().collect(),
        };
        let d = DeviceStats {
            id: "net0".into(),
            kind: DeviceKind::Net,
            backend: "tap0".into(),
            mac: None,
            mmio_base: 0xC000_0000,
            gsi: None,
            status: DeviceHealth::NeedsReset,
            status_reason: Some("the driver made a malformed descriptor chain available".into()),
            backend_error: None,
            threads: vec![DeviceThreadStats {
                name: "net0-qp0".into(),
                host_tid: 77,
                wall_ns: 10_000_000,
                used_ns: 4_000_000,
                steal_ns: 1_000_000,
                waiting_ns: 5_000_000,
                blocked_ns: 0,
                identity_error_ns: 0,
            }],
            queues: vec![
                q(0, QueueKind::Rx, 10, &[]),
                q(1, QueueKind::Tx, 1000, &[(DropReason::BadChain, 1)]),
            ],
            cpu_ns: 4_000_000,
            cpu: DeviceCpu::default(),
            cpu_ns_per_packet: Some(PerPacket {
                tx: Some(3000),
                rx: None,
            }),
            frame_cpu: None,
            driver: DriverStats {
                features: 0,
                activations: 1,
                resets: 0,
                notify_exits: 0,
                resets_unsettled: 0,
                violations: BTreeMap::new(),
            },
        };
        let t = devices_text(&[d]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[1].starts_with("net0     tap0       needs_reset"),
            "{t}"
        );
        assert!(
            lines[1].contains(" 1000 ") && lines[1].contains(" 3000 "),
            "{t}"
        );
        assert!(lines[1].ends_with("4 (2)"), "{t}");
        assert!(t.contains("status: the driver made a malformed"), "{t}");
        assert!(t.contains("drops on tx queue 1: bad_chain 1"), "{t}");
        assert!(t.contains("net0-qp0") && t.contains("  0.00%"), "{t}");
        assert_eq!(devices_text(&[]), "");
        let h = host_cpu_line(&HostCpuSplit {
            vcpus: 3_000_000,
            devices: 1_000_000,
            service: 0,
        });
        assert_eq!(
            h,
            "HOST CPU 4.00 ms: vCPU threads 3.00 ms (75.0 %), device threads 1.00 ms (25.0 %), service threads 0.00 ms (0.0 %)\n"
        );
    }
}

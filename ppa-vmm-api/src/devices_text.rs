//! Devices as text: one line per network device (its status, CPU, frames each way, CPU per
//! frame, drops, kicks and interrupts) and per disk (requests by type, bytes, errors, kicks,
//! interrupts, service times by type), each with its threads and their time split, and where
//! the VMM process's CPU went. The final report, `ctl --text stats` and `ctl --text device` print it.
//!
//! Data flow: callers hand in the protocol's `DeviceStats` (and the VM's `HostCpuSplit`);
//! [`devices_text`] formats them. Pure: no I/O.

use std::fmt::Write as _;

use crate::{BlkRequestKind, DeviceKind, DeviceStats, HostCpuSplit, QueueKind};

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
    let stops = if h.vcpu_stops > 0 {
        format!(
            " (of it the limits' stops {} ms, the VMM's)",
            ms(h.vcpu_stops)
        )
    } else {
        String::new()
    };
    format!(
        "HOST CPU {} ms: vCPU threads {} ms ({:.1} %){stops}, device threads {} ms ({:.1} %), service threads {} ms ({:.1} %)\n",
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
    if let Some(rate) = &d.rate {
        let waits: Vec<String> = d
            .queues
            .iter()
            .filter(|q| q.throttles > 0)
            .map(|q| {
                format!(
                    "{} queue {} {} times, {} ms",
                    q.kind,
                    q.index,
                    q.throttles,
                    ms(q.throttled_ns)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  rate {rate}: {}",
            if waits.is_empty() {
                "no queue waited for tokens".to_string()
            } else {
                format!("waited for tokens: {}", waits.join("; "))
            }
        );
    }
}

/// The devices tables (network devices, then disks); empty when there are none.
pub fn devices_text(devices: &[DeviceStats]) -> String {
    let mut out = String::new();
    let net: Vec<&DeviceStats> = devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Net)
        .collect();
    let blk: Vec<&DeviceStats> = devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Blk)
        .collect();
    if !net.is_empty() {
        net_table(&mut out, &net);
    }
    if !blk.is_empty() {
        blk_table(&mut out, &blk);
    }
    out
}

fn net_table(out: &mut String, devices: &[&DeviceStats]) {
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
        let _ = writeln!(
            out,
            "{:<8} {:<10} {:<11} {:>9} {:>10} {:>10} {:>9} {:>9} {:>7} {}",
            d.id,
            d.backend,
            d.status.as_str(),
            ms(d.cpu_ns),
            sum(d, QueueKind::Tx, |q| q.packets),
            sum(d, QueueKind::Rx, |q| q.packets),
            ptx,
            prx,
            drops,
            kicks_irqs(d),
        );
        device_notes(out, d);
        thread_rows(out, d);
    }
    out.push_str(
        "CPU is the device threads' CPU clocks; ns/fr is a mean: the CPU of the transmit \
         (receive) work over the frames it handled, sent (delivered) or dropped, while the CPU \
         marks were taken (not at level off); \"CPU a frame\" gives its spread over the batches. \
         A thread's WALL = USED + STEAL + WAITING (asleep in its event loop) + BLKD.\n",
    );
}

fn blk_table(out: &mut String, devices: &[&DeviceStats]) {
    let _ = writeln!(
        out,
        "{:<8} {:<11} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>12}  BACKEND",
        "DISK",
        "STATUS",
        "CPU ms",
        "READS",
        "WRITES",
        "FLUSHES",
        "MERGED",
        "READ MiB",
        "WRIT MiB",
        "ERRORS",
        "KICKS",
        "IRQS (supp)",
    );
    for d in devices {
        let Some(b) = &d.blk else { continue };
        let n = |k: BlkRequestKind| b.requests.get(&k).copied().unwrap_or(0);
        let mib = |bytes: u64| format!("{:.2}", bytes as f64 / (1u64 << 20) as f64);
        let _ = writeln!(
            out,
            "{:<8} {:<11} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>7} {}  {}{}",
            d.id,
            d.status.as_str(),
            ms(d.cpu_ns),
            n(BlkRequestKind::Read),
            n(BlkRequestKind::Write),
            n(BlkRequestKind::Flush),
            b.merged,
            mib(b.bytes_read),
            mib(b.bytes_written),
            b.errors.values().sum::<u64>(),
            kicks_irqs(d),
            d.backend,
            if b.readonly { " (read-only)" } else { "" },
        );
        device_notes(out, d);
        if let Some(service) = d.service.as_ref().filter(|s| !s.is_empty()) {
            let us = |ns: u64| format!("{:.1}", ns as f64 / 1e3);
            let list: Vec<String> = service
                .iter()
                .map(|(k, h)| {
                    format!(
                        "{k} {}/{}/{} ({})",
                        us(h.p50),
                        us(h.p99),
                        us(h.max),
                        h.count
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  service us p50/p99/max (requests): {}",
                list.join(", ")
            );
        }
        if !b.errors.is_empty() {
            let list: Vec<String> = b.errors.iter().map(|(s, n)| format!("{s} {n}")).collect();
            let _ = writeln!(out, "  errors: {}", list.join(", "));
        }
        thread_rows(out, d);
    }
    out.push_str(
        "CPU is the disk threads' CPU clocks; service is a request's time from its chain taken \
         to its answer given back. A thread's BLKD is mostly its file I/O (reads from a cold \
         cache, fdatasync).\n",
    );
}

fn kicks_irqs(d: &DeviceStats) -> String {
    let kicks: u64 = d.queues.iter().map(|q| q.notifications).sum();
    let irqs: u64 = d.queues.iter().map(|q| q.interrupts).sum();
    let supp: u64 = d.queues.iter().map(|q| q.interrupts_suppressed).sum();
    format!("{kicks:>7} {:>12}", format!("{irqs} ({supp})"))
}

fn thread_rows(out: &mut String, d: &DeviceStats) {
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
            requests: None,
            copied: 0,
            throttles: 0,
            throttled_ns: 0,
            drops: drops.iter().copied().collect(),
        };
        let d = DeviceStats {
            id: "net0".into(),
            kind: DeviceKind::Net,
            backend: "tap0".into(),
            mac: None,
            rate: None,
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
                limited_ns: 0,
                held_frames: 0,
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
            blk: None,
            service: None,
        };
        let mut limited = d.clone();
        let t = devices_text(&[d]);
        assert!(!t.contains("rate"), "{t}");
        limited.rate = Some("tx-bytes:1000/1s".into());
        assert!(devices_text(&[limited.clone()])
            .contains("  rate tx-bytes:1000/1s: no queue waited for tokens\n"));
        limited.queues[1].throttles = 4;
        limited.queues[1].throttled_ns = 1_500_000;
        assert!(devices_text(&[limited])
            .contains("  rate tx-bytes:1000/1s: waited for tokens: tx queue 1 4 times, 1.50 ms\n"));
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
            vcpu_stops: 0,
            vcpus: 3_000_000,
            devices: 1_000_000,
            service: 0,
        });
        assert_eq!(
            h,
            "HOST CPU 4.00 ms: vCPU threads 3.00 ms (75.0 %), device threads 1.00 ms (25.0 %), service threads 0.00 ms (0.0 %)\n"
        );
    }

    #[test]
    fn a_disk_is_one_line_its_service_times_errors_and_threads() {
        use crate::{BlkStats, BlkStatus, HistogramJson};
        let h = |count, p50, p99| HistogramJson {
            frac_bits: 3,
            count,
            sum: 0,
            avg: 0,
            max: p99,
            p50,
            p90: p99,
            p99,
            p999: p99,
            slots: Vec::new(),
        };
        let d = DeviceStats {
            id: "blk0".into(),
            kind: DeviceKind::Blk,
            backend: "/var/lib/vm/root.ext4".into(),
            mac: None,
            rate: None,
            mmio_base: 0xC000_1000,
            gsi: Some(6),
            status: DeviceHealth::Ok,
            status_reason: None,
            backend_error: None,
            threads: vec![DeviceThreadStats {
                name: "blk0-q0".into(),
                host_tid: 78,
                wall_ns: 10_000_000,
                used_ns: 2_000_000,
                steal_ns: 0,
                waiting_ns: 7_000_000,
                blocked_ns: 1_000_000,
                limited_ns: 0,
                held_frames: 0,
                identity_error_ns: 0,
            }],
            queues: vec![QueueStats {
                index: 0,
                kind: QueueKind::Req,
                notifications: 9,
                interrupts: 8,
                interrupts_suppressed: 0,
                chains: 31,
                packets: 0,
                requests: Some(31),
                bytes: 1 << 20,
                copied: 0,
                throttles: 0,
                throttled_ns: 0,
                drops: BTreeMap::new(),
            }],
            cpu_ns: 2_000_000,
            cpu: DeviceCpu::default(),
            cpu_ns_per_packet: None,
            frame_cpu: None,
            driver: DriverStats {
                features: 0,
                activations: 1,
                resets: 0,
                notify_exits: 0,
                resets_unsettled: 0,
                violations: BTreeMap::new(),
            },
            blk: Some(BlkStats {
                capacity_bytes: 1 << 30,
                readonly: true,
                discard: false,
                write_zeroes: false,
                flush_negotiated: true,
                requests: BTreeMap::from([
                    (BlkRequestKind::Read, 16),
                    (BlkRequestKind::Write, 14),
                    (BlkRequestKind::Flush, 1),
                ]),
                bytes_read: 1 << 20,
                bytes_written: 0,
                errors: BTreeMap::from([(BlkStatus::Ioerr, 15)]),
                merged: 9,
            }),
            service: Some(BTreeMap::from([
                (BlkRequestKind::Read, h(16, 5_000, 9_500)),
                (BlkRequestKind::Flush, h(1, 250_000, 250_000)),
            ])),
        };
        let t = devices_text(&[d]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("DISK "), "{t}");
        assert!(lines[1].starts_with("blk0     ok "), "{t}");
        assert!(
            lines[1].contains(" 16 ") && lines[1].contains(" 14 ") && lines[1].contains(" 15 "),
            "reads, writes, errors: {t}"
        );
        let merged = lines[0].split_whitespace().position(|c| c == "MERGED");
        // The header's "CPU ms" is two words.
        assert_eq!(
            merged.map(|i| lines[1].split_whitespace().nth(i - 1)),
            Some(Some("9")),
            "merged under its header: {t}"
        );
        assert!(
            lines[1].ends_with("/var/lib/vm/root.ext4 (read-only)"),
            "{t}"
        );
        assert!(
            t.contains("read 5.0/9.5/9.5 (16), flush 250.0/250.0/250.0 (1)"),
            "{t}"
        );
        assert!(t.contains("errors: ioerr 15"), "{t}");
        assert!(t.contains("blk0-q0") && !t.contains("TX frames"), "{t}");
    }
}

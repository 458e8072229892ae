//! `top`'s device rows: under the vCPUs, one line per device thread with its share of the
//! interval (USED%, RDY% = steal, WAIT% = asleep in its event loop, BLKD%) and its device's
//! frame rates and CPU per frame over the same interval.
//!
//! Data flow: `run_to` hands the previous and current `stats` to [`device_rows`]; pure.

use std::fmt::Write as _;

use ppa_vmm_api::{QueueKind, Stats};

/// The device section of one screen; empty without devices.
pub fn device_rows(prev: &Stats, cur: &Stats) -> String {
    if cur.devices.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n{:<12} {:>8} {:>7} {:>7} {:>7} {:>7} {:>10} {:>10} {:>8} {:>10}\n",
        "THREAD",
        "TID",
        "USED%",
        "RDY%",
        "WAIT%",
        "BLKD%",
        "TX fr/s",
        "RX fr/s",
        "DROP/s",
        "CPU ns/fr"
    );
    for d in &cur.devices {
        let Some(p) = prev.devices.iter().find(|p| p.id == d.id) else {
            continue;
        };
        let frames = |x: &ppa_vmm_api::DeviceStats, k: QueueKind| -> u64 {
            x.queues
                .iter()
                .filter(|q| q.kind == k)
                .map(|q| q.packets)
                .sum()
        };
        let drops = |x: &ppa_vmm_api::DeviceStats| -> u64 {
            x.queues.iter().map(|q| q.drops.values().sum::<u64>()).sum()
        };
        let secs = (cur.vm.uptime_ns.saturating_sub(prev.vm.uptime_ns)).max(1) as f64 / 1e9;
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let (tx, rx) = (
            rate(frames(d, QueueKind::Tx), frames(p, QueueKind::Tx)),
            rate(frames(d, QueueKind::Rx), frames(p, QueueKind::Rx)),
        );
        let dropped = rate(drops(d), drops(p));
        let cpu = d.cpu_ns.saturating_sub(p.cpu_ns);
        let moved = (tx + rx) * secs;
        let per = if moved >= 1.0 {
            format!("{:.0}", cpu as f64 / moved)
        } else {
            "-".to_string()
        };
        for (i, t) in d.threads.iter().enumerate() {
            let Some(pt) = p.threads.iter().find(|x| x.name == t.name) else {
                continue;
            };
            let wall = t.wall_ns.saturating_sub(pt.wall_ns).max(1) as f64 / 100.0;
            let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall;
            let dev_cells = if i == 0 {
                format!("{tx:>10.0} {rx:>10.0} {dropped:>8.0} {per:>10}")
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{:<12} {:>8} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {}",
                t.name,
                t.host_tid,
                pct(t.used_ns, pt.used_ns),
                pct(t.steal_ns, pt.steal_ns),
                pct(t.waiting_ns, pt.waiting_ns),
                pct(t.blocked_ns, pt.blocked_ns),
                dev_cells
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ppa_vmm_api::{
        DeviceCpu, DeviceHealth, DeviceKind, DeviceStats, DeviceThreadStats, DriverStats,
        QueueStats,
    };

    use super::*;
    use crate::tests::stats;

    fn device(at_s: u64, frames: u64, used_ns: u64) -> DeviceStats {
        let q = |index, kind| QueueStats {
            index,
            kind,
            notifications: 0,
            interrupts: 0,
            interrupts_suppressed: 0,
            chains: frames,
            packets: frames,
            bytes: 0,
            copied: 0,
            drops: BTreeMap::new(),
        };
        DeviceStats {
            id: "net0".into(),
            kind: DeviceKind::Net,
            backend: "tap0".into(),
            mac: None,
            mmio_base: 0,
            gsi: None,
            status: DeviceHealth::Ok,
            status_reason: None,
            backend_error: None,
            threads: vec![DeviceThreadStats {
                name: "net0-qp0".into(),
                host_tid: 99,
                wall_ns: at_s * 1_000_000_000,
                used_ns,
                steal_ns: 0,
                waiting_ns: at_s * 1_000_000_000 - used_ns,
                blocked_ns: 0,
                limited_ns: 0,
                held_frames: 0,
                identity_error_ns: 0,
            }],
            queues: vec![q(0, QueueKind::Rx), q(1, QueueKind::Tx)],
            cpu_ns: used_ns,
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
        }
    }

    #[test]
    fn a_device_thread_row_gives_its_shares_and_the_device_rates_over_the_interval() {
        let mut prev = stats(&[], 1);
        prev.devices = vec![device(1, 1000, 100_000_000)];
        let mut cur = stats(&[], 3);
        // Two seconds later: 4000 more frames each way, 400 ms more CPU.
        cur.devices = vec![device(3, 5000, 500_000_000)];
        let s = device_rows(&prev, &cur);
        let row = s.lines().find(|l| l.starts_with("net0-qp0")).expect(&s);
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["net0-qp0", "99", "20.0", "0.0", "80.0", "0.0", "2000", "2000", "0", "50000"],
            "{s}"
        );
        assert_eq!(device_rows(&stats(&[], 1), &stats(&[], 2)), "");
    }
}

//! `top`'s device rows: under the vCPUs, one line per device thread with its share of the
//! interval (USED%, RDY% = steal, WAIT% = asleep in its event loop, BLKD%, HELD% = held by a
//! VM limit of scope `vm`) and its device's rates over the same interval: frames each way and
//! CPU per frame for a network device, reads, writes and errors per second and CPU per request
//! for a disk, and RATE%, the share of the interval its most throttled queue waited for its
//! rate limiter's tokens (`-` without a rate limiter).
//!
//! Data flow: `run_to` hands the previous and current `stats` to [`device_rows`]; pure.

use std::fmt::Write as _;

use ppa_vmm_api::{BlkRequestKind, DeviceKind, DeviceStats, QueueKind, Stats};

/// The device sections of one screen (network devices, then disks); empty without devices.
pub fn device_rows(prev: &Stats, cur: &Stats) -> String {
    let secs = (cur.vm.uptime_ns.saturating_sub(prev.vm.uptime_ns)).max(1) as f64 / 1e9;
    let mut s = String::new();
    for kind in [DeviceKind::Net, DeviceKind::Blk] {
        let pairs: Vec<(&DeviceStats, &DeviceStats)> = cur
            .devices
            .iter()
            .filter(|d| d.kind == kind)
            .filter_map(|d| Some((prev.devices.iter().find(|p| p.id == d.id)?, d)))
            .collect();
        if !cur.devices.iter().any(|d| d.kind == kind) {
            continue;
        }
        let cols = match kind {
            DeviceKind::Net => ["TX fr/s", "RX fr/s", "DROP/s", "CPU ns/fr"],
            DeviceKind::Blk => ["RD/s", "WR/s", "ERR/s", "CPU ns/req"],
        };
        let _ = write!(
            s,
            "\n{:<12} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>10} {:>8} {:>10} {:>6}\n",
            "THREAD",
            "TID",
            "USED%",
            "RDY%",
            "WAIT%",
            "BLKD%",
            "HELD%",
            cols[0],
            cols[1],
            cols[2],
            cols[3],
            "RATE%"
        );
        for (p, d) in pairs {
            let mut cells = match kind {
                DeviceKind::Net => net_cells(p, d, secs),
                DeviceKind::Blk => blk_cells(p, d, secs),
            };
            let _ = write!(cells, " {:>6}", rate_cell(p, d, secs));
            thread_rows(&mut s, p, d, &cells);
        }
    }
    s
}

/// Frames each way, drops per second and CPU per frame over the interval.
fn net_cells(p: &DeviceStats, d: &DeviceStats, secs: f64) -> String {
    let frames = |x: &DeviceStats, k: QueueKind| -> u64 {
        x.queues
            .iter()
            .filter(|q| q.kind == k)
            .map(|q| q.packets)
            .sum()
    };
    let drops =
        |x: &DeviceStats| -> u64 { x.queues.iter().map(|q| q.drops.values().sum::<u64>()).sum() };
    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
    let (tx, rx) = (
        rate(frames(d, QueueKind::Tx), frames(p, QueueKind::Tx)),
        rate(frames(d, QueueKind::Rx), frames(p, QueueKind::Rx)),
    );
    let dropped = rate(drops(d), drops(p));
    let per = per_unit(d.cpu_ns.saturating_sub(p.cpu_ns), (tx + rx) * secs);
    format!("{tx:>10.0} {rx:>10.0} {dropped:>8.0} {per:>10}")
}

/// Reads, writes and errors per second and CPU per request over the interval.
fn blk_cells(p: &DeviceStats, d: &DeviceStats, secs: f64) -> String {
    let req = |x: &DeviceStats, k: Option<BlkRequestKind>| -> u64 {
        x.blk.as_ref().map_or(0, |b| match k {
            Some(k) => b.requests.get(&k).copied().unwrap_or(0),
            None => b.requests.values().sum(),
        })
    };
    let errors = |x: &DeviceStats| -> u64 { x.blk.as_ref().map_or(0, |b| b.errors.values().sum()) };
    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
    let rd = rate(
        req(d, Some(BlkRequestKind::Read)),
        req(p, Some(BlkRequestKind::Read)),
    );
    let wr = rate(
        req(d, Some(BlkRequestKind::Write)),
        req(p, Some(BlkRequestKind::Write)),
    );
    let err = rate(errors(d), errors(p));
    let all = req(d, None).saturating_sub(req(p, None)) as f64;
    let per = per_unit(d.cpu_ns.saturating_sub(p.cpu_ns), all);
    format!("{rd:>10.0} {wr:>10.0} {err:>8.0} {per:>10}")
}

/// The share of the interval (`secs`) that `d`'s most throttled queue waited for its rate
/// limiter's tokens, or `-` when the device has no rate limiter.
fn rate_cell(p: &DeviceStats, d: &DeviceStats, secs: f64) -> String {
    if d.rate.is_none() {
        return "-".to_string();
    }
    let waited = d
        .queues
        .iter()
        .map(|q| {
            let before = p
                .queues
                .iter()
                .find(|x| x.index == q.index)
                .map_or(0, |x| x.throttled_ns);
            q.throttled_ns.saturating_sub(before)
        })
        .max()
        .unwrap_or(0);
    format!("{:.1}", (waited as f64 / 1e9 / secs * 100.0).min(100.0))
}

/// `cpu` ns over `n` units, or `-` when none moved.
fn per_unit(cpu: u64, n: f64) -> String {
    if n >= 1.0 {
        format!("{:.0}", cpu as f64 / n)
    } else {
        "-".to_string()
    }
}

/// One row per thread of `d`, the device's `cells` on the first.
fn thread_rows(s: &mut String, p: &DeviceStats, d: &DeviceStats, cells: &str) {
    for (i, t) in d.threads.iter().enumerate() {
        let Some(pt) = p.threads.iter().find(|x| x.name == t.name) else {
            continue;
        };
        let wall = t.wall_ns.saturating_sub(pt.wall_ns).max(1) as f64 / 100.0;
        let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / wall;
        let _ = writeln!(
            s,
            "{:<12} {:>8} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {}",
            t.name,
            t.host_tid,
            pct(t.used_ns, pt.used_ns),
            pct(t.steal_ns, pt.steal_ns),
            pct(t.waiting_ns, pt.waiting_ns),
            pct(t.blocked_ns, pt.blocked_ns),
            pct(t.limited_ns, pt.limited_ns),
            if i == 0 { cells } else { "" }
        );
    }
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

    pub(super) fn device(at_s: u64, frames: u64, used_ns: u64) -> DeviceStats {
        let q = |index, kind| QueueStats {
            index,
            kind,
            notifications: 0,
            interrupts: 0,
            interrupts_suppressed: 0,
            chains: frames,
            packets: frames,
            bytes: 0,
            requests: None,
            copied: 0,
            throttles: 0,
            throttled_ns: 0,
            drops: BTreeMap::new(),
        };
        DeviceStats {
            id: "net0".into(),
            kind: DeviceKind::Net,
            backend: "tap0".into(),
            mac: None,
            rate: None,
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
            blk: None,
            service: None,
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
            [
                "net0-qp0", "99", "20.0", "0.0", "80.0", "0.0", "0.0", "2000", "2000", "0",
                "50000", "-"
            ],
            "{s}"
        );
        assert_eq!(device_rows(&stats(&[], 1), &stats(&[], 2)), "");
    }

    #[test]
    fn held_and_throttled_time_are_shares_of_the_interval() {
        let mut prev = stats(&[], 1);
        prev.devices = vec![device(1, 1000, 100_000_000)];
        let mut cur = stats(&[], 3);
        let mut d = device(3, 5000, 500_000_000);
        // Over the two seconds: held 300 ms by a VM limit, and the rate limiter kept the tx
        // queue waiting 1.5 s and the rx queue 0.5 s.
        d.threads[0].limited_ns = 300_000_000;
        d.threads[0].waiting_ns -= 300_000_000;
        d.rate = Some("tx-packets:1000/1s".into());
        d.queues[0].throttled_ns = 500_000_000;
        d.queues[1].throttled_ns = 1_500_000_000;
        cur.devices = vec![d];
        let s = device_rows(&prev, &cur);
        assert!(s.contains("HELD%") && s.contains("RATE%"), "{s}");
        let row = s.lines().find(|l| l.starts_with("net0-qp0")).expect(&s);
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[6], "15.0", "held: 300 ms of 2 s\n{s}");
        assert_eq!(
            cells[11], "75.0",
            "the most throttled queue: 1.5 s of 2 s\n{s}"
        );
    }
}

#[cfg(test)]
mod blk_tests {
    use std::collections::BTreeMap;

    use ppa_vmm_api::{BlkRequestKind, BlkStats, DeviceKind};

    use super::*;
    use crate::tests::stats;

    fn disk(at_s: u64, reads: u64, writes: u64, used_ns: u64) -> DeviceStats {
        let mut d = super::tests::device(at_s, 0, used_ns);
        d.id = "blk0".into();
        d.kind = DeviceKind::Blk;
        d.threads[0].name = "blk0-q0".into();
        d.blk = Some(BlkStats {
            capacity_bytes: 1 << 20,
            readonly: false,
            discard: false,
            write_zeroes: false,
            flush_negotiated: true,
            requests: BTreeMap::from([
                (BlkRequestKind::Read, reads),
                (BlkRequestKind::Write, writes),
            ]),
            bytes_read: 0,
            bytes_written: 0,
            errors: BTreeMap::new(),
            merged: 0,
        });
        d
    }

    #[test]
    fn a_disk_thread_row_gives_its_reads_writes_and_cpu_per_request() {
        let mut prev = stats(&[], 1);
        prev.devices = vec![disk(1, 100, 0, 100_000_000)];
        let mut cur = stats(&[], 3);
        // Two seconds later: 3000 more reads, 1000 more writes, 200 ms more CPU.
        cur.devices = vec![disk(3, 3100, 1000, 300_000_000)];
        let s = device_rows(&prev, &cur);
        assert!(s.contains("RD/s") && !s.contains("TX fr/s"), "{s}");
        let row = s.lines().find(|l| l.starts_with("blk0-q0")).expect(&s);
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "blk0-q0", "99", "10.0", "0.0", "90.0", "0.0", "0.0", "1500", "500", "0", "50000",
                "-"
            ],
            "{s}"
        );
    }
}

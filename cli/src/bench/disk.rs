//! `ppa-vmm bench disk` (spec section 9, issue 35): what a 4 KiB request through our
//! virtio-blk device costs against the floor of a host loop doing the same `pwrite`s and
//! `pread`s on the same file.
//!
//! Everything runs on the calling thread, on one file of `blocks` 4 KiB blocks in the
//! temporary directory (`TMPDIR`, else /tmp), removed at the end. Each round runs, in an
//! order that rotates: the tiny guest's `blk-write` of every block (up to 32 requests in
//! flight, then a FLUSH) against a loop that `pwrite`s each block in turn and then
//! `fdatasync`s; and the guest's `blk-verify` reading them back against a loop that `pread`s
//! each. The device's rate is blocks over the guest's own TSC time of its requests
//! (`blk_ns`: the first made available to the last given back; the FLUSH and the VM's start
//! are not in it), the loop's over its wall time (its `fdatasync` not in it either). CPU per
//! request: the device's request work (`cpu.req`: its thread's CPU clock over its passes,
//! the FLUSH's included) over its requests, against the loop thread's CPU clock (its
//! `fdatasync` included) over its calls. Results are medians of the rounds' ratios with the
//! lowest and highest round beside them, and the host's steal over the run. The goal
//! (issue 35): the device at 0.8 of the loop's requests per second or better, reads and
//! writes together.
//!
//! Placement: as `bench net` does ([`super::quiet::Layout`]), where the process may use two
//! CPUs or more, the disk's queue thread and the host loops run on the least busy CPU, the
//! vCPU and the VMM's service threads on the least busy other; each VM runs on a thread of its
//! own ([`super::run_apart`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;

use ppa_guest_abi::{blk_pattern, BLK_BLOCK};
use ppa_vmm::accounting::host::{host_steal_ns, thread_cpu_ns};
use ppa_vmm::config::RunOptions;
use ppa_vmm::vm::VmError;
use ppa_vmm_api::BlkRequestKind;

use super::net::vm;
use super::quiet::{self, Layout};
use super::Spread;

/// Requests the guest keeps in flight.
const DEPTH: u64 = 32;
/// The goal: the device answers at least this share of the loop's requests per second.
const GOAL_RATIO: f64 = 0.8;

/// Why the bench could not run.
#[derive(Debug, Error)]
pub enum DiskBenchError {
    /// A VM could not be built or run.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The bench's file.
    #[error("cannot {0} the bench's disk file {1}")]
    File(&'static str, PathBuf, #[source] io::Error),
    /// A run did not do what it was asked.
    #[error("a {0} run through the device did not complete: {1}")]
    Incomplete(&'static str, String),
}

/// Options of `bench disk`.
#[derive(Debug, Clone, Copy)]
pub struct DiskOptions {
    /// 4 KiB blocks per run.
    pub blocks: u64,
    /// Alternated rounds.
    pub rounds: usize,
    /// The disk's `poll_us=`.
    pub poll_us: u32,
}

/// What `bench disk` measured (medians over the rounds).
#[derive(Debug, Clone, Serialize)]
pub struct DiskResult {
    /// Blocks per run.
    pub blocks_per_run: u64,
    /// Rounds.
    pub rounds: usize,
    /// Writes per second through the device.
    pub write_device_iops: f64,
    /// Writes per second of the host loop.
    pub write_raw_iops: f64,
    /// Their ratio, round by round.
    pub write_device_over_raw: Spread,
    /// Reads per second through the device.
    pub read_device_iops: f64,
    /// Reads per second of the host loop.
    pub read_raw_iops: f64,
    /// Their ratio, round by round.
    pub read_device_over_raw: Spread,
    /// Reads and writes together: the device's requests per second over the loop's (the
    /// verdict's figure), round by round.
    pub device_over_raw: Spread,
    /// The device's CPU of request work per request (writes and their FLUSH), ns.
    pub write_device_cpu_ns_per_request: u64,
    /// The loop's CPU per `pwrite` (its `fdatasync` included), ns.
    pub write_raw_cpu_ns_per_request: u64,
    /// The device's CPU polling its emptied ring per write (with `poll_us`), ns.
    pub write_device_poll_cpu_ns_per_request: u64,
    /// The device's CPU polling its emptied ring per read, ns.
    pub read_device_poll_cpu_ns_per_request: u64,
    /// The disk's `poll_us=` (0: no polling).
    pub poll_us: u32,
    /// The device's CPU of request work per read, ns.
    pub read_device_cpu_ns_per_request: u64,
    /// The loop's CPU per `pread`, ns.
    pub read_raw_cpu_ns_per_request: u64,
    /// The device's writes per file call (merged: docs/design.md).
    pub write_requests_per_call: f64,
    /// The device's reads per file call.
    pub read_requests_per_call: f64,
    /// The device's service time of a write, p50 and p99 (the last round), ns.
    pub write_service_p50_p99_ns: (u64, u64),
    /// The device's service time of a read, p50 and p99 (the last round), ns.
    pub read_service_p50_p99_ns: (u64, u64),
    /// Steal of the host's CPUs over the bench, ns (None: not readable).
    pub host_steal_ns: Option<u64>,
    /// Where the threads ran: `measured`, the disk's queue thread and the host loops; `rest`,
    /// the vCPU and the VMM's service threads. Null when nothing was pinned.
    pub layout: Option<Layout>,
    /// `pass`, or `fail: ...` with what missed the goal.
    pub verdict: String,
}

/// One run: requests per second, CPU per request, service p50 and p99 and requests per file
/// call (device only).
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    iops: f64,
    cpu: u64,
    service: (u64, u64),
    per_call: f64,
    poll_cpu: u64,
}

/// The tiny guest's `workload` on the disk `disk` (a `--disk` value): its rate, CPU per
/// request and the service times of its requests of `kind`.
fn device_run(
    disk: &str,
    workload: &str,
    kind: BlkRequestKind,
    layout: Option<Layout>,
) -> Result<Run, DiskBenchError> {
    let out = super::run_apart(vm(RunOptions {
        vcpus: Some(1),
        pin: pins(layout),
        disk: vec![disk.to_string()],
        workload: vec![workload.to_string()],
        ..Default::default()
    })?)?;
    let r = &out.report;
    let what = if kind == BlkRequestKind::Write {
        "write"
    } else {
        "read"
    };
    let (Some(v), Some(dev)) = (r.vcpus.first(), r.devices.first()) else {
        return Err(DiskBenchError::Incomplete(
            what,
            "no vCPU or no device".into(),
        ));
    };
    let reported = |k: &str| {
        v.tiny()
            .and_then(|t| t.guest_reported.get(k).copied())
            .unwrap_or(0)
    };
    let (blocks, errors, ns) = (
        reported("blk_blocks"),
        reported("blk_errors"),
        reported("blk_ns"),
    );
    let b = dev.blk.as_ref();
    let requests = b.map_or(0, |b| b.requests.values().sum::<u64>());
    let moved = b.map_or(0, |b| {
        [BlkRequestKind::Read, BlkRequestKind::Write]
            .iter()
            .filter_map(|k| b.requests.get(k))
            .sum::<u64>()
    });
    let calls = moved.saturating_sub(b.map_or(0, |b| b.merged)).max(1);
    if blocks == 0 || errors > 0 || ns == 0 {
        return Err(DiskBenchError::Incomplete(
            what,
            format!("{blocks} blocks, {errors} errors, {ns} ns"),
        ));
    }
    let service = dev
        .service
        .as_ref()
        .and_then(|s| s.get(&kind))
        .map_or((0, 0), |h| (h.p50, h.p99));
    Ok(Run {
        iops: blocks as f64 * 1e9 / ns as f64,
        cpu: dev.cpu.req / requests.max(1),
        service,
        per_call: moved as f64 / calls as f64,
        poll_cpu: dev.cpu.poll / requests.max(1),
    })
}

/// The `--pin` rules of a bench VM: its disk (`blk0`) on the measured CPU, the vCPU and the
/// service threads on the other.
fn pins(layout: Option<Layout>) -> Vec<String> {
    layout.map_or_else(Vec::new, |l| {
        vec![
            format!("vcpus={}", l.rest),
            format!("service={}", l.rest),
            format!("blk0={}", l.measured),
        ]
    })
}

/// The host loop, on the measured CPU: every block written with its pattern (then
/// `fdatasync`), or read.
fn raw_run(file: &File, blocks: u64, write: bool, layout: Option<Layout>) -> io::Result<Run> {
    let _pinned = quiet::Pinned::to(layout.map(|l| l.measured));
    let mut buf = vec![0u8; BLK_BLOCK as usize];
    let patterns: Vec<Vec<u8>> = if write {
        (0..blocks).map(block_bytes).collect()
    } else {
        Vec::new()
    };
    let cpu0 = thread_cpu_ns();
    let t0 = Instant::now();
    for i in 0..blocks {
        if write {
            file.write_all_at(&patterns[i as usize], i * BLK_BLOCK)?;
        } else {
            file.read_exact_at(&mut buf, i * BLK_BLOCK)?;
        }
    }
    let ns = t0.elapsed().as_nanos().max(1) as f64;
    if write {
        file.sync_data()?;
    }
    let cpu = thread_cpu_ns().saturating_sub(cpu0);
    Ok(Run {
        iops: blocks as f64 * 1e9 / ns,
        cpu: cpu / blocks.max(1),
        service: (0, 0),
        per_call: 1.0,
        poll_cpu: 0,
    })
}

/// Block `i` as the guest writes it.
fn block_bytes(i: u64) -> Vec<u8> {
    (0..BLK_BLOCK / 8)
        .flat_map(|w| blk_pattern(i, w).to_le_bytes())
        .collect()
}

/// The runs of one round: (device write, loop write, device read, loop read).
fn round(
    path: &Path,
    file: &File,
    disk: &str,
    blocks: u64,
    device_first: bool,
    layout: Option<Layout>,
) -> Result<[Run; 4], DiskBenchError> {
    let io = |e| DiskBenchError::File("write or read", path.to_path_buf(), e);
    let dev_w = || {
        device_run(
            disk,
            &format!("blk-write:blocks={blocks},depth={DEPTH}"),
            BlkRequestKind::Write,
            layout,
        )
    };
    let dev_r = || {
        device_run(
            disk,
            &format!("blk-verify:blocks={blocks},depth={DEPTH},check=sectors"),
            BlkRequestKind::Read,
            layout,
        )
    };
    let raw = |write| raw_run(file, blocks, write, layout).map_err(io);
    Ok(if device_first {
        let w = dev_w()?;
        let rw = raw(true)?;
        let r = dev_r()?;
        [w, rw, r, raw(false)?]
    } else {
        let rw = raw(true)?;
        let w = dev_w()?;
        let rr = raw(false)?;
        [w, rw, dev_r()?, rr]
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs `bench disk`.
pub fn disk(o: DiskOptions) -> Result<DiskResult, DiskBenchError> {
    let path = std::env::temp_dir().join(format!("ppa-bench-disk-{}.img", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| DiskBenchError::File("create", path.clone(), e))?;
    let r = file
        .set_len(o.blocks.max(1) * BLK_BLOCK)
        .map_err(|e| DiskBenchError::File("size", path.clone(), e))
        .and_then(|()| rounds(&path, &file, o));
    drop(file);
    let _ = std::fs::remove_file(&path);
    r
}

fn rounds(path: &Path, file: &File, o: DiskOptions) -> Result<DiskResult, DiskBenchError> {
    let layout = Layout::of(&quiet::busy_ticks(200));
    let blocks = o.blocks.max(1);
    // Every block written once and made durable before the first round: otherwise the
    // first writer of the first round alone pays for the file's blocks and page-cache pages.
    raw_run(file, blocks, true, None)
        .map_err(|e| DiskBenchError::File("fill", path.to_path_buf(), e))?;
    let steal0 = host_steal_ns();
    let disk = format!("path={},poll_us={}", path.display(), o.poll_us);
    let mut runs: Vec<[Run; 4]> = Vec::new();
    for i in 0..o.rounds.max(1) {
        runs.push(round(path, file, &disk, blocks, i % 2 == 0, layout)?);
    }
    let col = |k: usize, f: fn(&Run) -> f64| median(runs.iter().map(|r| f(&r[k])).collect());
    let ratio = |d: usize, r: usize| -> Vec<f64> {
        runs.iter()
            .map(|x| x[d].iops / x[r].iops.max(1e-9))
            .collect()
    };
    // Together: the time of both runs, each way, for the same requests.
    let both: Vec<f64> = runs
        .iter()
        .map(|x| (1.0 / x[1].iops + 1.0 / x[3].iops) / (1.0 / x[0].iops + 1.0 / x[2].iops))
        .collect();
    let last = runs.last().copied().unwrap_or_default();
    let mut r = DiskResult {
        blocks_per_run: blocks,
        rounds: runs.len(),
        write_device_iops: col(0, |r| r.iops),
        write_raw_iops: col(1, |r| r.iops),
        write_device_over_raw: Spread::of(&ratio(0, 1)),
        read_device_iops: col(2, |r| r.iops),
        read_raw_iops: col(3, |r| r.iops),
        read_device_over_raw: Spread::of(&ratio(2, 3)),
        device_over_raw: Spread::of(&both),
        write_device_cpu_ns_per_request: col(0, |r| r.cpu as f64) as u64,
        write_raw_cpu_ns_per_request: col(1, |r| r.cpu as f64) as u64,
        read_device_cpu_ns_per_request: col(2, |r| r.cpu as f64) as u64,
        read_raw_cpu_ns_per_request: col(3, |r| r.cpu as f64) as u64,
        write_device_poll_cpu_ns_per_request: col(0, |r| r.poll_cpu as f64) as u64,
        read_device_poll_cpu_ns_per_request: col(2, |r| r.poll_cpu as f64) as u64,
        poll_us: o.poll_us,
        write_requests_per_call: col(0, |r| r.per_call),
        read_requests_per_call: col(2, |r| r.per_call),
        write_service_p50_p99_ns: last[0].service,
        read_service_p50_p99_ns: last[2].service,
        host_steal_ns: steal0
            .zip(host_steal_ns())
            .map(|(a, b)| b.saturating_sub(a)),
        layout,
        verdict: String::new(),
    };
    r.verdict = if r.device_over_raw.median >= GOAL_RATIO {
        "pass".to_string()
    } else {
        format!(
            "fail: device/raw {:.3} < {GOAL_RATIO}",
            r.device_over_raw.median
        )
    };
    Ok(r)
}

impl DiskResult {
    /// The table's lines for writes (`write`) or reads.
    fn way(&self, write: bool) -> String {
        let (name, d, dc, r, rc, s, svc, per_call, poll) = if write {
            (
                "write (the tiny guest's blk-write; the loop pwrites the same blocks, then fdatasync)",
                self.write_device_iops,
                self.write_device_cpu_ns_per_request,
                self.write_raw_iops,
                self.write_raw_cpu_ns_per_request,
                &self.write_device_over_raw,
                self.write_service_p50_p99_ns,
                self.write_requests_per_call,
                self.write_device_poll_cpu_ns_per_request,
            )
        } else {
            (
                "read (the tiny guest's blk-verify, check=sectors; the loop preads them)",
                self.read_device_iops,
                self.read_device_cpu_ns_per_request,
                self.read_raw_iops,
                self.read_raw_cpu_ns_per_request,
                &self.read_device_over_raw,
                self.read_service_p50_p99_ns,
                self.read_requests_per_call,
                self.read_device_poll_cpu_ns_per_request,
            )
        };
        let polled = if self.poll_us > 0 {
            format!(" + {poll} ns polling")
        } else {
            String::new()
        };
        format!(
            "{name}\n  {:<28} {:>10.0} requests/s  {:>6} ns CPU/request (mean){polled}  {:.1} requests a file call  service p50 {:.1} us, p99 {:.1} us\n  \
             {:<28} {:>10.0} requests/s  {:>6} ns CPU/request\n  \
             device/raw {:.3} (rounds {:.3} to {:.3})\n",
            "through the device",
            d,
            dc,
            per_call,
            svc.0 as f64 / 1e3,
            svc.1 as f64 / 1e3,
            "host loop on the file",
            r,
            rc,
            s.median,
            s.min,
            s.max
        )
    }

    /// The human table.
    pub fn to_text(&self) -> String {
        format!(
            "virtio-blk{}, {} 4 KiB blocks per run each way ({DEPTH} in flight in the guest), median of {} alternated rounds\n\
             threads: {}\n{}{}\
             reads and writes together: device/raw {:.3} (rounds {:.3} to {:.3}; goal >= {GOAL_RATIO})\n\
             host steal during the bench: {}\nverdict: {}\n",
            if self.poll_us > 0 {
                format!(" (poll_us={})", self.poll_us)
            } else {
                String::new()
            },
            self.blocks_per_run,
            self.rounds,
            Layout::describe(
                self.layout,
                "the disk's queue thread and the host loops",
                "the vCPU and the VMM's service threads"
            ),
            self.way(true),
            self.way(false),
            self.device_over_raw.median,
            self.device_over_raw.min,
            self.device_over_raw.max,
            self.host_steal_ns
                .map_or("unknown".to_string(), |s| format!("{:.1} ms", s as f64 / 1e6)),
            self.verdict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_the_guests_pattern() {
        let b = block_bytes(3);
        assert_eq!(b.len(), 4096);
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            blk_pattern(3, 1)
        );
    }

    #[test]
    fn the_text_names_both_ways_and_the_verdict() {
        let s = Spread {
            median: 0.9,
            p25: 0.85,
            p75: 0.95,
            min: 0.8,
            max: 1.0,
        };
        let r = DiskResult {
            blocks_per_run: 4096,
            rounds: 3,
            write_device_iops: 200_000.0,
            write_raw_iops: 250_000.0,
            write_device_over_raw: s,
            read_device_iops: 300_000.0,
            read_raw_iops: 320_000.0,
            read_device_over_raw: s,
            device_over_raw: s,
            write_device_cpu_ns_per_request: 3000,
            write_raw_cpu_ns_per_request: 2500,
            read_device_cpu_ns_per_request: 2000,
            read_raw_cpu_ns_per_request: 1800,
            write_requests_per_call: 1.0,
            read_requests_per_call: 7.5,
            write_device_poll_cpu_ns_per_request: 0,
            read_device_poll_cpu_ns_per_request: 0,
            poll_us: 0,
            write_service_p50_p99_ns: (5000, 20000),
            read_service_p50_p99_ns: (4000, 9000),
            host_steal_ns: Some(1_000_000),
            layout: Some(Layout {
                measured: 1,
                rest: 0,
            }),
            verdict: "pass".into(),
        };
        let t = r.to_text();
        assert!(
            t.contains("threads: the disk's queue thread and the host loops on CPU 1, the vCPU and the VMM's service threads on CPU 0"),
            "{t}"
        );
        assert_eq!(pins(r.layout), ["vcpus=0", "service=0", "blk0=1"]);
        assert!(pins(None).is_empty());
        assert!(
            t.contains("reads and writes together: device/raw 0.900"),
            "{t}"
        );
        assert!(t.contains("write (") && t.contains("read ("), "{t}");
        assert!(
            t.contains("1.0 requests a file call") && t.contains("7.5 requests a file call"),
            "{t}"
        );
        assert!(
            !t.contains("polling") && t.starts_with("virtio-blk, "),
            "{t}"
        );
        let polled = DiskResult {
            poll_us: 50,
            read_device_poll_cpu_ns_per_request: 420,
            ..r.clone()
        }
        .to_text();
        assert!(polled.starts_with("virtio-blk (poll_us=50), "), "{polled}");
        assert!(polled.contains("(mean) + 420 ns polling"), "{polled}");
        assert!(t.ends_with("verdict: pass\n"), "{t}");
    }
}

//! `ppa-vmm bench net` (spec section 9): what moving a frame through our virtio-net device
//! costs, each way, against the floor of a host loop doing the same tap I/O.
//!
//! Everything runs on one thread that first makes a network namespace of its own
//! (`unshare(CLONE_NEWNET)`: the VMs it starts, and their threads, are in it too), with a
//! persistent tap `ppabench0` up in it: no frame can leave the machine, and the namespace and
//! the tap go with the thread. Each round runs, in an order that rotates: the tiny guest's
//! `net-tx` of `packets` 64-byte frames through the device into the tap (frames per second
//! over the vCPU's life, the device's mean CPU per frame) against a host loop writing the same
//! frame, with its virtio header, into the tap `packets` times; the receive runs of [`rx`]
//! (frames waiting at the tap drained into the guest, against a loop reading them); and the
//! same `exits` workload at accounting basic with and without an idle network device (nothing
//! drives it), which must cost the same. Then one `net-echo` VM answers `echoes` frames sent
//! one at a time from a packet socket on the tap: the round trips' p50 and p99. Results are
//! medians of the rounds' ratios with the lowest and highest round beside them, and the host's
//! steal over the run. The goals (issue 34): at least 0.9 of the loop's frames per second and
//! at most 1.1 times its CPU a frame, each way.
//!
//! Placement ([`Layout`]): where the process may use two CPUs or more, the bench places the
//! threads as an NFV host does with `--pin` (issue 36): the device's threads alone on the least
//! busy CPU (the data path), where the host loops also run; the vCPU, the VMM's service
//! threads and the bench's thread while it polls a receive run on another. Unpinned on the 2-CPU development host, the
//! vCPU's polling, the service threads and the bench shared the device thread's CPU, which the
//! loop, alone, never did (docs/design.md, "Batched through io_uring").

use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use ppa_vmm::accounting::host::host_steal_ns;
use ppa_vmm::accounting::Level;
use ppa_vmm::config::RunOptions;
use ppa_vmm::devices::net::tap::{self, Tap, TapError, VNET_HDR_LEN};
use ppa_vmm::vm::{RunOutcome, Vm, VmError};

pub mod packet;
pub mod rx;

use super::quiet::{self, Layout};

use packet::{test_frame, PacketSocket};

/// The bench's tap, inside its own namespace.
pub(crate) const TAP: &str = "ppabench0";

/// Why the bench could not run.
#[derive(Debug, Error)]
pub enum NetBenchError {
    /// A VM could not be built or run.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The tap could not be made.
    #[error(transparent)]
    Tap(#[from] TapError),
    /// The namespace, the tap's link or the packet socket.
    #[error("cannot {0} (the bench needs root: CAP_SYS_ADMIN for its own network namespace, CAP_NET_ADMIN and CAP_NET_RAW in it)")]
    Setup(&'static str, #[source] io::Error),
    /// The guest's driver never started the device.
    #[error("the guest never started its network device")]
    NoDriver,
    /// A run could not be measured as planned.
    #[error("a receive run could not be measured: {0}")]
    Slow(&'static str),
}

/// Options of `bench net`.
#[derive(Debug, Clone, Copy)]
pub struct NetOptions {
    /// Frames per transmit run.
    pub packets: u64,
    /// Rounds.
    pub rounds: usize,
    /// Echo round trips.
    pub echoes: u64,
    /// Exits per overhead run (with and without an idle device).
    pub exits: u64,
}

/// Result of `bench net`; `verdict` is last.
#[derive(Debug, Clone, Serialize)]
pub struct NetResult {
    /// Frames per run (each way).
    pub packets_per_run: u64,
    /// Rounds.
    pub rounds: usize,
    /// Transmit: frames per second through the device (median).
    pub device_pps: f64,
    /// Transmit: frames per second from the host loop into the tap (median).
    pub raw_pps: f64,
    /// Transmit: the median of each round's device / raw.
    pub device_over_raw: f64,
    /// Transmit: the lowest round's device / raw.
    pub device_over_raw_min: f64,
    /// Transmit: the highest round's device / raw.
    pub device_over_raw_max: f64,
    /// Transmit: the device's mean CPU per frame, ns (median).
    pub device_cpu_ns_per_packet: u64,
    /// Transmit: the host loop's CPU per frame, ns (median): the floor of the same write.
    pub raw_cpu_ns_per_packet: u64,
    /// Transmit: the median of each round's device CPU per frame over the loop's.
    pub cpu_ratio: f64,
    /// Receive: frames per second the device drained from the tap into the guest (median).
    pub rx_device_pps: f64,
    /// Receive: frames per second a host loop read from the tap (median).
    pub rx_raw_pps: f64,
    /// Receive: the median of each round's device / raw.
    pub rx_device_over_raw: f64,
    /// Receive: the lowest round's device / raw.
    pub rx_device_over_raw_min: f64,
    /// Receive: the highest round's device / raw.
    pub rx_device_over_raw_max: f64,
    /// Receive: the device's mean CPU per frame, ns (median).
    pub rx_device_cpu_ns_per_packet: u64,
    /// Receive: the host loop's CPU per frame, ns (median).
    pub rx_raw_cpu_ns_per_packet: u64,
    /// Receive: the median of each round's device CPU per frame over the loop's.
    pub rx_cpu_ratio: f64,
    /// Echo round trips measured.
    pub echoes: u64,
    /// Echo round trip, median, µs.
    pub echo_p50_us: f64,
    /// Echo round trip, 99th percentile, µs.
    pub echo_p99_us: f64,
    /// Exit throughput with an idle network device over without (median of the rounds).
    pub idle_device_overhead_ratio: f64,
    /// Time this host lost to its own hypervisor during the bench, all CPUs.
    pub host_steal_ns: Option<u64>,
    /// Where the threads ran: `measured`, the device's threads and the host loops; `rest`, the
    /// vCPU, the VMM's service threads and the bench's poller. Null when nothing was pinned.
    pub layout: Option<Layout>,
    /// `pass`, or `fail: ...`.
    pub verdict: String,
}

/// The `--pin` rules of a bench VM, with its one network device (`net0`) or none: the
/// device's threads on the measured CPU, the vCPU and the service threads on the other.
fn pins(layout: Option<Layout>, device: bool) -> Vec<String> {
    layout.map_or_else(Vec::new, |l| {
        let mut pins = vec![format!("vcpus={}", l.rest), format!("service={}", l.rest)];
        if device {
            pins.push(format!("net0={}", l.measured));
        }
        pins
    })
}

/// The layout in words, for the text report.
fn describe(layout: Option<Layout>) -> String {
    Layout::describe(
        layout,
        "the device's threads and the host loops",
        "the vCPU, the VMM's service threads and the bench's poller",
    )
}

/// What each way's rounds gave.
#[derive(Default)]
struct Way {
    dev: Vec<f64>,
    raw: Vec<f64>,
    ratio: Vec<f64>,
    dev_cpu: Vec<f64>,
    raw_cpu: Vec<f64>,
    cpu_ratio: Vec<f64>,
}

impl Way {
    fn push(&mut self, (d, dc): Run, (r, rc): Run) {
        self.dev.push(d);
        self.raw.push(r);
        self.ratio.push(d / r.max(1.0));
        self.dev_cpu.push(dc as f64);
        self.raw_cpu.push(rc as f64);
        self.cpu_ratio.push(dc as f64 / (rc as f64).max(1.0));
    }

    fn spread(&self) -> (f64, f64) {
        let min = self.ratio.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.ratio.iter().copied().fold(0.0, f64::max);
        (if min.is_finite() { min } else { 0.0 }, max)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub(crate) fn vm(opts: RunOptions) -> Result<Vm, VmError> {
    let (config, _) = opts.into_config()?;
    Vm::try_from(config)
}

/// Builds a VM and runs it on a thread of its own ([`super::run_apart`]).
fn run_apart(opts: RunOptions) -> Result<RunOutcome, NetBenchError> {
    Ok(super::run_apart(vm(opts)?)?)
}

/// One transmit run through the device: (frames per second, device CPU per frame).
fn device_run(packets: u64, layout: Option<Layout>) -> Result<(f64, u64), NetBenchError> {
    let out = run_apart(RunOptions {
        vcpus: Some(1),
        pin: pins(layout, true),
        net: vec![format!("tap={TAP}")],
        workload: vec![format!("net-tx:packets={packets},size=64")],
        ..Default::default()
    })?;
    let r = &out.report;
    let dev = r.devices.first().ok_or(NetBenchError::NoDriver)?;
    let sent: u64 = dev
        .queues
        .iter()
        .filter(|q| q.kind == ppa_vmm_api::QueueKind::Tx)
        .map(|q| q.packets)
        .sum();
    let wall = r.vcpus.first().map_or(1, |v| v.times.wall_ns.max(1));
    let per = dev.cpu_ns_per_packet.and_then(|p| p.tx).unwrap_or(0);
    Ok((sent as f64 * 1e9 / wall as f64, per))
}

/// One host loop writing `packets` frames into the tap, on the data path's CPU: (frames per
/// second, CPU per frame).
fn raw_run(packets: u64, layout: Option<Layout>) -> Result<(f64, u64), NetBenchError> {
    let t = Tap::open(TAP, 1)?.remove(0);
    let _pinned = quiet::Pinned::to(layout.map(|l| l.measured));
    let mut buf = vec![0u8; VNET_HDR_LEN];
    buf.extend(test_frame([0xff; 6], [2, 0, 0, 0, 0, 1], 64, 0));
    let iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    let cpu0 = ppa_vmm::accounting::host::thread_cpu_ns();
    let t0 = Instant::now();
    let mut sent = 0u64;
    for _ in 0..packets {
        // SAFETY: the one iovec covers `buf`, alive and unchanged for the call.
        if unsafe { t.writev(&iov) }.is_ok() {
            sent += 1;
        }
    }
    let ns = t0.elapsed().as_nanos().max(1) as f64;
    let cpu = ppa_vmm::accounting::host::thread_cpu_ns() - cpu0;
    Ok((sent as f64 * 1e9 / ns, cpu / sent.max(1)))
}

/// Exit throughput at accounting basic, with or without an idle network device.
fn exits_run(exits: u64, device: bool, layout: Option<Layout>) -> Result<f64, NetBenchError> {
    let out = run_apart(RunOptions {
        vcpus: Some(1),
        pin: pins(layout, device),
        workload: vec![format!("exits:n={exits},kind=mmio")],
        accounting: Some(Level::Basic),
        net: if device {
            vec![format!("tap={TAP}")]
        } else {
            Vec::new()
        },
        ..Default::default()
    })?;
    let v = &out.report.vcpus[0];
    let total: u64 = v.times.exits.values().sum();
    Ok(total as f64 * 1e9 / v.times.wall_ns.max(1) as f64)
}

/// One `net-echo` VM answering `n` frames sent one at a time; the round trips in µs.
fn echo_run(n: u64, layout: Option<Layout>) -> Result<Vec<f64>, NetBenchError> {
    let vm = vm(RunOptions {
        vcpus: Some(1),
        pin: pins(layout, true),
        net: vec![format!("tap={TAP}")],
        workload: vec!["net-echo:ms=600000".to_string()],
        ..Default::default()
    })?;
    let handle = vm.handle();
    let runner = std::thread::spawn(move || vm.run());
    let started = (0..5000).any(|_| {
        std::thread::sleep(Duration::from_millis(2));
        handle
            .device_stats()
            .first()
            .is_some_and(|d| d.driver.activations > 0)
    });
    let mut rtts = Vec::with_capacity(n as usize);
    let result = if started {
        let s = PacketSocket::open(TAP, 1000)
            .map_err(|e| NetBenchError::Setup("open a packet socket", e))?;
        let mut buf = [0u8; 2048];
        for seq in 0..n {
            let f = test_frame([0xff; 6], s.mac, 64, seq);
            let t0 = Instant::now();
            if !s.send(&f) {
                continue;
            }
            while let Some(len) = s.recv(&mut buf) {
                let e = &buf[..len];
                if len >= 22 && e[..6] == s.mac && e[14..22] == seq.to_le_bytes() {
                    rtts.push(t0.elapsed().as_nanos() as f64 / 1e3);
                    break;
                }
            }
        }
        Ok(())
    } else {
        Err(NetBenchError::NoDriver)
    };
    handle.shutdown();
    runner.join().map_err(|_| NetBenchError::NoDriver)??;
    result.map(|()| rtts)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Makes the bench's tap, persistent and up, in the calling thread's namespace.
fn make_tap() -> Result<(), NetBenchError> {
    let t = Tap::open(TAP, 1)?;
    t[0].set_persist(true)?;
    drop(t);
    tap::set_up(TAP).map_err(|e| NetBenchError::Setup("bring the bench's tap up", e))
}

/// Runs `bench net`.
pub fn net(o: NetOptions) -> Result<NetResult, NetBenchError> {
    std::thread::Builder::new()
        .name("bench-net".into())
        .spawn(move || {
            // SAFETY: unshare takes a flag; it gives this thread (and the threads it starts) a
            // network namespace of its own, which goes when they have all ended.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(NetBenchError::Setup(
                    "make a network namespace",
                    io::Error::last_os_error(),
                ));
            }
            make_tap()?;
            let layout = Layout::of(&quiet::busy_ticks(200));
            let r = rounds(o, layout);
            if let Ok(t) = Tap::open(TAP, 1) {
                let _ = t[0].set_persist(false);
            }
            r
        })
        .map_err(|e| NetBenchError::Setup("start the bench thread", e))?
        .join()
        .map_err(|_| NetBenchError::NoDriver)?
}

/// One run's frames per second and CPU per frame, ns.
type Run = (f64, u64);

/// One round of receive runs, device and loop in the order `first_device` says.
fn rx_round(
    packets: u64,
    first_device: bool,
    layout: Option<Layout>,
) -> Result<(Run, Run), NetBenchError> {
    let run_dev = || rx::device_run(packets, layout).map(|(p, c, _)| (p, c));
    let run_raw = || rx::raw_run(packets, layout).map(|(p, c, _)| (p, c));
    if first_device {
        let d = run_dev()?;
        Ok((d, run_raw()?))
    } else {
        let r = run_raw()?;
        Ok((run_dev()?, r))
    }
}

fn rounds(o: NetOptions, layout: Option<Layout>) -> Result<NetResult, NetBenchError> {
    let steal0 = host_steal_ns();
    let (mut tx, mut rxw, mut idle) = (Way::default(), Way::default(), vec![]);
    for round in 0..o.rounds.max(1) {
        let even = round % 2 == 0;
        let (d, r) = if even {
            let d = device_run(o.packets, layout)?;
            (d, raw_run(o.packets, layout)?)
        } else {
            let r = raw_run(o.packets, layout)?;
            (device_run(o.packets, layout)?, r)
        };
        tx.push(d, r);
        let (d, r) = rx_round(o.packets, !even, layout)?;
        rxw.push(d, r);
        let (with, without) = if even {
            let w = exits_run(o.exits, true, layout)?;
            (w, exits_run(o.exits, false, layout)?)
        } else {
            let wo = exits_run(o.exits, false, layout)?;
            (exits_run(o.exits, true, layout)?, wo)
        };
        idle.push(with / without.max(1.0));
    }
    let mut rtts = echo_run(o.echoes, layout)?;
    rtts.sort_by(f64::total_cmp);
    let (tx_min, tx_max) = tx.spread();
    let (rx_min, rx_max) = rxw.spread();
    let r = NetResult {
        packets_per_run: o.packets,
        rounds: o.rounds.max(1),
        device_pps: median(tx.dev.clone()),
        raw_pps: median(tx.raw.clone()),
        device_over_raw: median(tx.ratio.clone()),
        device_over_raw_min: tx_min,
        device_over_raw_max: tx_max,
        device_cpu_ns_per_packet: median(tx.dev_cpu.clone()) as u64,
        raw_cpu_ns_per_packet: median(tx.raw_cpu.clone()) as u64,
        cpu_ratio: median(tx.cpu_ratio.clone()),
        rx_device_pps: median(rxw.dev.clone()),
        rx_raw_pps: median(rxw.raw.clone()),
        rx_device_over_raw: median(rxw.ratio.clone()),
        rx_device_over_raw_min: rx_min,
        rx_device_over_raw_max: rx_max,
        rx_device_cpu_ns_per_packet: median(rxw.dev_cpu.clone()) as u64,
        rx_raw_cpu_ns_per_packet: median(rxw.raw_cpu.clone()) as u64,
        rx_cpu_ratio: median(rxw.cpu_ratio.clone()),
        echoes: rtts.len() as u64,
        echo_p50_us: percentile(&rtts, 0.5),
        echo_p99_us: percentile(&rtts, 0.99),
        idle_device_overhead_ratio: median(idle),
        host_steal_ns: steal0
            .zip(host_steal_ns())
            .map(|(a, b)| b.saturating_sub(a)),
        layout,
        verdict: String::new(),
    };
    let mut misses = Vec::new();
    for (way, ratio, cpu) in [
        ("transmit", r.device_over_raw, r.cpu_ratio),
        ("receive", r.rx_device_over_raw, r.rx_cpu_ratio),
    ] {
        if ratio < GOAL_RATIO {
            misses.push(format!("{way} device/raw {ratio:.3} < {GOAL_RATIO}"));
        }
        if cpu > GOAL_CPU {
            misses.push(format!(
                "{way} CPU a frame {cpu:.3}x the loop's > {GOAL_CPU}"
            ));
        }
    }
    if (rtts.len() as u64) < o.echoes {
        misses.push(format!("{} of {} echoes came back", rtts.len(), o.echoes));
    }
    Ok(NetResult {
        verdict: if misses.is_empty() {
            "pass".to_string()
        } else {
            format!("fail: {}", misses.join(", "))
        },
        ..r
    })
}

/// The goal: the device moves at least this share of the raw loop's frames per second.
const GOAL_RATIO: f64 = 0.9;
/// The goal: the device's CPU a frame is at most this many times the raw loop's.
const GOAL_CPU: f64 = 1.1;

impl NetResult {
    /// The human table.
    pub fn to_text(&self) -> String {
        let way =
            |name: &str, d: f64, dc: u64, r: f64, rc: u64, ratio: (f64, f64, f64), cpu: f64| {
                format!(
                    "{name}\n  {:<28} {:>12.0} frames/s  {:>6} ns CPU/frame (mean)\n  \
                 {:<28} {:>12.0} frames/s  {:>6} ns CPU/frame\n  \
                 device/raw {:.3} (rounds {:.3} to {:.3}; goal >= {GOAL_RATIO}), \
                 CPU a frame {:.3}x the loop's (goal <= {GOAL_CPU})\n",
                    "through the device",
                    d,
                    dc,
                    "host loop on the tap",
                    r,
                    rc,
                    ratio.0,
                    ratio.1,
                    ratio.2,
                    cpu
                )
            };
        format!(
            "virtio-net, {} 64-byte frames per run each way, median of {} alternated rounds\n\
             threads: {}\n{}{}\
             echo round trip over {} frames: p50 {:.1} us, p99 {:.1} us\n\
             exits/s with an idle device / without: {:.4}\n\
             host steal during the bench: {}\nverdict: {}\n",
            self.packets_per_run,
            self.rounds,
            describe(self.layout),
            way(
                "transmit (the tiny guest's net-tx into the tap; the loop writes the same frame)",
                self.device_pps,
                self.device_cpu_ns_per_packet,
                self.raw_pps,
                self.raw_cpu_ns_per_packet,
                (self.device_over_raw, self.device_over_raw_min, self.device_over_raw_max),
                self.cpu_ratio
            ),
            way(
                "receive (frames waiting at the tap drained into the tiny guest; the loop reads them)",
                self.rx_device_pps,
                self.rx_device_cpu_ns_per_packet,
                self.rx_raw_pps,
                self.rx_raw_cpu_ns_per_packet,
                (
                    self.rx_device_over_raw,
                    self.rx_device_over_raw_min,
                    self.rx_device_over_raw_max
                ),
                self.rx_cpu_ratio
            ),
            self.echoes,
            self.echo_p50_us,
            self.echo_p99_us,
            self.idle_device_overhead_ratio,
            self.host_steal_ns
                .map_or("unknown".to_string(), |s| format!(
                    "{:.1} ms",
                    s as f64 / 1e6
                )),
            self.verdict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_gets_the_measured_cpu_and_the_vcpu_the_other() {
        let l = Layout {
            measured: 1,
            rest: 2,
        };
        assert_eq!(
            pins(Some(l), true),
            ["vcpus=2", "service=2", "net0=1"].map(String::from)
        );
        assert_eq!(
            pins(Some(l), false),
            ["vcpus=2", "service=2"].map(String::from)
        );
        // One CPU: nothing is pinned, and the report says so.
        assert!(pins(None, true).is_empty());
        assert!(describe(None).contains("not pinned"));
    }
}

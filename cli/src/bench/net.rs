//! `ppa-vmm bench net` (spec section 9): what moving a frame through our virtio-net device
//! costs, against the floor of writing the same frame into a tap from a host loop.
//!
//! Everything runs on one thread that first makes a network namespace of its own
//! (`unshare(CLONE_NEWNET)`: the VMs it starts, and their threads, are in it too), with a
//! persistent tap `ppabench0` up in it: no frame can leave the machine, and the namespace and
//! the tap go with the thread. Each round runs, in an order that rotates: the tiny guest's
//! `net-tx` of `packets` 64-byte frames through the device into the tap (frames per second
//! over the vCPU's life, the device's CPU per frame); a host loop writing the same frame, with
//! its virtio header, into the tap `packets` times (the floor); and the same `exits` workload at
//! accounting basic with and without an idle network device (nothing drives it), which must
//! cost the same. Then one `net-echo` VM answers `echoes` frames sent one at a time from a
//! packet socket on the tap: the round trips' p50 and p99. Results are medians of the rounds'
//! ratios, with the host's steal over the run beside them.

use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use ppa_vmm::accounting::host::host_steal_ns;
use ppa_vmm::accounting::Level;
use ppa_vmm::config::RunOptions;
use ppa_vmm::devices::net::tap::{self, Tap, TapError, VNET_HDR_LEN};
use ppa_vmm::vm::{Vm, VmError};

pub mod packet;

use packet::{test_frame, PacketSocket};

/// The bench's tap, inside its own namespace.
const TAP: &str = "ppabench0";

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
    /// Frames per transmit run.
    pub packets_per_run: u64,
    /// Rounds.
    pub rounds: usize,
    /// Frames per second through the device (median).
    pub device_pps: f64,
    /// Frames per second from the host loop into the tap (median).
    pub raw_pps: f64,
    /// The median of each round's device / raw.
    pub device_over_raw: f64,
    /// The device's CPU per transmitted frame, ns (median).
    pub device_cpu_ns_per_packet: u64,
    /// The host loop's CPU per frame, ns (median): the floor of the same write.
    pub raw_cpu_ns_per_packet: u64,
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
    /// `pass`, or `fail: ...`.
    pub verdict: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn vm(opts: RunOptions) -> Result<Vm, VmError> {
    let (config, _) = opts.into_config()?;
    Vm::try_from(config)
}

/// One transmit run through the device: (frames per second, device CPU per frame).
fn device_run(packets: u64) -> Result<(f64, u64), NetBenchError> {
    let out = vm(RunOptions {
        vcpus: Some(1),
        net: vec![format!("tap={TAP}")],
        workload: vec![format!("net-tx:packets={packets},size=64")],
        ..Default::default()
    })?
    .run()?;
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

/// One host loop writing `packets` frames into the tap: (frames per second, CPU per frame).
fn raw_run(packets: u64) -> Result<(f64, u64), NetBenchError> {
    let t = Tap::open(TAP, 1)?.remove(0);
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
fn exits_run(exits: u64, device: bool) -> Result<f64, NetBenchError> {
    let out = vm(RunOptions {
        vcpus: Some(1),
        workload: vec![format!("exits:n={exits},kind=mmio")],
        accounting: Some(Level::Basic),
        net: if device {
            vec![format!("tap={TAP}")]
        } else {
            Vec::new()
        },
        ..Default::default()
    })?
    .run()?;
    let v = &out.report.vcpus[0];
    let total: u64 = v.times.exits.values().sum();
    Ok(total as f64 * 1e9 / v.times.wall_ns.max(1) as f64)
}

/// One `net-echo` VM answering `n` frames sent one at a time; the round trips in µs.
fn echo_run(n: u64) -> Result<Vec<f64>, NetBenchError> {
    let vm = vm(RunOptions {
        vcpus: Some(1),
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
            let r = rounds(o);
            if let Ok(t) = Tap::open(TAP, 1) {
                let _ = t[0].set_persist(false);
            }
            r
        })
        .map_err(|e| NetBenchError::Setup("start the bench thread", e))?
        .join()
        .map_err(|_| NetBenchError::NoDriver)?
}

fn rounds(o: NetOptions) -> Result<NetResult, NetBenchError> {
    let steal0 = host_steal_ns();
    let (mut dev, mut raw, mut ratio, mut dev_cpu, mut raw_cpu, mut idle) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..o.rounds.max(1) {
        let ((d, dc), (r, rc)) = if round % 2 == 0 {
            let d = device_run(o.packets)?;
            (d, raw_run(o.packets)?)
        } else {
            let r = raw_run(o.packets)?;
            (device_run(o.packets)?, r)
        };
        let (with, without) = if round % 2 == 0 {
            let w = exits_run(o.exits, true)?;
            (w, exits_run(o.exits, false)?)
        } else {
            let wo = exits_run(o.exits, false)?;
            (exits_run(o.exits, true)?, wo)
        };
        dev.push(d);
        raw.push(r);
        ratio.push(d / r.max(1.0));
        dev_cpu.push(dc as f64);
        raw_cpu.push(rc as f64);
        idle.push(with / without.max(1.0));
    }
    let mut rtts = echo_run(o.echoes)?;
    rtts.sort_by(f64::total_cmp);
    let device_over_raw = median(ratio);
    let mut misses = Vec::new();
    if device_over_raw < 0.8 {
        misses.push(format!("device/raw {device_over_raw:.3} < 0.8"));
    }
    if (rtts.len() as u64) < o.echoes {
        misses.push(format!("{} of {} echoes came back", rtts.len(), o.echoes));
    }
    Ok(NetResult {
        packets_per_run: o.packets,
        rounds: o.rounds.max(1),
        device_pps: median(dev),
        raw_pps: median(raw),
        device_over_raw,
        device_cpu_ns_per_packet: median(dev_cpu) as u64,
        raw_cpu_ns_per_packet: median(raw_cpu) as u64,
        echoes: rtts.len() as u64,
        echo_p50_us: percentile(&rtts, 0.5),
        echo_p99_us: percentile(&rtts, 0.99),
        idle_device_overhead_ratio: median(idle),
        host_steal_ns: steal0
            .zip(host_steal_ns())
            .map(|(a, b)| b.saturating_sub(a)),
        verdict: if misses.is_empty() {
            "pass".to_string()
        } else {
            format!("fail: {}", misses.join(", "))
        },
    })
}

impl NetResult {
    /// The human table.
    pub fn to_text(&self) -> String {
        format!(
            "virtio-net transmit, {} 64-byte frames per run, median of {} alternated rounds\n\
             {:<30} {:>12.0} frames/s  {:>6} ns CPU/frame\n\
             {:<30} {:>12.0} frames/s  {:>6} ns CPU/frame\n\
             device/raw {:.3} (goal >= 0.8)\n\
             echo round trip over {} frames: p50 {:.1} us, p99 {:.1} us\n\
             exits/s with an idle device / without: {:.4}\n\
             host steal during the bench: {}\nverdict: {}\n",
            self.packets_per_run,
            self.rounds,
            "tiny guest through the device",
            self.device_pps,
            self.device_cpu_ns_per_packet,
            "host loop into the tap",
            self.raw_pps,
            self.raw_cpu_ns_per_packet,
            self.device_over_raw,
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

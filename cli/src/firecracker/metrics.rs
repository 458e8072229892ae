//! `PUT /metrics`: Firecracker-shaped JSON lines written to a file or named pipe every
//! [`FLUSH_INTERVAL`], at `FlushMetrics` and when the VM ends, with our figures in fields of
//! their own beside Firecracker's.
//!
//! Data flow: the API thread configures the one [`MetricsState`] (shared with the main
//! thread, which writes the last line) and counts each request in it; a flush samples the VM
//! through its `VmHandle` (each vCPU's times, each device's figures, the VM's own) into a
//! [`Sample`], and [`line`] turns sample and counters into one JSON object. Firecracker's
//! names (`vcpu.exit_mmio_write`, `net_eth0.rx_packets_count`, `put_api_requests.*`) carry
//! what Firecracker's carry: counts since the previous line. Ours start with `ppa_` (and the
//! `ppa` object) and are totals since the VM started, exact to the nanosecond: per vCPU its
//! guest, VMM, KVM, steal, limited, idle and paused time; per network device its CPU per
//! frame each way and each of its threads' CPU.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use ppa_vmm::handle::VmHandle;
use ppa_vmm_api::{DeviceStats, QueueKind, VcpuTimes, VmStats};
use serde_json::{json, Map, Value};
use thiserror::Error;

use super::model::Metrics;

/// How often a line is written while the VM runs, as Firecracker does.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(60);

/// Why the metrics could not be set up or written.
#[derive(Debug, Error)]
pub enum MetricsError {
    /// A second `PUT /metrics`.
    #[error("Metrics error: Cannot initialize the metrics system due to bad user input: Reinitialization of metrics not allowed.")]
    Again,
    /// The file cannot be opened.
    #[error("Metrics error: Cannot initialize the metrics system due to bad user input: the metrics file {path} cannot be opened: {source}.")]
    Open {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A line could not be written.
    #[error("the metrics line could not be written to {path}: {source}")]
    Write {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// What a flush reads of the VM.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The VM's own figures.
    pub vm: VmStats,
    /// Each vCPU's times (no histograms).
    pub vcpus: Vec<VcpuTimes>,
    /// Each device's figures.
    pub devices: Vec<DeviceStats>,
}

impl Sample {
    /// The VM's figures now.
    pub fn of(vm: &VmHandle) -> Sample {
        Sample {
            vm: vm.vm_stats(),
            vcpus: vm.vcpus().iter().map(|v| v.times_with(false).0).collect(),
            devices: vm.device_stats(),
        }
    }
}

/// The metrics file and what the lines count.
#[derive(Debug, Default)]
pub struct MetricsState {
    out: Option<Output>,
    /// Requests by Firecracker's metric group and name (`put_api_requests` →
    /// `machine_cfg_count`), totals.
    counts: BTreeMap<(&'static str, String), u64>,
    /// Each counter's total at the previous line (key `group.name`).
    prev: BTreeMap<String, u64>,
    /// Lines that could not be written (`logger.missed_metrics_count`).
    missed: u64,
}

#[derive(Debug)]
struct Output {
    file: std::fs::File,
    config: Metrics,
    id: String,
    last: Instant,
}

impl MetricsState {
    /// `PUT /metrics`: opens the file (made when missing; a named pipe is opened without
    /// blocking, as Firecracker does), once.
    pub fn configure(&mut self, m: &Metrics, id: &str) -> Result<(), MetricsError> {
        use std::os::unix::fs::OpenOptionsExt;
        if self.out.is_some() {
            return Err(MetricsError::Again);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&m.metrics_path)
            .map_err(|source| MetricsError::Open {
                path: m.metrics_path.clone(),
                source,
            })?;
        self.out = Some(Output {
            file,
            config: m.clone(),
            id: id.to_string(),
            last: Instant::now(),
        });
        Ok(())
    }

    /// Counts one request of Firecracker's metric `group` (`put_api_requests`) on resource
    /// `name` (`machine_cfg`), and its failure.
    pub fn count(&mut self, group: &'static str, name: &str, failed: bool) {
        *self
            .counts
            .entry((group, format!("{name}_count")))
            .or_default() += 1;
        if failed && group != "get_api_requests" {
            *self
                .counts
                .entry((group, format!("{name}_fails")))
                .or_default() += 1;
        }
    }

    /// Whether the periodic line is due.
    pub fn due(&self, now: Instant) -> bool {
        self.out
            .as_ref()
            .is_some_and(|o| now.duration_since(o.last) >= FLUSH_INTERVAL)
    }

    /// Writes one line (nothing without a metrics file): the VM's figures when it runs.
    pub fn flush(&mut self, vm: Option<&VmHandle>) -> Result<(), MetricsError> {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        out.last = Instant::now();
        let sample = vm.map(Sample::of);
        let utc_ms = ppa_vmm::report::realtime_ns() / 1_000_000;
        let mut v = line(utc_ms, sample.as_ref(), &self.counts, &mut self.prev);
        if let Some(o) = v.as_object_mut() {
            if out.config.emit_id {
                o.insert("id".into(), json!(out.id));
            }
            if let Some(p) = &out.config.properties {
                o.insert("properties".into(), json!(p));
            }
            o.insert(
                "logger".into(),
                json!({"missed_metrics_count": self.missed, "metrics_fails": self.missed}),
            );
        }
        let mut text = v.to_string();
        text.push('\n');
        out.file.write_all(text.as_bytes()).map_err(|source| {
            self.missed += 1;
            MetricsError::Write {
                path: out.config.metrics_path.clone(),
                source,
            }
        })
    }
}

/// `total` less its value at the previous line (kept in `prev` under `key`): a count since
/// then. A total below the previous one (a `reset` on our control socket) counts from 0.
fn delta(prev: &mut BTreeMap<String, u64>, key: String, total: u64) -> u64 {
    let before = prev.insert(key, total).unwrap_or(0);
    total.checked_sub(before).unwrap_or(total)
}

/// One vCPU's figures, ours: totals since the start.
fn vcpu_fields(t: &VcpuTimes) -> Value {
    json!({
        "vcpu": t.id,
        "host_tid": t.host_tid,
        "wall_ns": t.wall_ns,
        "guest_ns": t.guest_ns,
        "vmm_ns": t.vmm_ns,
        "kvm_ns": t.kvm_ns,
        "steal_ns": t.steal_ns,
        "limited_ns": t.limited_ns,
        "idle_ns": t.idle_ns + t.halted_ns,
        "paused_ns": t.paused_ns,
        "exits": t.exits.values().sum::<u64>(),
    })
}

/// A device's frames and bytes each way (rx: to the guest, tx: from it).
fn device_traffic(d: &DeviceStats) -> [(&'static str, u64); 4] {
    let sum = |kind, f: fn(&ppa_vmm_api::QueueStats) -> u64| {
        d.queues
            .iter()
            .filter(|q| q.kind == kind)
            .map(f)
            .sum::<u64>()
    };
    [
        ("rx_bytes_count", sum(QueueKind::Rx, |q| q.bytes)),
        ("rx_packets_count", sum(QueueKind::Rx, |q| q.packets)),
        ("tx_bytes_count", sum(QueueKind::Tx, |q| q.bytes)),
        ("tx_packets_count", sum(QueueKind::Tx, |q| q.packets)),
    ]
}

/// The `vcpu`, `net` and `net_<id>` objects and ours, from a sample.
fn vm_objects(s: &Sample, prev: &mut BTreeMap<String, u64>, o: &mut Map<String, Value>) {
    let mut vcpu = Map::new();
    for (fc, ours) in [
        ("exit_io_in", "io_in"),
        ("exit_io_out", "io_out"),
        ("exit_mmio_read", "mmio_read"),
        ("exit_mmio_write", "mmio_write"),
    ] {
        let total = s
            .vcpus
            .iter()
            .map(|t| t.exits.get(ours).copied().unwrap_or(0))
            .sum();
        vcpu.insert(fc.into(), json!(delta(prev, format!("vcpu.{fc}"), total)));
    }
    vcpu.insert(
        "ppa_vcpus".into(),
        Value::Array(s.vcpus.iter().map(vcpu_fields).collect()),
    );
    o.insert("vcpu".into(), Value::Object(vcpu));
    let mut all = [0u64; 4];
    for d in s.devices.iter().filter(|d| !d.queues.is_empty()) {
        let mut dev = Map::new();
        for (i, (name, total)) in device_traffic(d).into_iter().enumerate() {
            all[i] += total;
            dev.insert(
                name.into(),
                json!(delta(prev, format!("net_{}.{name}", d.id), total)),
            );
        }
        let per = d.cpu_ns_per_packet.as_ref();
        dev.insert("ppa_cpu_ns".into(), json!(d.cpu_ns));
        dev.insert(
            "ppa_cpu_ns_per_rx_frame".into(),
            json!(per.and_then(|p| p.rx)),
        );
        dev.insert(
            "ppa_cpu_ns_per_tx_frame".into(),
            json!(per.and_then(|p| p.tx)),
        );
        let threads: Vec<Value> = d
            .threads
            .iter()
            .map(|t| {
                json!({"name": t.name, "host_tid": t.host_tid, "used_ns": t.used_ns,
                       "steal_ns": t.steal_ns, "waiting_ns": t.waiting_ns})
            })
            .collect();
        dev.insert("ppa_threads".into(), Value::Array(threads));
        o.insert(format!("net_{}", d.id), Value::Object(dev));
    }
    let names = [
        "rx_bytes_count",
        "rx_packets_count",
        "tx_bytes_count",
        "tx_packets_count",
    ];
    let net: Map<String, Value> = names
        .iter()
        .zip(all)
        .map(|(n, total)| (n.to_string(), json!(delta(prev, format!("net.{n}"), total))))
        .collect();
    o.insert("net".into(), Value::Object(net));
    o.insert(
        "ppa".into(),
        json!({
            "vm": s.vm.name,
            "state": s.vm.state,
            "uptime_ns": s.vm.uptime_ns,
            "host_cpu_ns": s.vm.host_cpu_ns,
        }),
    );
}

/// One metrics line: the time, the API requests counted since the previous line, and the
/// VM's figures when it runs.
pub fn line(
    utc_ms: u64,
    sample: Option<&Sample>,
    counts: &BTreeMap<(&'static str, String), u64>,
    prev: &mut BTreeMap<String, u64>,
) -> Value {
    let mut o = Map::new();
    o.insert("utc_timestamp_ms".into(), json!(utc_ms));
    for group in ["get_api_requests", "put_api_requests", "patch_api_requests"] {
        let g: Map<String, Value> = counts
            .iter()
            .filter(|((g, _), _)| *g == group)
            .map(|((_, name), total)| {
                let d = delta(prev, format!("{group}.{name}"), *total);
                (name.clone(), json!(d))
            })
            .collect();
        o.insert(group.into(), Value::Object(g));
    }
    if let Some(s) = sample {
        vm_objects(s, prev, &mut o);
    }
    Value::Object(o)
}

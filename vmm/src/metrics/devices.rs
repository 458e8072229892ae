//! The device families: each device's threads (time split and CPU by kind of work), its
//! queues (kicks, interrupts, chains, frames, bytes, drops by reason), a disk's requests by
//! type, bytes, errors and service times, its status, and the VM's host CPU split (docs/control.md, "Device metrics"; docs/accounting.md, "Devices").
//!
//! Data flow: [`super::render`] calls [`add_device`] for each `DeviceStats` of the snapshot
//! and [`add_host_cpu`] once; labels are `vm`, `device`, then `thread` or `queue` and `kind`.

use ppa_vmm_api::{DeviceHealth, DeviceStats, HostCpuSplit};

use super::buckets::Buckets;
use super::text::{Families, Seconds};

/// Adds the VM's host CPU split.
pub fn add_host_cpu(f: &mut Families, vm: &str, h: &HostCpuSplit) {
    for (part, ns) in [
        ("vcpus", h.vcpus),
        ("devices", h.devices),
        ("service", h.service),
    ] {
        f.add(
            "ppa_vm_host_cpu_seconds_total",
            &[("vm", vm), ("part", part)],
            Seconds(ns),
        );
    }
}

/// Adds a disk's requests, bytes, errors and service times.
fn add_blk(f: &mut Families, dev: &[(&str, &str); 2], d: &DeviceStats) {
    let Some(b) = &d.blk else {
        return;
    };
    for (kind, n) in &b.requests {
        f.add(
            "ppa_device_requests_total",
            &[dev[0], dev[1], ("type", kind.as_str())],
            *n,
        );
    }
    f.add(
        "ppa_device_requests_merged_total",
        &[dev[0], dev[1]],
        b.merged,
    );
    for (dir, n) in [("read", b.bytes_read), ("written", b.bytes_written)] {
        f.add(
            "ppa_device_request_bytes_total",
            &[dev[0], dev[1], ("direction", dir)],
            n,
        );
    }
    for (status, n) in &b.errors {
        f.add(
            "ppa_device_request_errors_total",
            &[dev[0], dev[1], ("status", status.as_str())],
            *n,
        );
    }
    for (kind, h) in d.service.iter().flatten() {
        f.add_histogram(
            "ppa_device_request_service_seconds",
            &[dev[0], dev[1], ("type", kind.as_str())],
            &Buckets::of_json(h),
        );
    }
}

/// Adds one device's figures.
pub fn add_device(f: &mut Families, vm: &str, d: &DeviceStats) {
    let dev = [("vm", vm), ("device", d.id.as_str())];
    add_blk(f, &dev, d);
    for h in DeviceHealth::ALL {
        f.add(
            "ppa_device_status",
            &[dev[0], dev[1], ("status", h.as_str())],
            u8::from(h == d.status),
        );
    }
    for (work, ns) in [
        ("tx", d.cpu.tx),
        ("rx", d.cpu.rx),
        ("ctrl", d.cpu.ctrl),
        ("req", d.cpu.req),
        ("poll", d.cpu.poll),
        ("other", d.cpu.other),
    ] {
        f.add(
            "ppa_device_work_cpu_seconds_total",
            &[dev[0], dev[1], ("work", work)],
            Seconds(ns),
        );
    }
    for (pair, t) in d.threads.iter().enumerate() {
        let pair = pair.to_string();
        let tl = [
            dev[0],
            dev[1],
            ("thread", t.name.as_str()),
            ("queue", pair.as_str()),
        ];
        f.add("ppa_device_cpu_seconds_total", &tl, Seconds(t.used_ns));
        for (state, ns) in [
            ("used", t.used_ns),
            ("steal", t.steal_ns),
            ("waiting", t.waiting_ns),
            ("blocked", t.blocked_ns),
        ] {
            f.add(
                "ppa_device_thread_seconds_total",
                &[tl[0], tl[1], tl[2], ("state", state)],
                Seconds(ns),
            );
        }
    }
    for q in &d.queues {
        let index = q.index.to_string();
        let ql = [
            dev[0],
            dev[1],
            ("queue", index.as_str()),
            ("kind", q.kind.as_str()),
        ];
        f.add("ppa_device_notifications_total", &ql, q.notifications);
        f.add("ppa_device_interrupts_total", &ql, q.interrupts);
        f.add(
            "ppa_device_interrupts_suppressed_total",
            &ql,
            q.interrupts_suppressed,
        );
        f.add("ppa_device_chains_total", &ql, q.chains);
        f.add("ppa_device_packets_total", &ql, q.packets);
        f.add("ppa_device_bytes_total", &ql, q.bytes);
        f.add("ppa_device_throttles_total", &ql, q.throttles);
        f.add(
            "ppa_device_throttled_seconds_total",
            &ql,
            Seconds(q.throttled_ns),
        );
        for (reason, n) in &q.drops {
            f.add(
                "ppa_device_drops_total",
                &[ql[0], ql[1], ql[2], ql[3], ("reason", reason.as_str())],
                *n,
            );
        }
    }
}

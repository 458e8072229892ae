//! The device families on a synthetic device: labels, values and the host CPU split.

use std::collections::BTreeMap;

use ppa_vmm_api::{
    DeviceCpu, DeviceHealth, DeviceKind, DeviceStats, DeviceThreadStats, DriverStats, DropReason,
    PerPacket, QueueKind, QueueStats,
};

use super::render;
use super::tests::{samples, stats};

/// A network device with one queue pair, some traffic and drops.
pub(super) fn device() -> DeviceStats {
    let q = |index, kind, packets| QueueStats {
        index,
        kind,
        notifications: 7,
        interrupts: 5,
        interrupts_suppressed: 2,
        chains: packets + 1,
        packets,
        bytes: packets * 64,
        requests: None,
        copied: 0,
        throttles: 3,
        throttled_ns: 250_000_000,
        drops: BTreeMap::from([(DropReason::TapWouldBlock, 1)]),
    };
    DeviceStats {
        id: "net0".into(),
        kind: DeviceKind::Net,
        backend: "tap0".into(),
        mac: Some("02:00:00:00:00:01".into()),
        rate: None,
        mmio_base: 0xC000_0000,
        gsi: Some(5),
        status: DeviceHealth::Ok,
        status_reason: None,
        backend_error: None,
        threads: vec![DeviceThreadStats {
            name: "net0-qp0".into(),
            host_tid: 4321,
            wall_ns: 2_000_000_000,
            used_ns: 300_000_000,
            steal_ns: 100_000_000,
            waiting_ns: 1_600_000_000,
            blocked_ns: 0,
            limited_ns: 0,
            held_frames: 0,
            identity_error_ns: 0,
        }],
        queues: vec![q(0, QueueKind::Rx, 100), q(1, QueueKind::Tx, 1000)],
        cpu_ns: 300_000_000,
        cpu: DeviceCpu {
            tx: 200_000_000,
            rx: 50_000_000,
            ctrl: 0,
            req: 0,
            poll: 0,
            other: 50_000_000,
        },
        cpu_ns_per_packet: Some(PerPacket {
            tx: Some(200_000),
            rx: Some(500_000),
        }),
        frame_cpu: None,
        driver: DriverStats {
            features: 1 << 32,
            activations: 1,
            resets: 1,
            notify_exits: 0,
            resets_unsettled: 0,
            violations: BTreeMap::new(),
        },
        blk: None,
        service: None,
    }
}

#[test]
fn device_families_carry_the_device_thread_and_queue() {
    let text = render(&stats());
    let s = samples(&text);
    let find = |name: &str, labels: &[(&str, &str)]| {
        s.iter()
            .find(|x| x.name == name && labels.iter().all(|(k, v)| x.label(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
            .value
    };
    assert_eq!(
        find(
            "ppa_device_cpu_seconds_total",
            &[("thread", "net0-qp0"), ("queue", "0")]
        ),
        0.3
    );
    assert_eq!(
        find("ppa_device_thread_seconds_total", &[("state", "waiting")]),
        1.6
    );
    assert_eq!(
        find("ppa_device_work_cpu_seconds_total", &[("work", "tx")]),
        0.2
    );
    assert_eq!(
        find(
            "ppa_device_packets_total",
            &[("queue", "1"), ("kind", "tx")]
        ),
        1000.0
    );
    assert_eq!(
        find("ppa_device_bytes_total", &[("queue", "0"), ("kind", "rx")]),
        6400.0
    );
    assert_eq!(
        find(
            "ppa_device_drops_total",
            &[("queue", "1"), ("reason", "tap_would_block")]
        ),
        1.0
    );
    assert_eq!(
        find("ppa_device_interrupts_suppressed_total", &[("queue", "0")]),
        2.0
    );
    assert_eq!(
        find(
            "ppa_device_throttles_total",
            &[("queue", "0"), ("kind", "rx")]
        ),
        3.0
    );
    assert_eq!(
        find(
            "ppa_device_throttled_seconds_total",
            &[("queue", "0"), ("kind", "rx")]
        ),
        0.25
    );
    assert_eq!(find("ppa_device_status", &[("status", "ok")]), 1.0);
    assert_eq!(find("ppa_device_status", &[("status", "needs_reset")]), 0.0);
    assert_eq!(
        find("ppa_vm_host_cpu_seconds_total", &[("part", "devices")]),
        0.3
    );
    assert_eq!(
        find("ppa_vm_host_cpu_seconds_total", &[("part", "service")]),
        0.012
    );
}

/// A disk with two writes, a flush, an error and the writes' service times; its one queue is
/// the network device's first, as a `req` queue without drops.
pub(super) fn disk() -> DeviceStats {
    use ppa_vmm_api::{BlkRequestKind, BlkStats, BlkStatus};
    let mut d = device();
    d.id = "blk0".into();
    d.kind = DeviceKind::Blk;
    d.queues.truncate(1);
    d.queues[0].kind = QueueKind::Req;
    d.queues[0].drops.clear();
    let one = crate::accounting::histogram::Histogram::new(3).unwrap();
    one.record(3_000);
    one.record(300_000);
    d.blk = Some(BlkStats {
        capacity_bytes: 1 << 20,
        readonly: false,
        discard: true,
        write_zeroes: true,
        flush_negotiated: true,
        requests: BTreeMap::from([(BlkRequestKind::Write, 2), (BlkRequestKind::Flush, 1)]),
        bytes_read: 0,
        bytes_written: 8192,
        errors: BTreeMap::from([(BlkStatus::Unsupp, 1)]),
        merged: 1,
    });
    d.service = Some(BTreeMap::from([(
        BlkRequestKind::Write,
        one.snapshot().to_json(),
    )]));
    d
}

#[test]
fn a_disk_has_its_requests_bytes_errors_and_service_times() {
    let text = render(&stats());
    let s = samples(&text);
    let find = |name: &str, labels: &[(&str, &str)]| {
        s.iter()
            .find(|x| x.name == name && labels.iter().all(|(k, v)| x.label(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
            .value
    };
    assert_eq!(
        find(
            "ppa_device_requests_total",
            &[("device", "blk0"), ("type", "write")]
        ),
        2.0
    );
    assert_eq!(find("ppa_device_requests_total", &[("type", "flush")]), 1.0);
    assert_eq!(
        find(
            "ppa_device_request_bytes_total",
            &[("direction", "written")]
        ),
        8192.0
    );
    assert_eq!(
        find("ppa_device_request_errors_total", &[("status", "unsupp")]),
        1.0
    );
    assert_eq!(
        find("ppa_device_requests_merged_total", &[("device", "blk0")]),
        1.0
    );
    assert_eq!(
        find(
            "ppa_device_request_service_seconds_count",
            &[("type", "write")]
        ),
        2.0
    );
    assert_eq!(
        find(
            "ppa_device_request_service_seconds_bucket",
            &[("type", "write"), ("le", "0.000004096")]
        ),
        1.0
    );
    assert_eq!(
        find(
            "ppa_device_work_cpu_seconds_total",
            &[("device", "blk0"), ("work", "req")]
        ),
        0.0
    );
}

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
        copied: 0,
        drops: BTreeMap::from([(DropReason::TapWouldBlock, 1)]),
    };
    DeviceStats {
        id: "net0".into(),
        kind: DeviceKind::Net,
        backend: "tap0".into(),
        mac: Some("02:00:00:00:00:01".into()),
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

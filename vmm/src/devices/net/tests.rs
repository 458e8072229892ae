//! The device's features and configuration space as a driver reads them.

use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;

use ppa_vmm_api::{DeviceCpu, DeviceHealth, DeviceKind, DeviceStats, PerPacket, QueueKind};

use super::stats::since;
use super::*;

#[test]
fn features_are_modern_only_and_multiqueue_needs_the_control_queue() {
    let one = offered_features(1);
    assert_ne!(one & (1 << VIRTIO_F_VERSION_1), 0);
    for bit in [
        VIRTIO_NET_F_MAC,
        VIRTIO_NET_F_STATUS,
        VIRTIO_NET_F_MTU,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_RING_F_EVENT_IDX,
    ] {
        assert_ne!(one & (1 << bit), 0, "bit {bit}");
    }
    assert_eq!(one & (1 << VIRTIO_NET_F_MQ), 0, "one pair: no MQ");
    let four = offered_features(4);
    assert_ne!(four & (1 << VIRTIO_NET_F_MQ), 0);
    assert_ne!(
        four & (1 << VIRTIO_NET_F_CTRL_VQ),
        0,
        "Linux takes MQ only with CTRL_VQ"
    );
}

#[test]
fn the_configuration_space_is_mac_status_pairs_mtu() {
    let c = config_space(Mac([2, 1, 2, 3, 4, 5]), 3, 9000);
    assert_eq!(&c[..6], &[2, 1, 2, 3, 4, 5]);
    assert_eq!(u16::from_le_bytes([c[6], c[7]]), 1, "link up");
    assert_eq!(u16::from_le_bytes([c[8], c[9]]), 3);
    assert_eq!(u16::from_le_bytes([c[10], c[11]]), 9000);
}

#[test]
fn figures_since_a_reset_subtract_every_counter_and_keep_the_identity() {
    use std::collections::BTreeMap;

    use ppa_vmm_api::{DeviceThreadStats, DriverStats, DropReason, QueueStats};
    let empty = crate::accounting::histogram::HistogramSnapshot::empty(3).to_json();
    let dev = |k: u64| DeviceStats {
        id: "net0".into(),
        kind: DeviceKind::Net,
        backend: "t".into(),
        mac: None,
        rate: None,
        mmio_base: 0,
        gsi: None,
        status: DeviceHealth::Ok,
        status_reason: None,
        backend_error: None,
        threads: vec![DeviceThreadStats {
            name: "net0-qp0".into(),
            host_tid: 1,
            wall_ns: 100 * k,
            used_ns: 10 * k,
            steal_ns: 5 * k,
            waiting_ns: 80 * k,
            blocked_ns: 5 * k,
            limited_ns: 0,
            held_frames: 0,
            identity_error_ns: 0,
        }],
        queues: vec![QueueStats {
            index: 1,
            kind: QueueKind::Tx,
            notifications: k,
            interrupts: k,
            interrupts_suppressed: k,
            chains: 3 * k,
            packets: 2 * k,
            bytes: 128 * k,
            requests: None,
            copied: 0,
            throttles: 0,
            throttled_ns: 0,
            drops: BTreeMap::from([(DropReason::TapWouldBlock, k)]),
        }],
        cpu_ns: 10 * k,
        cpu: DeviceCpu {
            tx: 8 * k,
            rx: 0,
            ctrl: 0,
            req: 0,
            poll: 0,
            other: 2 * k,
        },
        cpu_ns_per_packet: Some(PerPacket {
            tx: Some(4),
            rx: None,
        }),
        frame_cpu: Some(ppa_vmm_api::FrameCpu {
            rx_frames: 0,
            // Sent and dropped: the mean's denominator.
            tx_frames: 3 * k,
            rx_per_batch: empty.clone(),
            tx_per_batch: empty.clone(),
        }),
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
    let d = since(dev(5), &dev(2));
    let t = &d.threads[0];
    assert_eq!((t.wall_ns, t.used_ns, t.waiting_ns), (300, 30, 240));
    assert_eq!(t.identity_error_ns, 0);
    let q = &d.queues[0];
    assert_eq!(
        (q.packets, q.bytes, q.drops[&DropReason::TapWouldBlock]),
        (6, 384, 3)
    );
    assert_eq!((d.cpu_ns, d.cpu.tx), (30, 24));
    assert_eq!(
        d.cpu_ns_per_packet.unwrap().tx,
        Some(24 / 9),
        "the transmit CPU over the frames handled, drops included"
    );
    // Nothing since: drops that did not move are left out, rates have no frame.
    let d = since(dev(2), &dev(2));
    assert!(d.queues[0].drops.is_empty());
    assert_eq!(d.cpu_ns_per_packet.unwrap().tx, None);
}

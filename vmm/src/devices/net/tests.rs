//! The device's features and configuration space as a driver reads them.

use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;

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

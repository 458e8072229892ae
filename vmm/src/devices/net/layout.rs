//! Which virtqueue is which (virtio 1.2, 5.1.2): receive queue of pair N at `2N`, transmit
//! queue at `2N + 1`, and the control queue at `2 × max_virtqueue_pairs` when the driver
//! negotiated `VIRTIO_NET_F_MQ`, at 2 when it did not. Every index a device thread, the
//! transport's kick routing or a reader uses comes from here.
//!
//! Data flow: a queue pair's thread asks [`served_by`] at each activation which queues it
//! serves in that epoch (pair 0 also the control queue, when negotiated; the other pairs only
//! with MQ), and readers ask [`kind_of`] what each queue's counters are, under the features
//! the driver negotiated.

use ppa_vmm_api::QueueKind;

/// The receive queue of pair `pair`.
pub fn rx(pair: usize) -> usize {
    2 * pair
}

/// The transmit queue of pair `pair`.
pub fn tx(pair: usize) -> usize {
    2 * pair + 1
}

/// The control queue's index, for a device of `max_pairs` pairs, with or without MQ
/// negotiated.
pub fn ctrl(max_pairs: u16, mq: bool) -> usize {
    if mq {
        2 * usize::from(max_pairs)
    } else {
        2
    }
}

/// Virtqueues a device of `max_pairs` pairs has (with a control queue when `has_ctrl`).
pub fn queue_count(max_pairs: u16, has_ctrl: bool) -> usize {
    2 * usize::from(max_pairs) + usize::from(has_ctrl)
}

/// What the driver negotiated that decides the layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// `VIRTIO_NET_F_CTRL_VQ`.
    pub ctrl: bool,
    /// `VIRTIO_NET_F_MQ` (which needs CTRL_VQ).
    pub mq: bool,
}

/// The queues thread `pair` serves in an active epoch: its receive and transmit queues
/// (pairs past the first only with MQ) and, for pair 0, the control queue when negotiated.
pub fn served_by(pair: usize, max_pairs: u16, n: Negotiated) -> Served {
    let mut s = Served::default();
    if pair >= usize::from(max_pairs) || (pair > 0 && !n.mq) {
        return s;
    }
    s.rx = Some(rx(pair));
    s.tx = Some(tx(pair));
    if pair == 0 && n.ctrl {
        s.ctrl = Some(ctrl(max_pairs, n.mq));
    }
    s
}

/// The queues one thread serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Its receive queue.
    pub rx: Option<usize>,
    /// Its transmit queue.
    pub tx: Option<usize>,
    /// The control queue (pair 0 only).
    pub ctrl: Option<usize>,
}

impl Served {
    /// The indices, in rx, tx, ctrl order.
    pub fn indices(&self) -> impl Iterator<Item = usize> {
        [self.rx, self.tx, self.ctrl].into_iter().flatten()
    }
}

/// What queue `index` of a device of `max_pairs` pairs is under `n` (a device with a control
/// queue and no MQ negotiated has it at 2, where pair 1's receive queue would be).
pub fn kind_of(index: usize, max_pairs: u16, has_ctrl: bool, n: Negotiated) -> QueueKind {
    if has_ctrl && n.ctrl && index == ctrl(max_pairs, n.mq) {
        QueueKind::Ctrl
    } else if has_ctrl && index == 2 * usize::from(max_pairs) {
        // The device's last queue, reported as the control queue it is with MQ, also before
        // any driver negotiated.
        QueueKind::Ctrl
    } else if index % 2 == 0 {
        QueueKind::Rx
    } else {
        QueueKind::Tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MQ: Negotiated = Negotiated {
        ctrl: true,
        mq: true,
    };
    const CTRL_ONLY: Negotiated = Negotiated {
        ctrl: true,
        mq: false,
    };

    #[test]
    fn the_control_queue_is_last_with_mq_and_at_2_without() {
        assert_eq!(ctrl(4, true), 8);
        assert_eq!(ctrl(4, false), 2);
        assert_eq!(ctrl(1, false), 2);
        assert_eq!(queue_count(4, true), 9);
        assert_eq!(queue_count(1, false), 2);
    }

    #[test]
    fn each_thread_serves_its_pair_and_pair_0_the_control_queue() {
        let s0 = served_by(0, 4, MQ);
        assert_eq!(s0.indices().collect::<Vec<_>>(), vec![0, 1, 8]);
        assert_eq!(
            served_by(3, 4, MQ).indices().collect::<Vec<_>>(),
            vec![6, 7]
        );
        // Without MQ only pair 0 exists for the driver, and the control queue is queue 2.
        assert_eq!(
            served_by(0, 4, CTRL_ONLY).indices().collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(served_by(1, 4, CTRL_ONLY).indices().count(), 0);
        assert_eq!(
            served_by(0, 1, Negotiated::default())
                .indices()
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(served_by(4, 4, MQ).indices().count(), 0, "no such pair");
    }

    #[test]
    fn readers_name_each_queue_under_the_negotiated_layout() {
        assert_eq!(kind_of(8, 4, true, MQ), QueueKind::Ctrl);
        assert_eq!(kind_of(2, 4, true, MQ), QueueKind::Rx);
        assert_eq!(kind_of(2, 4, true, CTRL_ONLY), QueueKind::Ctrl);
        assert_eq!(kind_of(3, 4, true, CTRL_ONLY), QueueKind::Tx);
        assert_eq!(kind_of(8, 4, true, Negotiated::default()), QueueKind::Ctrl);
        assert_eq!(kind_of(1, 1, false, Negotiated::default()), QueueKind::Tx);
    }
}

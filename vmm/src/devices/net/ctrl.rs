//! The network device's control queue (present with several queue pairs): the driver says
//! how many queue pairs it uses (`VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET`); every other command is
//! answered `VIRTIO_NET_ERR` (their features are not offered).
//!
//! Data flow: queue pair 0's thread runs [`run`] on a kick: each chain is a request (readable
//! buffers: class, command, data) and its one-byte answer (a writable buffer), checked as
//! untrusted input. A valid pair count is returned for the thread to apply (attach that many
//! tap queues, detach the rest); the answer is written and the chain given back.

use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::queues::QueueCounters;
use super::rx::{next_chain, QueueFault};
use crate::devices::virtio::chain::{ChainError, Direction, Segments};

/// What one pass over the control queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlPass {
    /// The queue pairs the driver asked for last (already checked against the maximum).
    pub pairs: Option<u16>,
    /// A fault that needs a reset.
    pub fault: Option<QueueFault>,
}

/// The answer to one request of `req` readable bytes, given `max_pairs`.
pub fn answer(req: &[u8], max_pairs: u16) -> (u8, Option<u16>) {
    match req {
        [class, cmd, a, b, ..]
            if u32::from(*class) == VIRTIO_NET_CTRL_MQ
                && u32::from(*cmd) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET =>
        {
            let n = u16::from_le_bytes([*a, *b]);
            if (1..=max_pairs).contains(&n) {
                (VIRTIO_NET_OK as u8, Some(n))
            } else {
                (VIRTIO_NET_ERR as u8, None)
            }
        }
        _ => (VIRTIO_NET_ERR as u8, None),
    }
}

/// Answers every request the driver made available.
pub fn run(
    q: &mut Queue,
    mem: &GuestMemoryMmap,
    segs: &mut Segments,
    max_pairs: u16,
    c: &QueueCounters,
) -> CtrlPass {
    let mut pass = CtrlPass::default();
    // At most a queue's worth per kick: a driver that keeps adding requests waits for the
    // next one.
    for _ in 0..q.size() {
        let chain = match next_chain(q, mem) {
            Ok(Some(chain)) => chain,
            Ok(None) => return pass,
            Err(f) => {
                pass.fault = Some(f);
                return pass;
            }
        };
        c.chains.add(1);
        if let Err(e) = segs.load(chain, mem, Direction::ReadThenWrite, 3) {
            pass.fault = Some(QueueFault::Chain(e));
            return pass;
        }
        let (readable, writable) = segs.split();
        if readable.is_empty() || writable.is_empty() {
            pass.fault = Some(QueueFault::Chain(ChainError::WrongDirection));
            return pass;
        }
        let readable_len: u64 = readable.iter().map(|s| u64::from(s.len)).sum();
        let mut req = [0u8; 8];
        let want = (readable_len as usize).min(req.len());
        let n = segs.read_into(mem, &mut req[..want]);
        let (ack, pairs) = answer(&req[..n], max_pairs);
        if pairs.is_some() {
            pass.pairs = pairs;
        }
        segs.write_at(mem, readable_len, &[ack]);
        if q.add_used(mem, segs.head(), 1).is_err() {
            pass.fault = Some(QueueFault::UsedRing);
            return pass;
        }
        c.packets.add(1);
    }
    pass
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pair_count_in_range_is_accepted() {
        let mq = VIRTIO_NET_CTRL_MQ as u8;
        let set = VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8;
        assert_eq!(answer(&[mq, set, 2, 0], 4), (0, Some(2)));
        assert_eq!(answer(&[mq, set, 4, 0], 4), (0, Some(4)));
        assert_eq!(answer(&[mq, set, 5, 0], 4), (1, None));
        assert_eq!(answer(&[mq, set, 0, 0], 4), (1, None));
        assert_eq!(answer(&[mq, set, 2], 4), (1, None), "short");
        assert_eq!(
            answer(&[0, 0, 1, 0], 4),
            (1, None),
            "CTRL_RX is not offered"
        );
        assert_eq!(answer(&[], 4), (1, None));
    }
}

//! The network device's control queue (present with several queue pairs): the driver says
//! how many queue pairs it uses (`VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET`, only when it negotiated
//! `VIRTIO_NET_F_MQ`); every other command is answered `VIRTIO_NET_ERR` (their features are
//! not offered).
//!
//! Data flow: queue pair 0's thread runs [`CtrlQueue::run`] on a kick, with the notification
//! discipline of every queue (a driver that negotiated EVENT_IDX kicks its second command only
//! because the first pass wrote `avail_event`): each chain is a request (readable buffers:
//! class, command, data) and its one-byte answer (a writable buffer), checked as untrusted
//! input. A valid pair count is returned for the thread to apply; the answer is written and
//! the chain given back.

use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};
use virtio_queue::DescriptorChain;
use vm_memory::GuestMemoryMmap;

use super::queues::QueueCounters;
use crate::devices::virtio::chain::{ChainError, Direction, Segments};
use crate::devices::virtio::queue::{DeviceQueue, QueueFault};

/// What one pass over the control queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlPass {
    /// Requests answered (chains given back).
    pub answered: u64,
    /// The queue pairs the driver asked for last (already checked against the maximum).
    pub pairs: Option<u16>,
    /// Requests left when the pass stopped at its budget: run again without a kick.
    pub more: bool,
    /// The pass stopped because the device's epoch ended.
    pub abandoned: bool,
    /// A fault that needs a reset.
    pub fault: Option<QueueFault>,
}

/// The answer to one request of `req` readable bytes, given `max_pairs` and whether the
/// driver negotiated `VIRTIO_NET_F_MQ` (without it the MQ class is not the driver's to use).
pub fn answer(req: &[u8], max_pairs: u16, mq: bool) -> (u8, Option<u16>) {
    match req {
        [class, cmd, a, b, ..]
            if mq
                && u32::from(*class) == VIRTIO_NET_CTRL_MQ
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

/// The control queue with its scratch.
#[derive(Debug)]
pub struct CtrlQueue {
    /// The queue.
    pub dq: DeviceQueue,
    segs: Segments,
    max_pairs: u16,
    mq: bool,
}

impl CtrlQueue {
    /// `dq` for a device of `max_pairs` pairs, MQ negotiated or not.
    pub fn new(dq: DeviceQueue, max_pairs: u16, mq: bool) -> Self {
        let n = usize::from(dq.size());
        CtrlQueue {
            dq,
            segs: Segments::with_capacity(n),
            max_pairs,
            mq,
        }
    }

    /// Answers the requests the driver made available, at most `budget`; `go_on` is asked
    /// before each (false: a reset came).
    pub fn run(
        &mut self,
        mem: &GuestMemoryMmap,
        c: &QueueCounters,
        budget: u64,
        go_on: impl Fn() -> bool,
    ) -> CtrlPass {
        let mut pass = CtrlPass::default();
        if let Err(f) = self.dq.quiet(mem) {
            pass.fault = Some(f);
            return pass;
        }
        loop {
            if !go_on() {
                pass.abandoned = true;
                return pass;
            }
            let chain = match self.dq.pop(mem) {
                Ok(Some(chain)) => chain,
                Ok(None) => return pass,
                Err(f) => {
                    pass.fault = Some(f);
                    return pass;
                }
            };
            if pass.answered >= budget {
                self.dq.unpop(1);
                pass.more = true;
                return pass;
            }
            c.chains.add(1);
            if let Err(f) = self.one(chain, mem, &mut pass) {
                pass.fault = Some(f);
                return pass;
            }
            c.packets.add(1);
            pass.answered += 1;
        }
    }

    fn one(
        &mut self,
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
        pass: &mut CtrlPass,
    ) -> Result<(), QueueFault> {
        self.segs
            .load(chain, mem, Direction::ReadThenWrite, 3)
            .map_err(QueueFault::Chain)?;
        let (readable, writable) = self.segs.split();
        if readable.is_empty() || writable.is_empty() {
            return Err(QueueFault::Chain(ChainError::WrongDirection));
        }
        let readable_len: u64 = readable.iter().map(|s| u64::from(s.len)).sum();
        let mut req = [0u8; 8];
        let want = (readable_len as usize).min(req.len());
        let n = self.segs.read_into(mem, &mut req[..want]);
        let (ack, pairs) = answer(&req[..n], self.max_pairs, self.mq);
        if pairs.is_some() {
            pass.pairs = pairs;
        }
        self.segs.write_at(mem, readable_len, &[ack]);
        self.dq.add_used(self.segs.head(), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pair_count_in_range_is_accepted() {
        let mq = VIRTIO_NET_CTRL_MQ as u8;
        let set = VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8;
        assert_eq!(answer(&[mq, set, 2, 0], 4, true), (0, Some(2)));
        assert_eq!(answer(&[mq, set, 4, 0], 4, true), (0, Some(4)));
        assert_eq!(answer(&[mq, set, 5, 0], 4, true), (1, None));
        assert_eq!(answer(&[mq, set, 0, 0], 4, true), (1, None));
        assert_eq!(answer(&[mq, set, 2], 4, true), (1, None), "short");
        assert_eq!(
            answer(&[0, 0, 1, 0], 4, true),
            (1, None),
            "CTRL_RX is not offered"
        );
        assert_eq!(answer(&[], 4, true), (1, None));
        assert_eq!(
            answer(&[mq, set, 2, 0], 4, false),
            (1, None),
            "no MQ negotiated: the command is refused"
        );
    }
}

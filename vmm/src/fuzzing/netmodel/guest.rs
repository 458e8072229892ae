//! The guest's side of the network model: a virtio-net driver shaped like Linux's
//! (drivers/net/virtio_net.c) over [`DriverRing`]s: it posts receive buffers (mergeable
//! single buffers, or chains of one to three), sends frames, sends control requests, takes
//! interrupts NAPI-style (interrupts off, take every used entry, refill, interrupts on, poll
//! again if more came) and checks every frame it receives against what the host sent.
//!
//! Data flow: [`super::Model`] calls these as the fuzzer's input says and at quiescence;
//! buffers live at fixed places per descriptor id, so a buffer is never reused while the
//! device holds it.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::super::driver::{Buf, DriverRing};
use crate::devices::net::tap::VNET_HDR_LEN;

/// Guest memory of the model.
pub const MEM: usize = 0x100_0000;
/// The two places rings are set up in, alternately at each re-probe.
pub const RING_AREAS: [u64; 2] = [0x0, 0x4_0000];
/// Receive buffers: one slot of [`SLOT`] bytes per descriptor id.
const RX_BUFS: u64 = 0x10_0000;
/// Transmit buffers: one slot per descriptor id.
const TX_BUFS: u64 = 0x50_0000;
/// Control requests: one slot per descriptor id.
const CTRL_BUFS: u64 = 0x98_0000;
/// Bytes of a buffer slot.
pub const SLOT: u64 = 4096;
/// Largest transmit frame the model sends (header included).
pub const MAX_TX: u32 = 2048;

/// How the driver was set up.
#[derive(Debug, Clone, Copy)]
pub struct GuestConfig {
    /// Queue size (a power of two, 1 to 1024).
    pub size: u16,
    /// EVENT_IDX negotiated.
    pub event_idx: bool,
    /// MRG_RXBUF negotiated.
    pub mergeable: bool,
    /// Bytes of each receive descriptor (12 to [`SLOT`]).
    pub rx_buf: u32,
    /// Descriptors per receive chain without mergeable buffers (1 to 3).
    pub rx_descs: u16,
    /// A control queue, at this index.
    pub ctrl_at: Option<usize>,
}

/// The driver of one device.
#[derive(Debug)]
pub struct Guest {
    /// Its setup.
    pub cfg: GuestConfig,
    /// Receive queue 0.
    pub rx: DriverRing,
    /// Transmit queue 0.
    pub tx: DriverRing,
    /// The control queue.
    pub ctrl: Option<DriverRing>,
    /// Frames the driver took from the receive queue: (sequence, length without header).
    pub received: Vec<(u32, usize)>,
    /// Frames sent (chains made available on the transmit queue).
    pub sent: u64,
    /// Transmit chains given back.
    pub tx_done: u64,
    /// Control requests made and answered (with VIRTIO_NET_OK).
    pub ctrl_sent: u64,
    /// Answers taken back.
    pub ctrl_answered: u64,
    /// The buffers of a mergeable frame taken so far, and how many it has.
    partial: (Vec<u8>, usize, u16),
}

/// A frame's bytes at `i` of its payload (after the virtio header): the sequence number
/// first, then a pattern of it.
pub fn payload_byte(seq: u32, i: usize) -> u8 {
    if i < 4 {
        seq.to_le_bytes()[i]
    } else {
        (seq as usize).wrapping_add(i) as u8
    }
}

impl Guest {
    /// A driver with fresh rings in area `area` (an index of [`RING_AREAS`]).
    pub fn new(mem: &GuestMemoryMmap, cfg: GuestConfig, area: usize) -> Self {
        let base = RING_AREAS[area % 2];
        let len = super::super::driver::rings_len(cfg.size).next_multiple_of(0x1000);
        Guest {
            cfg,
            rx: DriverRing::new(mem, base, cfg.size, cfg.event_idx),
            tx: DriverRing::new(mem, base + len, cfg.size, cfg.event_idx),
            ctrl: cfg
                .ctrl_at
                .map(|_| DriverRing::new(mem, base + 2 * len, cfg.size, cfg.event_idx)),
            received: Vec::new(),
            sent: 0,
            tx_done: 0,
            ctrl_sent: 0,
            ctrl_answered: 0,
            partial: (Vec::new(), 0, 0),
        }
    }

    /// Posts up to `n` receive chains; returns whether the device wants a kick.
    pub fn post_rx(&mut self, mem: &GuestMemoryMmap, n: usize) -> bool {
        let descs = if self.cfg.mergeable {
            1
        } else {
            usize::from(self.cfg.rx_descs)
        };
        for _ in 0..n {
            if self.rx.free() < descs {
                break;
            }
            // The chain's descriptors are the next free ids; their slots are their buffers.
            let mut bufs = Vec::with_capacity(descs);
            for k in 0..descs {
                let id = self.rx.peek_free(k).expect("counted above");
                bufs.push(Buf {
                    addr: RX_BUFS + SLOT * u64::from(id),
                    len: self.cfg.rx_buf,
                    write: true,
                });
            }
            self.rx.add(mem, &bufs);
        }
        self.rx.publish(mem)
    }

    /// Sends up to `n` frames of `len` bytes (header included); returns whether to kick.
    pub fn send(&mut self, mem: &GuestMemoryMmap, n: usize, len: u32) -> bool {
        let len = len.clamp(VNET_HDR_LEN as u32, MAX_TX);
        for _ in 0..n {
            // The header in one descriptor and the frame in another, as Linux does without
            // ANY_LAYOUT for small frames; in one when only one is free.
            let Some(a) = self.tx.peek_free(0) else {
                break;
            };
            let one = [Buf {
                addr: TX_BUFS + SLOT * u64::from(a),
                len,
                write: false,
            }];
            let two = self.tx.peek_free(1).map(|b| {
                [
                    Buf {
                        addr: TX_BUFS + SLOT * u64::from(a),
                        len: VNET_HDR_LEN as u32,
                        write: false,
                    },
                    Buf {
                        addr: TX_BUFS + SLOT * u64::from(b),
                        len: len - VNET_HDR_LEN as u32,
                        write: false,
                    },
                ]
            });
            let bufs: &[Buf] = match &two {
                Some(two) if len as usize > VNET_HDR_LEN => two,
                _ => &one,
            };
            if self.tx.add(mem, bufs).is_some() {
                self.sent += 1;
            }
        }
        self.tx.publish(mem)
    }

    /// Sends one control request setting `pairs` queue pairs; returns whether to kick.
    pub fn control(&mut self, mem: &GuestMemoryMmap, pairs: u16) -> bool {
        let Some(q) = self.ctrl.as_mut() else {
            return false;
        };
        let (Some(a), Some(b)) = (q.peek_free(0), q.peek_free(1)) else {
            return false;
        };
        let req = [4u8, 0, pairs.to_le_bytes()[0], pairs.to_le_bytes()[1]];
        let (ra, aa) = (CTRL_BUFS + 16 * u64::from(a), CTRL_BUFS + 16 * u64::from(b));
        let _ = mem.write_slice(&req, GuestAddress(ra));
        let _ = mem.write_obj(0xffu8, GuestAddress(aa));
        let bufs = [
            Buf {
                addr: ra,
                len: 4,
                write: false,
            },
            Buf {
                addr: aa,
                len: 1,
                write: true,
            },
        ];
        if q.add(mem, &bufs).is_some() {
            self.ctrl_sent += 1;
        }
        q.publish(mem)
    }

    /// Turns interrupts off on every queue (the start of a NAPI poll).
    pub fn poll_begin(&mut self, mem: &GuestMemoryMmap) {
        self.rx.disable_cb(mem);
        self.tx.disable_cb(mem);
        if let Some(q) = self.ctrl.as_mut() {
            q.disable_cb(mem);
        }
    }

    /// The poll: takes every used entry, refills the receive queue, turns interrupts on and
    /// polls again while more came. Returns whether to kick the receive queue, and whether
    /// anything was taken.
    pub fn poll(&mut self, mem: &GuestMemoryMmap) -> (bool, bool) {
        let mut kick = false;
        let mut took = false;
        for _ in 0..64 {
            while let Some((_, len)) = self.rx.pop_used(mem) {
                took = true;
                self.take_rx(mem, len);
            }
            assert!(
                !self.mid_frame(),
                "a mergeable frame's buffers were not all given back together"
            );
            while self.tx.pop_used(mem).is_some() {
                took = true;
                self.tx_done += 1;
            }
            if let Some(q) = self.ctrl.as_mut() {
                while let Some((head, len)) = q.pop_used(mem) {
                    took = true;
                    assert_eq!(len, 1, "a control answer is one byte");
                    let ids = q.last_chain();
                    assert_eq!(ids.first(), Some(&head));
                    let at = CTRL_BUFS + 16 * u64::from(ids[1]);
                    let ack: u8 = mem.read_obj(GuestAddress(at)).unwrap_or(0xff);
                    assert!(ack <= 1, "the device answered {ack}");
                    self.ctrl_answered += 1;
                }
            }
            kick |= self.post_rx(mem, usize::from(self.cfg.size));
            let quiet = self.rx.enable_cb(mem)
                & self.tx.enable_cb(mem)
                & self.ctrl.as_mut().is_none_or(|q| q.enable_cb(mem));
            if quiet {
                break;
            }
            self.poll_begin(mem);
        }
        (kick, took)
    }

    /// One used receive entry (the chain [`DriverRing::pop_used`] just gave back): a whole
    /// frame, or (mergeable) a part of one.
    fn take_rx(&mut self, mem: &GuestMemoryMmap, len: u32) {
        let mut bytes = Vec::new();
        for &id in self.rx.last_chain() {
            let mut b = vec![0u8; self.cfg.rx_buf as usize];
            let _ = mem.read_slice(&mut b, GuestAddress(RX_BUFS + SLOT * u64::from(id)));
            bytes.extend_from_slice(&b);
        }
        assert!(len as usize <= bytes.len(), "a used length past the chain");
        bytes.truncate(len as usize);
        if !self.cfg.mergeable {
            assert!(
                bytes.len() >= VNET_HDR_LEN,
                "a frame shorter than its header"
            );
            assert_eq!(
                num_buffers(&bytes),
                1,
                "num_buffers without mergeable buffers"
            );
            self.check(&bytes);
            return;
        }
        if self.partial.1 == 0 {
            assert!(
                bytes.len() >= VNET_HDR_LEN,
                "a first buffer shorter than the header"
            );
            let n = num_buffers(&bytes);
            assert!(n >= 1, "num_buffers 0 in a mergeable frame");
            self.partial.2 = n;
        }
        self.partial.0.extend_from_slice(&bytes);
        self.partial.1 += 1;
        if self.partial.1 == usize::from(self.partial.2) {
            let frame = std::mem::take(&mut self.partial.0);
            self.partial = (Vec::new(), 0, 0);
            self.check(&frame);
        }
    }

    /// A received frame is one the host sent, whole: its header, then the pattern.
    fn check(&mut self, frame: &[u8]) {
        assert!(
            frame.len() >= VNET_HDR_LEN + 4,
            "a frame of {} bytes",
            frame.len()
        );
        let payload = &frame[VNET_HDR_LEN..];
        let seq = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        for (i, b) in payload.iter().enumerate() {
            assert_eq!(*b, payload_byte(seq, i), "frame {seq}: byte {i} differs");
        }
        self.received.push((seq, payload.len()));
    }

    /// Whether a mergeable frame is still partly delivered.
    pub fn mid_frame(&self) -> bool {
        self.partial.1 != 0
    }
}

fn num_buffers(frame: &[u8]) -> u16 {
    u16::from_le_bytes([frame[10], frame[11]])
}

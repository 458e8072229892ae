//! The ends of the network model's device: the host's side of the tap (frames for the
//! guest), the sink for what the guest sends, and the device as the transport sees it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;

use vmm_sys_util::eventfd::EventFd;

use super::PAIRS;
use crate::devices::net::offered_features;
use crate::devices::net::rx::FrameSource;
use crate::devices::net::tap::VNET_HDR_LEN;
use crate::devices::net::tx::FrameSink;
use crate::devices::virtio::VirtioDevice;

/// The host's side of the tap: frames for the guest, read as a tap reads (cut to the
/// buffers, the bytes read returned).
#[derive(Default)]
pub struct ModelTap {
    pub(super) frames: RefCell<VecDeque<Vec<u8>>>,
    /// For the next batch of reads (answered span by span, as io_uring answers them): bit i
    /// set, read i finds nothing although frames wait, as when a frame comes just after a
    /// read found the tap empty.
    pub(super) late: Cell<u64>,
}

impl ModelTap {
    /// Queues `frame` (its virtio header first) for the device to read.
    pub fn push(&self, frame: Vec<u8>) {
        self.frames.borrow_mut().push_back(frame);
    }

    /// Frames not yet read.
    pub fn len(&self) -> usize {
        self.frames.borrow().len()
    }

    /// Whether every frame was read.
    pub fn is_empty(&self) -> bool {
        self.frames.borrow().is_empty()
    }
}

impl FrameSource for ModelTap {
    unsafe fn read_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[std::ops::Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        let late = self.late.take();
        for (i, span) in spans.iter().enumerate() {
            out.push(if i < 64 && late >> i & 1 == 1 {
                Err(io::Error::from(io::ErrorKind::WouldBlock))
            } else {
                // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
                unsafe { self.read_frame(&iov[span.clone()]) }
            });
        }
    }

    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let Some(f) = self.frames.borrow_mut().pop_front() else {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        };
        let mut done = 0;
        for v in iov {
            if done == f.len() {
                break;
            }
            let n = v.iov_len.min(f.len() - done);
            // SAFETY: the caller guarantees each iovec is valid for writes of its length; `n`
            // is at most that and at most what is left of the frame.
            unsafe { std::ptr::copy_nonoverlapping(f[done..].as_ptr(), v.iov_base.cast(), n) };
            done += n;
        }
        Ok(done)
    }
}

/// Where the guest's frames go: counted, their headers checked.
#[derive(Default)]
pub(super) struct ModelSink {
    pub(super) frames: Cell<u64>,
}

impl FrameSink for ModelSink {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let len: usize = iov.iter().map(|v| v.iov_len).sum();
        assert!(
            len >= VNET_HDR_LEN,
            "a frame of {len} bytes reached the tap"
        );
        self.frames.set(self.frames.get() + 1);
        Ok(len)
    }
}

/// The device as the transport sees it: features, configuration space, no kick eventfds
/// (the model delivers kicks itself).
pub(super) struct ModelDevice {
    pub(super) config: [u8; 12],
}

impl VirtioDevice for ModelDevice {
    fn device_type(&self) -> u32 {
        1
    }
    fn features(&self) -> u64 {
        offered_features(PAIRS)
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.config.get(offset as usize + i).copied().unwrap_or(0);
        }
    }
    fn kick_fd(&self, _queue: usize) -> Option<&EventFd> {
        None
    }
}

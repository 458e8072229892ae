//! A queue pair's tap with its thread's io_uring ([`crate::devices::uring`]): a pass's frames go
//! out, and come in, a batch per system call while the ring works; one `writev` or `readv` a
//! frame where the kernel gave no ring or after it failed (said once in the log).
//!
//! Data flow: the queue pair's thread makes its ring on the tap queue before its seccomp
//! filter and, for each pass, wraps the tap and the ring in a [`TapRing`], the sink of the
//! transmit pass ([`super::super::tx::FrameSink`]) and the source of the receive pass
//! ([`super::super::rx::FrameSource`]).

use std::io;
use std::ops::Range;

use super::Tap;
use crate::devices::net::rx::FrameSource;
use crate::devices::net::tx::FrameSink;
use crate::devices::uring::Ring;

/// The tap queue of one queue pair and its thread's ring.
pub struct TapRing<'a> {
    /// The tap queue.
    pub tap: &'a Tap,
    /// Its ring, made by the queue pair's thread; None where the kernel gave none.
    pub ring: Option<&'a Ring>,
    /// The thread's name, for the log.
    pub name: &'a str,
}

/// A request the file cannot serve without blocking: io_uring's way of saying "not here".
fn refused(r: &io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP))
}

impl TapRing<'_> {
    /// The usable ring, if any.
    fn ring(&self) -> Option<&Ring> {
        self.ring.filter(|r| r.usable())
    }

    /// Sends a batch through the ring with `f` when there is a usable one. Returns None when
    /// every span was answered, else the index of the first span left to one system call each
    /// (all of them without a ring, or after it failed or was refused).
    fn through_ring(
        &self,
        out: &mut Vec<io::Result<usize>>,
        f: impl FnOnce(&Ring, &mut Vec<io::Result<usize>>) -> io::Result<()>,
    ) -> Option<usize> {
        let base = out.len();
        if let Some(ring) = self.ring() {
            let done = f(ring, out);
            if self.stands(ring, done, out, base) {
                return None;
            }
        }
        Some(out.len() - base)
    }

    /// After a batch through the ring: true when its results stand; false when the ring failed
    /// (`done`'s error) or the tap refused it, and it is given up (the results from `base` on
    /// are dropped, the caller goes on without the ring).
    fn stands(
        &self,
        ring: &Ring,
        done: io::Result<()>,
        out: &mut Vec<io::Result<usize>>,
        base: usize,
    ) -> bool {
        match done {
            Ok(()) if !out[base..].iter().any(refused) => return true,
            Ok(()) => {
                log::warn!(
                    "{}: the tap refuses requests that must not block; frames go one system call each from now on",
                    self.name
                );
                out.truncate(base);
            }
            Err(e) => log::warn!(
                "{}: the tap's io_uring failed ({e}); frames go one system call each from now on",
                self.name
            ),
        }
        ring.give_up();
        false
    }
}

impl FrameSink for TapRing<'_> {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.tap.writev(iov) }
    }

    unsafe fn write_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        // SAFETY: forwarded from this function's contract.
        let Some(left) = self.through_ring(out, |r, out| unsafe { r.writev_each(iov, spans, out) })
        else {
            return;
        };
        for span in &spans[left..] {
            // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
            out.push(unsafe { self.tap.writev(&iov[span.clone()]) });
        }
    }
}

impl FrameSource for TapRing<'_> {
    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.tap.readv(iov) }
    }

    unsafe fn read_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        // SAFETY: forwarded from this function's contract.
        let Some(left) = self.through_ring(out, |r, out| unsafe { r.readv_each(iov, spans, out) })
        else {
            return;
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.tap.read_frames(iov, &spans[left..], out) }
    }
}

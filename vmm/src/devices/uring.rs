//! Batched, never-blocking reads and writes of one file through an io_uring: a device thread's
//! way to give the kernel many frames with one system call instead of one `writev` or `readv`
//! each.
//!
//! Why: on the development host a system call's entry and exit alone cost ~280 ns (a bare
//! `getppid`), a fifth to a sixth of what a 64-byte frame costs the tap's `writev` in all; a
//! ring of 64 frames pays it once. Measured on that host (2 CPUs), one thread writing 64-byte
//! frames from 256 buffers into a tap: 1,820–1,880 ns a frame by `writev`, 1,270–1,510 ns by
//! this ring (docs/design.md).
//!
//! Data flow: the thread that owns a device's file makes its [`Ring`] once, before its
//! seccomp filter (set-up needs `io_uring_setup` and `io_uring_register`, which the filter
//! does not allow). [`Ring::writev_each`] queues one `WRITEV` a frame ([`Ring::readv_each`]
//! one `READV`) and enters the kernel once for a batch of up to [`DEPTH`], waiting for every
//! completion before it returns, so no buffer is still in the kernel's hands when the caller
//! gives it back to the guest.
//!
//! What keeps it exact and safe:
//! - Every read and write carries `RWF_NOWAIT`: one that would block fails with `EAGAIN`
//!   (a read of an empty tap, a write to a full one) instead of being parked on a poll or
//!   given to one of io_uring's worker threads. The work is therefore done inside the calling
//!   thread's `io_uring_enter`, on its own CPU clock, where the device's thread accounting
//!   finds it; a file that cannot honour `RWF_NOWAIT` fails every one with `EOPNOTSUPP`,
//!   which the caller takes as "use `writev`/`readv`".
//! - The ring is made disabled, and before it is enabled it is restricted
//!   (`IORING_REGISTER_RESTRICTIONS`) to `READV`, `WRITEV`, `READ` and `WRITE` (a frame in one
//!   buffer goes without an iovec array) on its one registered file: no
//!   other operation, no other file, no later registration but letting go of that file.
//!   io_uring's operations do not pass the seccomp filter, so the restriction is what holds a
//!   compromised device thread to the file it already reads and writes.

use std::cell::{Cell, RefCell};
use std::io;
use std::ops::Range;
use std::os::fd::RawFd;

use io_uring::{opcode, register::Restriction, squeue, types, IoUring};

/// Writes in flight at most: one kernel entry a batch of this many.
pub const DEPTH: u32 = 64;

/// `IORING_UNREGISTER_FILES`, the one registration a restricted ring still allows (the crate
/// does not export the kernel's opcodes).
const UNREGISTER_FILES: u8 = 3;

/// Which way a batch goes.
#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
}

/// An io_uring that may only read and write, without blocking, one file.
pub struct Ring {
    ring: RefCell<IoUring>,
    /// The ring failed once, or the file refused what it asked: its owner goes without it.
    given_up: Cell<bool>,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // A closed ring lets go of its files later, from a kernel worker: a tap's next user
        // (the next VM on it, or this one's re-open) would find it still attached (EBUSY).
        // Unregistering lets go of the file now.
        if let Err(e) = self.ring.get_mut().submitter().unregister_files() {
            log::debug!("an io_uring kept its file until the kernel closes it ({e})");
        }
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("depth", &DEPTH).finish()
    }
}

impl Ring {
    /// A ring restricted to reading and writing `fd`. Fails where the kernel has no io_uring,
    /// refuses it (`kernel.io_uring_disabled`, a container's seccomp profile) or lacks
    /// restrictions (Linux before 5.10).
    pub fn new(fd: RawFd) -> io::Result<Ring> {
        let ring = IoUring::builder().setup_r_disabled().build(DEPTH)?;
        let sub = ring.submitter();
        sub.register_files(&[fd])?;
        let fixed = squeue::Flags::FIXED_FILE.bits();
        sub.register_restrictions(&mut [
            Restriction::register_op(UNREGISTER_FILES),
            Restriction::sqe_op(opcode::Writev::CODE),
            Restriction::sqe_op(opcode::Readv::CODE),
            Restriction::sqe_op(opcode::Write::CODE),
            Restriction::sqe_op(opcode::Read::CODE),
            Restriction::sqe_flags_required(fixed),
        ])?;
        sub.register_enable_rings()?;
        Ok(Ring {
            ring: RefCell::new(ring),
            given_up: Cell::new(false),
        })
    }

    /// Whether the owner should still go through the ring.
    pub fn usable(&self) -> bool {
        !self.given_up.get()
    }

    /// The owner stops going through the ring (it failed, or the file cannot serve it without
    /// blocking).
    pub fn give_up(&self) {
        self.given_up.set(true);
    }

    /// Writes frame `i` from `iov[spans[i]]`, in order, and pushes each frame's result (bytes
    /// written, or the error) to `out`. Returns an error only when the ring itself failed; `out`
    /// then holds the results of the frames before the failed batch, and none of that batch's
    /// frames was written (io_uring takes no entry of a submission it refuses).
    ///
    /// # Safety
    /// Every `iovec` in `iov` must describe memory valid for reads of its length until this
    /// call returns.
    pub unsafe fn writev_each(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) -> io::Result<()> {
        // SAFETY: forwarded from this function's contract (the kernel only reads the buffers).
        unsafe { self.each(Op::Write, iov, spans, out) }
    }

    /// Reads into `iov[spans[i]]` for each span, in order, one read each (on a tap: one frame
    /// each), and pushes each read's result to `out`: `EAGAIN` for a read that found nothing.
    /// The reads are issued one after another in one call, so a frame that comes while they
    /// run may land in a later span than one that found nothing. Errors as
    /// [`Self::writev_each`].
    ///
    /// # Safety
    /// Every `iovec` in `iov` must describe memory valid for writes of its length until this
    /// call returns, and not otherwise accessed by this thread meanwhile.
    pub unsafe fn readv_each(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) -> io::Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.each(Op::Read, iov, spans, out) }
    }

    /// One `op` a span, in batches of [`DEPTH`], every batch waited for.
    ///
    /// # Safety
    /// As [`Self::readv_each`] for reads, [`Self::writev_each`] for writes.
    unsafe fn each(
        &self,
        op: Op,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) -> io::Result<()> {
        let mut ring = self.ring.borrow_mut();
        for batch in spans.chunks(DEPTH as usize) {
            let base = out.len();
            for (k, span) in batch.iter().enumerate() {
                let list = &iov[span.clone()];
                let len = u32::try_from(list.len()).unwrap_or(u32::MAX);
                // One buffer goes as a plain READ or WRITE: the kernel then has no iovec array
                // to copy in and check (`copy_iovec_from_user`, `__import_iovec`: ~3 % of a
                // receive thread's samples here, which a loop's `read` does not pay).
                let one = match list {
                    [single] => u32::try_from(single.iov_len)
                        .ok()
                        .map(|n| (single.iov_base.cast::<u8>(), n)),
                    _ => None,
                };
                let file = types::Fixed(0);
                let entry = match (op, one) {
                    (Op::Write, Some((buf, n))) => opcode::Write::new(file, buf, n)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                    (Op::Read, Some((buf, n))) => opcode::Read::new(file, buf, n)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                    (Op::Write, None) => opcode::Writev::new(file, list.as_ptr(), len)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                    (Op::Read, None) => opcode::Readv::new(file, list.as_ptr(), len)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                };
                let sqe = entry.flags(squeue::Flags::FIXED_FILE).user_data(k as u64);
                // SAFETY: the entry names `list`, a slice of `iov` (or the one buffer its one
                // iovec describes), whose buffers the caller keeps valid (for reads or writes,
                // as `op` needs) until this call returns; the loop below does not return before
                // every entry of the batch has completed. The queue has room: it holds DEPTH
                // entries and a batch is at most DEPTH, pushed into a queue left empty by the
                // previous batch's submission.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    return Err(io::Error::from_raw_os_error(libc::EBUSY));
                }
            }
            out.resize_with(base + batch.len(), || {
                Err(io::Error::from_raw_os_error(libc::ECANCELED))
            });
            let (mut done, mut failures) = (0, 0u32);
            while done < batch.len() {
                match ring.submit_and_wait(batch.len() - done) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) if done == 0 && !ring.submission().is_empty() => {
                        // Refused before anything was taken: nothing of the batch went out.
                        out.truncate(base);
                        return Err(e);
                    }
                    // Taken but the wait failed: the writes are the kernel's; wait again, a
                    // bounded number of times (guest memory, which they read, stays mapped).
                    Err(e) => {
                        failures += 1;
                        if failures > 1000 {
                            return Err(e);
                        }
                        continue;
                    }
                }
                for cqe in ring.completion() {
                    let Some(slot) = usize::try_from(cqe.user_data())
                        .ok()
                        .and_then(|k| out.get_mut(base + k))
                    else {
                        continue;
                    };
                    let r = cqe.result();
                    *slot = if r < 0 {
                        Err(io::Error::from_raw_os_error(-r))
                    } else {
                        Ok(usize::try_from(r).unwrap_or(0))
                    };
                    done += 1;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::*;

    /// A SOCK_SEQPACKET pair: each write is one record at the other end.
    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0, "socketpair: {}", io::Error::last_os_error());
        // SAFETY: socketpair succeeded, so both are open descriptors this test now owns.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn iovec(b: &[u8]) -> libc::iovec {
        libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        }
    }

    fn read(fd: &OwnedFd) -> Option<Vec<u8>> {
        let mut buf = [0u8; 512];
        // SAFETY: `buf` is writable for its length.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        (n >= 0).then(|| buf[..n as usize].to_vec())
    }

    #[test]
    fn frames_go_out_in_order_each_gathered_whole() {
        let (a, b) = pair();
        let Ok(ring) = Ring::new(a.as_raw_fd()) else {
            eprintln!("skipped: this kernel gives no io_uring");
            return;
        };
        // 100 frames (two batches), each in two pieces.
        let data: Vec<[u8; 8]> = (0..100u8).map(|i| [i; 8]).collect();
        let mut iov = Vec::new();
        let mut spans = Vec::new();
        for d in &data {
            spans.push(iov.len()..iov.len() + 2);
            iov.push(iovec(&d[..3]));
            iov.push(iovec(&d[3..]));
        }
        let mut out = Vec::new();
        // SAFETY: every iovec points into `data`, alive and unchanged for the call.
        unsafe { ring.writev_each(&iov, &spans, &mut out) }.unwrap();
        assert_eq!(out.len(), 100);
        assert!(out.iter().all(|r| matches!(r, Ok(8))), "{out:?}");
        for d in &data {
            assert_eq!(read(&b).as_deref(), Some(&d[..]));
        }
        assert_eq!(read(&b), None, "nothing written twice");
    }

    #[test]
    fn frames_in_one_buffer_and_in_several_go_and_come_back_alike() {
        let (a, b) = pair();
        let (Ok(tx), Ok(rx)) = (Ring::new(a.as_raw_fd()), Ring::new(b.as_raw_fd())) else {
            eprintln!("skipped: this kernel gives no io_uring");
            return;
        };
        // Even frames in one buffer (READ, WRITE), odd ones in two (READV, WRITEV).
        let data: Vec<[u8; 8]> = (0..10u8).map(|i| [i; 8]).collect();
        let pieces = |i: usize| if i % 2 == 0 { 1 } else { 2 };
        let (mut iov, mut spans) = (Vec::new(), Vec::new());
        for (i, d) in data.iter().enumerate() {
            spans.push(iov.len()..iov.len() + pieces(i));
            if pieces(i) == 1 {
                iov.push(iovec(d));
            } else {
                iov.extend([iovec(&d[..5]), iovec(&d[5..])]);
            }
        }
        let mut out = Vec::new();
        // SAFETY: every iovec points into `data`, alive and unchanged for the call.
        unsafe { tx.writev_each(&iov, &spans, &mut out) }.unwrap();
        assert!(out.iter().all(|r| matches!(r, Ok(8))), "{out:?}");
        let mut back = vec![[0u8; 8]; 10];
        let (mut iov, mut spans) = (Vec::new(), Vec::new());
        for (i, d) in back.iter_mut().enumerate() {
            spans.push(iov.len()..iov.len() + pieces(i));
            let (x, y) = d.split_at_mut(if pieces(i) == 1 { 8 } else { 3 });
            iov.push(libc::iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: x.len(),
            });
            if pieces(i) == 2 {
                iov.push(libc::iovec {
                    iov_base: y.as_mut_ptr().cast(),
                    iov_len: y.len(),
                });
            }
        }
        // One read more than there are records: it finds nothing and says so.
        let mut spare = [0u8; 8];
        spans.push(iov.len()..iov.len() + 1);
        iov.push(libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        });
        let mut out = Vec::new();
        // SAFETY: every iovec points into `back` or `spare`, each part named once, alive and
        // not otherwise touched until the call returns.
        unsafe { rx.readv_each(&iov, &spans, &mut out) }.unwrap();
        assert!(out[..10].iter().all(|r| matches!(r, Ok(8))), "{out:?}");
        assert!(
            matches!(&out[10], Err(e) if e.raw_os_error() == Some(libc::EAGAIN)),
            "{out:?}"
        );
        assert_eq!(back, data);
    }

    #[test]
    fn a_write_that_would_block_fails_at_once_and_the_rest_are_answered() {
        let (a, b) = pair();
        let Ok(ring) = Ring::new(a.as_raw_fd()) else {
            eprintln!("skipped: this kernel gives no io_uring");
            return;
        };
        // More records than the socket buffer takes: the ones past it would block.
        let big = vec![7u8; 64 * 1024];
        let iov: Vec<libc::iovec> = (0..40).map(|_| iovec(&big)).collect();
        let spans: Vec<Range<usize>> = (0..40).map(|i| i..i + 1).collect();
        let mut out = Vec::new();
        // SAFETY: every iovec points into `big`, alive and unchanged for the call.
        unsafe { ring.writev_each(&iov, &spans, &mut out) }.unwrap();
        assert_eq!(out.len(), 40);
        let sent = out.iter().filter(|r| r.is_ok()).count();
        let blocked = out
            .iter()
            .filter(|r| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EAGAIN)))
            .count();
        assert!(
            sent > 0 && blocked > 0,
            "{sent} sent, {blocked} would block"
        );
        assert_eq!(sent + blocked, 40, "{out:?}");
        let mut got = 0;
        while read(&b).is_some() {
            got += 1;
        }
        assert_eq!(got, sent, "every write said sent arrived, no other");
    }

    #[test]
    fn the_ring_writes_only_its_own_file() {
        let (a, _b) = pair();
        let Ok(ring) = Ring::new(a.as_raw_fd()) else {
            eprintln!("skipped: this kernel gives no io_uring");
            return;
        };
        let mut r = ring.ring.borrow_mut();
        let buf = [0u8; 8];
        // A write naming a plain descriptor, not the registered file, is refused.
        let sqe = opcode::Write::new(types::Fd(a.as_raw_fd()), buf.as_ptr(), 8)
            .build()
            .user_data(1);
        // SAFETY: `buf` outlives the wait below, which ends with the entry's completion.
        unsafe { r.submission().push(&sqe) }.unwrap();
        let refused = match r.submit_and_wait(1) {
            Err(_) => true,
            Ok(_) => r.completion().next().is_some_and(|c| c.result() < 0),
        };
        assert!(
            refused,
            "a WRITE on an unregistered descriptor went through"
        );
    }
}

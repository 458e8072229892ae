//! A device thread's waits for its rate limiters: one timer for the thread, and per way it
//! serves (receive 0 and transmit 1 of a queue pair; a disk's queue is way 0) when that way
//! may go again.
//!
//! Data flow: a pass the limiter stopped says how long to wait; the thread calls
//! [`Waits::throttle`], which stamps the queue's [`super::ThrottleClock`], counts the stop
//! and arms the timer for the earliest end. The thread does not serve a waiting way (its
//! kicks are counted and left; receive stops reading its tap). When the timer fires,
//! [`Waits::due`] ends the waits that are over, stamps their clocks and arms the timer for
//! those left; the thread then runs the ways that are due. A reset ends every wait
//! ([`Waits::clear`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;

use vmm_sys_util::timerfd::TimerFd;

use crate::devices::virtio::counters::QueueCounters;

/// The ways a thread serves at most.
pub const WAYS: usize = 2;

/// The waits of one device thread.
#[derive(Debug)]
pub struct Waits {
    timer: TimerFd,
    until: [Option<u64>; WAYS],
    armed: Option<u64>,
}

impl Waits {
    /// A thread's waits, with its timer (non-blocking: a stale readiness reads nothing).
    pub fn new() -> io::Result<Self> {
        // SAFETY: timerfd_create takes no pointers; the result is checked before use.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waits {
            // SAFETY: `fd` is a timerfd this call just made and nothing else owns.
            timer: unsafe { TimerFd::from_raw_fd(fd) },
            until: [None; WAYS],
            armed: None,
        })
    }

    /// Whether `way` waits for its tokens now.
    pub fn waiting(&self, way: usize) -> bool {
        self.until.get(way).is_some_and(Option::is_some)
    }

    fn arm(&mut self, now_ns: u64) {
        let Some(next) = self.until.iter().flatten().min().copied() else {
            return;
        };
        if self.armed == Some(next) {
            return;
        }
        let wait = Duration::from_nanos(next.saturating_sub(now_ns).max(1));
        match self.timer.reset(wait, None) {
            Ok(()) => self.armed = Some(next),
            Err(e) => log::error!("cannot arm a rate limiter's timer: {e}"),
        }
    }

    /// `way` (whose queue counts into `q`) waits `wait_ns` from `now_ns`. A way that waits
    /// already gets the new end (its stop counted once).
    pub fn throttle(&mut self, way: usize, wait_ns: u64, q: &QueueCounters, now_ns: u64) {
        let Some(u) = self.until.get_mut(way) else {
            return;
        };
        if u.is_none() {
            q.throttles.add(1);
            q.throttled.begin(now_ns);
        }
        *u = Some(now_ns.saturating_add(wait_ns));
        self.arm(now_ns);
    }

    /// The timer fired: the ways whose wait is over (their clocks stamped by `queue(way)`),
    /// the timer armed again for the others.
    pub fn due<'a>(
        &mut self,
        now_ns: u64,
        queue: impl Fn(usize) -> &'a QueueCounters,
    ) -> [bool; WAYS] {
        let _ = self.timer.wait();
        self.armed = None;
        let mut due = [false; WAYS];
        for (way, u) in self.until.iter_mut().enumerate() {
            if u.is_some_and(|t| t <= now_ns) {
                *u = None;
                queue(way).throttled.end(now_ns);
                due[way] = true;
            }
        }
        self.arm(now_ns);
        due
    }

    /// Every wait ends now (a reset; the device stops); the timer is disarmed.
    pub fn clear<'a>(&mut self, now_ns: u64, queue: impl Fn(usize) -> &'a QueueCounters) {
        for (way, u) in self.until.iter_mut().enumerate() {
            if u.take().is_some() {
                queue(way).throttled.end(now_ns);
            }
        }
        if self.armed.take().is_some() {
            let _ = self.timer.clear();
        }
    }
}

impl AsRawFd for Waits {
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_counted_once_timed_and_ends_when_due() {
        let mut w = Waits::new().unwrap();
        let q = [QueueCounters::default(), QueueCounters::default()];
        let now = crate::sync::now_ns();
        w.throttle(1, 2_000_000, &q[1], now);
        w.throttle(1, 3_000_000, &q[1], now + 1_000);
        w.throttle(0, 1_000_000, &q[0], now);
        assert!(w.waiting(0) && w.waiting(1) && !w.waiting(5));
        assert_eq!((q[0].throttles.get(), q[1].throttles.get()), (1, 1));
        // Nothing is due before its end.
        assert_eq!(w.due(now + 500_000, |i| &q[i]), [false, false]);
        assert_eq!(w.due(now + 1_000_000, |i| &q[i]), [true, false]);
        assert_eq!(q[0].throttled.total_ns(u64::MAX / 2), 1_000_000);
        assert!(w.waiting(1) && !w.waiting(0));
        w.clear(now + 2_500_000, |i| &q[i]);
        assert!(!w.waiting(1));
        assert_eq!(q[1].throttled.total_ns(u64::MAX / 2), 2_500_000);
    }

    #[test]
    fn the_timer_fires_when_the_earliest_wait_ends() {
        let mut w = Waits::new().unwrap();
        let q = QueueCounters::default();
        let now = crate::sync::now_ns();
        w.throttle(0, 1_000_000, &q, now);
        let mut pfd = libc::pollfd {
            fd: w.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 5_000) };
        assert_eq!(n, 1, "the timer fired");
        assert_eq!(w.due(crate::sync::now_ns(), |_| &q), [true, false]);
        // Read once: not readable again until armed.
        // SAFETY: as above.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        assert_eq!(n, 0);
    }
}

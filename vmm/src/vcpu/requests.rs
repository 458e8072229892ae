//! What other threads ask of a vCPU: the request set ([`Requests`]) its loop reads before
//! each entry, the word it lives in ([`RequestWord`]), and the limits that can stop it
//! ([`LimitKind`]).
//!
//! Data flow: a controller (the VM's end, the socket's pause, the sampler, the limiter) sets
//! requests with `VcpuShared::kick` or clears them with `VcpuShared::release`; both are one
//! atomic read-modify-write of the [`RequestWord`]. The vCPU thread loads the word once per
//! loop turn and parks or ends on what it finds. A limit's request comes from its
//! [`LimitKind`], as does its kick-timer slot; nothing maps a request back to a slot, so a
//! stop or a pause can never be taken for a limit.

use std::ops::{BitOr, BitOrAssign};
use std::sync::atomic::{AtomicU32, Ordering};

/// A set of requests to a vCPU: a copy of its request word (no allocation, no lock).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requests(u32);

impl Requests {
    /// No request.
    pub const NONE: Requests = Requests(0);
    /// Leave the loop at the next exit.
    pub const STOP: Requests = Requests(1);
    /// Park (paused) at the next exit until the request is cleared.
    pub const PAUSE: Requests = Requests(2);
    /// Any limit's request: park (limited) at the next exit until every one is cleared.
    pub const LIMIT: Requests = Requests(
        LimitKind::Group.request().0 | LimitKind::Vm.request().0 | LimitKind::Runaway.request().0,
    );

    /// Whether every request of `other` is in the set.
    pub const fn contains(self, other: Requests) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any request of `other` is in the set.
    pub const fn intersects(self, other: Requests) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Requests {
    type Output = Requests;

    fn bitor(self, rhs: Requests) -> Requests {
        Requests(self.0 | rhs.0)
    }
}

impl BitOrAssign for Requests {
    fn bitor_assign(&mut self, rhs: Requests) {
        self.0 |= rhs.0;
    }
}

impl From<LimitKind> for Requests {
    fn from(kind: LimitKind) -> Requests {
        kind.request()
    }
}

/// The atomic word a vCPU's [`Requests`] live in.
#[derive(Debug, Default)]
pub(super) struct RequestWord(AtomicU32);

impl RequestWord {
    /// The requests now.
    pub(super) fn load(&self) -> Requests {
        Requests(self.0.load(Ordering::Acquire))
    }

    /// Adds `r`.
    pub(super) fn set(&self, r: Requests) {
        self.0.fetch_or(r.0, Ordering::AcqRel);
    }

    /// Removes `r`.
    pub(super) fn clear(&self, r: Requests) {
        self.0.fetch_and(!r.0, Ordering::AcqRel);
    }
}

/// A limit that can stop a vCPU: each has its request and its kick-timer slot, so neither
/// can be given for another kind of request (a stop or a pause has no slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The vCPU's group is out of budget.
    Group,
    /// The VM-wide limit.
    Vm,
    /// A throttle runaway detection applied.
    Runaway,
}

impl LimitKind {
    /// Every kind, in slot order.
    pub const ALL: [LimitKind; 3] = [LimitKind::Group, LimitKind::Vm, LimitKind::Runaway];

    /// Its request (part of [`Requests::LIMIT`]).
    pub const fn request(self) -> Requests {
        Requests(match self {
            LimitKind::Group => 4,
            LimitKind::Vm => 8,
            LimitKind::Runaway => 16,
        })
    }

    /// Its kick-timer deadline slot (0 to `kick_timer::SLOTS` - 1): known to the vCPU module
    /// alone, which indexes its slots by kind.
    pub(super) const fn slot(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_is_its_own_bit() {
        let mut all = [Requests::STOP, Requests::PAUSE].to_vec();
        all.extend(LimitKind::ALL.map(Requests::from));
        for (i, a) in all.iter().enumerate() {
            assert_eq!(a.0.count_ones(), 1, "{a:?} is one bit");
            for b in &all[i + 1..] {
                assert!(!a.intersects(*b), "{a:?} and {b:?} overlap");
            }
        }
        let limits = LimitKind::ALL
            .into_iter()
            .fold(Requests::NONE, |s, k| s | k.into());
        assert_eq!(limits, Requests::LIMIT);
        assert!(!Requests::LIMIT.intersects(Requests::STOP | Requests::PAUSE));
        assert_eq!(LimitKind::ALL.map(LimitKind::slot), [0, 1, 2]);
    }

    #[test]
    fn the_set_operations_read_as_their_names() {
        let s = Requests::PAUSE | LimitKind::Vm.into();
        assert!(s.contains(Requests::PAUSE));
        assert!(!s.contains(Requests::LIMIT), "one limit is not all of them");
        assert!(s.intersects(Requests::LIMIT));
        assert!(!s.intersects(Requests::STOP));
        assert!(!s.is_empty());
        assert!(Requests::NONE.is_empty());
        let mut t = Requests::NONE;
        t |= Requests::STOP;
        assert_eq!(t, Requests::STOP);
    }

    #[test]
    fn the_word_sets_and_clears_only_what_it_is_given() {
        let w = RequestWord::default();
        w.set(Requests::PAUSE | LimitKind::Group.into());
        w.set(Requests::STOP);
        w.clear(LimitKind::Group.into());
        assert_eq!(w.load(), Requests::PAUSE | Requests::STOP);
        w.clear(Requests::PAUSE | Requests::STOP);
        assert!(w.load().is_empty());
    }
}

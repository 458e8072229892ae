//! The body every device thread shares: its meter started, an event loop over one
//! subscriber (the device's worker), the thread's seccomp filter, the loop run until the
//! device is stopped, every wait of the loop stamped for the thread's accounting, and the
//! thread held, instead of serving its queues, while a CPU limit of scope `vm` holds it.
//!
//! Data flow: a device's `start` spawns a thread per queue (or queue pair) that calls
//! [`run`] with its worker; the worker's `init` registers its eventfds, its `process` does
//! the work; [`run`] wraps each wait in [`WorkerMeter::wait_begin`] and `wait_end`, so the
//! thread's `waiting_ns` is exactly its time asleep in the loop, and ends the meter when the
//! device's stop flag is set (the device wakes the thread after setting it).

use std::sync::atomic::{AtomicBool, Ordering};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};

use crate::accounting::worker::WorkerMeter;
use crate::seccomp::Kind;

/// How a device thread runs: its name in the log, its meter, its device's stop flag, its
/// seccomp filter, and the kinds of pass (bits) whose first run after a hold counts the
/// frames that waited for it.
pub struct ThreadParams<'a> {
    /// The thread's name in the log (`net0-qp0`).
    pub name: &'a str,
    /// The thread's own meter.
    pub meter: &'a WorkerMeter,
    /// Set when the device stops.
    pub stop: &'a AtomicBool,
    /// The thread's seccomp filter.
    pub seccomp: Kind,
    /// The pass kinds counted after a hold (`ThreadHold::wait`).
    pub held_kinds: u32,
}

/// Runs `worker`'s event loop on this thread until `p.stop` is set.
pub fn run<S: MutEventSubscriber>(p: ThreadParams<'_>, worker: S) {
    let ThreadParams {
        name,
        meter,
        stop,
        seccomp,
        held_kinds,
    } = p;
    meter.start();
    let mut em = match EventManager::<S>::new() {
        Ok(em) => em,
        Err(e) => {
            log::error!("{name}: cannot start its event loop: {e:?}");
            meter.end();
            return;
        }
    };
    em.add_subscriber(worker);
    crate::seccomp::enter(seccomp);
    while !stop.load(Ordering::Acquire) {
        // Held by a CPU limit of scope `vm`: the queues are not served until it ends.
        if meter.hold.is_held() {
            meter.hold.wait(stop, held_kinds);
            continue;
        }
        meter.wait_begin();
        let r = em.run();
        meter.wait_end();
        if let Err(e) = r {
            log::error!("{name}: its event loop failed: {e:?}");
            break;
        }
    }
    meter.end();
}

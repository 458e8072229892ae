//! The body every device thread shares: its meter started, an event loop over one
//! subscriber (the device's worker), the thread's seccomp filter, the loop run until the
//! device is stopped, and every wait of the loop stamped for the thread's accounting.
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

/// Runs `worker`'s event loop on this thread, called `name` in the log, until `stop` is set;
/// `meter` is the thread's own and `seccomp` its filter.
pub fn run<S: MutEventSubscriber>(
    name: &str,
    meter: &WorkerMeter,
    stop: &AtomicBool,
    seccomp: Kind,
    worker: S,
) {
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

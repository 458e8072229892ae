//! The queue of events (vcpu-exit, vm-exit, limit and threshold events, ...) that other
//! threads push for the control socket to stream to its subscribers.
//!
//! Data flow: the run loop, the sampler and the limiter hold an `Arc<EventHub>` and
//! [`EventHub::push`] events into it without ever waiting on a client; the push wakes the
//! `api` thread through the hub's eventfd, and its event loop (`api::serve`) drains the queue
//! and writes each event to the clients that subscribed. It is a module of its own so that
//! the producers need nothing of the control socket and the socket nothing of them.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use ppa_vmm_api::Event;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Events pushed by other threads (the run loop) for the server to stream.
#[derive(Debug)]
pub struct EventHub {
    queue: Mutex<VecDeque<Event>>,
    efd: EventFd,
}

impl EventHub {
    /// An empty hub.
    pub fn new() -> io::Result<Self> {
        Ok(EventHub {
            queue: Mutex::new(VecDeque::new()),
            efd: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Queues an event for every subscriber (never blocks on a client).
    pub fn push(&self, e: Event) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < 65_536 {
            q.push_back(e);
        }
        drop(q);
        let _ = self.efd.write(1);
    }

    pub(crate) fn efd(&self) -> &EventFd {
        &self.efd
    }

    pub(crate) fn drain(&self) -> Vec<Event> {
        let _ = self.efd.read();
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    }
}

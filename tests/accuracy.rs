//! Accuracy tests: how close the VMM's figures come to ground truth (the guest's own rdtsc
//! measurements, the wall clock, a configured limit), as fixed percentage or time bounds.
//!
//! The rule that puts a test here rather than in a functional target: a test belongs here
//! when it asserts a noisy figure within a percentage or time bound, so that a loaded host
//! (other work on its CPUs, or the outer hypervisor of a nested host) can fail it while the
//! code is right. Examples: guest_ns against the guest's rdtsc ran_ns, the share of wall a
//! limit allows, the identity wall = used + steal + halted + idle + limited + paused within
//! its tolerance, the age of the host record a guest reads, a publication rate. A test
//! stays in the functional targets (the main gate) when what it asserts holds on any host
//! however loaded: exact counts (exits, doorbells, periods), protocol behaviour and errors,
//! the presence and shape of reports, equalities between two views of one figure, counters
//! that never decrease, and bounds that follow from the test's own sleeps (paused time
//! after a sleep while paused). A test that asserts both is split: its functional part stays
//! in the main gate, its accuracy part comes here and runs the same scenario again.
//!
//! These tests need an otherwise idle host: scripts/test.sh runs them after every functional
//! test, one at a time (`cargo test --release -p ppa-vmm-cli --test accuracy --
//! --test-threads=1`); the target is `test = false` in vmm/Cargo.toml, so a plain
//! `cargo test` leaves it out. On a busy machine, rerun a failing test once before
//! concluding anything, and never widen a bound to make it pass.

mod common;

#[path = "accuracy/accounting.rs"]
mod accounting;
#[path = "accuracy/guest_page.rs"]
mod guest_page;
#[path = "accuracy/limits.rs"]
mod limits;
#[path = "accuracy/socket.rs"]
mod socket;

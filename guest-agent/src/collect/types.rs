//! The collector's small public types: what it counts of exits ([`Totals`]), where a
//! sample's time went ([`Phases`]) and how it works ([`Options`]).

use super::alarms::Thresholds;
use super::linger;

/// Exits counted since the agent started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Tasks that exited (the guest header's `transient_count`).
    pub exited_count: u64,
    /// Their CPU time, ns.
    pub exited_cpu_ns: u64,
    /// Of those, the ones never in a sample.
    pub unseen_count: u64,
    /// Their CPU time, ns.
    pub unseen_cpu_ns: u64,
    /// Processes that ended.
    pub exited_processes: u64,
    /// Exits found in /proc although taskstats was on (notifications lost).
    pub exits_missed: u64,
    /// The kernel dropped notifications at least once.
    pub exits_lost: bool,
}

/// Where one sample's time went, ns of wall time, and how many threads it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Phases {
    /// System-wide files.
    pub system_ns: u64,
    /// Process CPU clocks.
    pub processes_ns: u64,
    /// Thread files of processes that ran.
    pub threads_ns: u64,
    /// Listing /proc for new tasks.
    pub discover_ns: u64,
    /// Exit notifications and what vanished.
    pub exits_ns: u64,
    /// Choosing the threads to publish and rereading their details.
    pub details_ns: u64,
    /// Threads whose schedstat was read.
    pub threads_read: u64,
    /// Threads whose stat and status were read (chosen for publication, figures moved).
    pub threads_detailed: u64,
}

/// How the collector works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Print one line per exit on stderr.
    pub log_exits: bool,
    /// Threads to choose for publication each sample (the page's thread capacity).
    pub capacity: usize,
    /// Samples an exited thread stays published after its exit (0: none).
    pub linger: u32,
    /// The thresholds whose occurrences are counted and given as alarms.
    pub thresholds: Thresholds,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log_exits: false,
            capacity: ppa_guest_abi::ppa_page::READER_MAX_RECORDS as usize,
            linger: linger::DEFAULT_LINGER,
            thresholds: Thresholds::default(),
        }
    }
}

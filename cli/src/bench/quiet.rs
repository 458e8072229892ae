//! The quiet CPU a bench pins its measured threads to (issue 36: `bench overhead` read off/raw
//! 0.62 to 1.23 round to round on a 16-core host when the raw loop and each level's vCPU ran
//! wherever the scheduler put them): [`pick`] chooses, from the CPUs this process may use, the
//! one least busy over a short sample of /proc/stat ([`busy_ticks`]); [`Pinned`] holds the
//! calling thread on it for the raw loop and gives back its set after.

use ppa_vmm::placement::{affinity_of, allowed, set_affinity, CpuSet};

/// The least busy of `busy` (CPU, busy ticks over the sample); a tie goes to the higher
/// number (CPU 0 takes most of a host's interrupts). None when `busy` is empty.
pub fn pick(busy: &[(usize, u64)]) -> Option<usize> {
    busy.iter()
        .min_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|&(cpu, _)| cpu)
}

/// Each `cpuN` line of /proc/stat: (N, busy ticks: every field but idle and iowait).
fn read_stat() -> Vec<(usize, u64)> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu: usize = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            Some((cpu, v.iter().sum::<u64>().saturating_sub(idle)))
        })
        .collect()
}

/// Busy ticks of each allowed CPU over `ms` milliseconds.
pub fn busy_ticks(ms: u64) -> Vec<(usize, u64)> {
    let allowed: Vec<usize> = allowed().cpus().collect();
    let before = read_stat();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    read_stat()
        .into_iter()
        .filter(|(c, _)| allowed.contains(c))
        .map(|(c, t)| {
            let b = before.iter().find(|x| x.0 == c).map_or(t, |x| x.1);
            (c, t.saturating_sub(b))
        })
        .collect()
}

/// Two CPUs for a bench: the least busy for the threads it measures and the host loops they
/// are compared with, the least busy of the others for the rest (the VMM's service threads, and
/// whatever else runs meanwhile), as an NFV host keeps its data path apart from its emulator
/// threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// The measured threads and the host loops.
    pub measured: usize,
    /// The VMM's service threads and the rest.
    pub rest: usize,
}

impl Layout {
    /// From each allowed CPU's busy ticks ([`busy_ticks`]); None with fewer than two CPUs.
    pub fn of(busy: &[(usize, u64)]) -> Option<Layout> {
        let measured = pick(busy)?;
        let others: Vec<(usize, u64)> = busy.iter().copied().filter(|c| c.0 != measured).collect();
        Some(Layout {
            measured,
            rest: pick(&others)?,
        })
    }

    /// `layout` in words for a bench's text: what runs on the measured CPU, what on the other.
    pub fn describe(layout: Option<Layout>, measured: &str, rest: &str) -> String {
        layout.map_or_else(
            || "not pinned (the process may use one CPU)".to_string(),
            |l| format!("{measured} on CPU {}, {rest} on CPU {}", l.measured, l.rest),
        )
    }
}

/// The calling thread held on one CPU until dropped, when its former set is given back.
pub struct Pinned(Option<CpuSet>);

impl Pinned {
    /// Pins the calling thread to `cpu` (nothing when `cpu` is None or the kernel refuses).
    pub fn to(cpu: Option<usize>) -> Pinned {
        let Some(cpu) = cpu else {
            return Pinned(None);
        };
        let former = affinity_of(0).ok();
        let pinned = set_affinity(0, &CpuSet::of([cpu])).is_ok();
        Pinned(former.filter(|_| pinned))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(set) = &self.0 {
            let _ = set_affinity(0, set);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_takes_the_quietest_cpu_and_the_quietest_of_the_rest() {
        let l = Layout::of(&[(0, 40), (1, 5), (2, 20)]).unwrap();
        assert_eq!(
            l,
            Layout {
                measured: 1,
                rest: 2
            }
        );
        assert_eq!(Layout::of(&[(3, 0)]), None);
        assert_eq!(Layout::of(&[]), None);
    }

    #[test]
    fn the_least_busy_cpu_is_picked_and_a_tie_avoids_cpu_0() {
        assert_eq!(pick(&[(0, 50), (1, 10), (2, 30)]), Some(1));
        assert_eq!(pick(&[(0, 0), (3, 0), (1, 5)]), Some(3));
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn the_thread_is_pinned_and_given_back_its_set() {
        let before = affinity_of(0).unwrap();
        let cpu = before.cpus().last().unwrap();
        {
            let _p = Pinned::to(Some(cpu));
            assert_eq!(affinity_of(0).unwrap(), CpuSet::of([cpu]));
        }
        assert_eq!(affinity_of(0).unwrap(), before);
        assert!(busy_ticks(10)
            .iter()
            .all(|(c, _)| before.cpus().any(|x| x == *c)));
    }
}

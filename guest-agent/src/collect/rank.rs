//! Ranking the threads to publish: which of the sampled threads get the page's thread
//! records when they do not all fit.
//!
//! Data flow: the collector hands [`select`] one (interval ns, total ns, tid) triple per
//! candidate thread and the page's capacity; it gets back the indices of the threads to
//! publish, best first. The publisher then only places the chosen threads in their slots.

/// The indices of the threads to publish, best first: most on-CPU time in the last interval,
/// then most on-CPU time, then lowest tid. `cands` holds (interval ns, total ns, tid).
pub fn select(cands: &[(u64, u64, u32)], capacity: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..cands.len()).collect();
    let key = |i: &usize| {
        let (iv, total, tid) = cands[*i];
        (std::cmp::Reverse(iv), std::cmp::Reverse(total), tid)
    };
    if capacity < idx.len() {
        idx.select_nth_unstable_by_key(capacity, key);
        idx.truncate(capacity);
    }
    idx.sort_unstable_by_key(key);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_ranked_by_last_interval_then_total_then_tid() {
        let c = [
            (0, 900, 10), // idle now, busy once
            (50, 10, 11), // busy now
            (0, 900, 3),  // same as the first, lower tid
            (50, 20, 12), // busy now, more in total
            (0, 0, 13),
        ];
        assert_eq!(select(&c, 10), vec![3, 1, 2, 0, 4]);
        assert_eq!(select(&c, 2), vec![3, 1]);
        assert_eq!(select(&c, 0), Vec::<usize>::new());
        assert_eq!(select(&[], 3), Vec::<usize>::new());
    }
}

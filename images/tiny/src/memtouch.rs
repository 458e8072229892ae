//! The `memtouch` workload: writes a pattern over a RAM range the VMM chose (above 4 GiB when
//! the VM has RAM there), reads it back, and counts the words that differ.
//!
//! Data flow: params = [bytes, base] from the boot-info record; the range is identity-mapped
//! by the VMM's page tables. Each 8-byte word at address `a` gets `a ^ SEED`, so a word written
//! to the wrong place, or not at all, reads back wrong. The result goes to the report keys
//! `touched_bytes`, `touch_errors` and `touch_base`.

/// Mixed into each word so that zeroed memory reads back wrong.
const SEED: u64 = 0x5afe_c0de_0ddb_a11d;

/// What one pass found.
pub struct Touched {
    /// Bytes written and read back.
    pub bytes: u64,
    /// Words that did not read back as written.
    pub errors: u64,
}

/// Writes then checks `[base, base + bytes)` (whole 8-byte words; the tail is left alone).
/// Returns None when the range is not 8-byte aligned or wraps.
///
/// # Safety
///
/// `[base, base + bytes)` must be RAM of this VM, identity mapped and used by nothing else
/// (no image, stack, table or record lies there) for the whole call.
pub unsafe fn run(base: u64, bytes: u64) -> Option<Touched> {
    if !base.is_multiple_of(8) || base.checked_add(bytes).is_none() {
        return None;
    }
    let words = bytes / 8;
    let p = base as *mut u64;
    for i in 0..words {
        let a = base + i * 8;
        // SAFETY: the caller's contract: this range is RAM of this VM, identity-mapped and used
        // by nothing else (no image, stack, table or record lies there); `a` is 8-byte aligned
        // and inside it. Volatile so the stores really reach memory.
        unsafe { core::ptr::write_volatile(p.add(i as usize), a ^ SEED) };
    }
    let mut errors = 0;
    for i in 0..words {
        let a = base + i * 8;
        // SAFETY: as above, for reads of the words written.
        if unsafe { core::ptr::read_volatile(p.add(i as usize)) } != a ^ SEED {
            errors += 1;
        }
    }
    Some(Touched {
        bytes: words * 8,
        errors,
    })
}

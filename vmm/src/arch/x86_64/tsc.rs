//! The host's time-stamp counter, as the vCPU thread's stamp clock ([`crate::stamp_clock`])
//! reads it: in order with the loads before it, as the kernel's own `rdtsc_ordered` does, and
//! only where it ticks at one rate in every power state (the invariant TSC). And its companion
//! register TSC_AUX, read with `rdpid`, in which Linux keeps the number of the CPU it belongs
//! to: what the vCPU thread reads at each entry to know the host CPU
//! ([`crate::accounting::host::CpuReader`]).

/// The counter, read after every load before it has completed (`lfence; rdtsc`).
#[inline]
pub fn read_ordered() -> u64 {
    // SAFETY: `lfence` and `rdtsc` read no memory the program owns; both exist on every
    // x86_64 CPU, and user-space `rdtsc` is allowed unless CR4.TSD is set, which Linux leaves
    // clear for a process that has not asked for it (PR_SET_TSC).
    unsafe {
        core::arch::x86_64::_mm_lfence();
        core::arch::x86_64::_rdtsc()
    }
}

/// Whether the CPU has the `rdpid` instruction (CPUID leaf 7, ECX bit 22).
pub fn has_rdpid() -> bool {
    // SAFETY: as in `invariant`: `cpuid` exists on every x86_64 CPU and only reads
    // registers; for a leaf beyond the highest basic one (leaf 0's EAX) it returns other
    // data, which is ignored below.
    #[allow(unused_unsafe)]
    let (max, ecx) = unsafe {
        (
            core::arch::x86_64::__cpuid(0).eax,
            core::arch::x86_64::__cpuid_count(7, 0).ecx,
        )
    };
    max >= 7 && ecx & (1 << 22) != 0
}

/// TSC_AUX, read with `rdpid`: one instruction, no memory (Linux keeps the CPU's number in
/// its low 12 bits and its NUMA node above them).
///
/// # Safety
///
/// The CPU must have `rdpid` ([`has_rdpid`]); elsewhere it is an invalid opcode.
#[inline]
pub unsafe fn rdpid() -> u64 {
    let aux: u64;
    // SAFETY: the caller guarantees the instruction exists; it writes one register and
    // touches neither memory, the stack nor the flags.
    unsafe {
        core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags));
    }
    aux
}

/// Whether the CPU says its TSC is invariant: it ticks at one constant rate in every P-, C-
/// and T-state (CPUID 0x8000_0007, EDX bit 8).
pub fn invariant() -> bool {
    // SAFETY: `cpuid` exists on every x86_64 CPU and only reads registers; for a leaf the CPU
    // does not implement it returns other data, which is ignored below (leaf 0x8000_0000 gives
    // the highest extended leaf). Unsafe only on toolchains older than the one that made it
    // safe, which the workspace's rust-version allows.
    #[allow(unused_unsafe)]
    let (max, edx) = unsafe {
        (
            core::arch::x86_64::__cpuid(0x8000_0000).eax,
            core::arch::x86_64::__cpuid(0x8000_0007).edx,
        )
    };
    max >= 0x8000_0007 && edx & (1 << 8) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_moves_forward_on_this_thread() {
        let a = read_ordered();
        let b = read_ordered();
        assert!(b >= a, "{a} then {b}");
    }
}

//! The userspace exit reasons a vCPU's meter counts exits by (spec section 4's `exits` keys).
//!
//! The exit handler (`exit::handle_exit`) classifies each exit into an [`ExitReason`]; the
//! meter counts it and the readers name it. It lives in the accounting, which keys its counts
//! by it, so the accounting needs nothing of the exit handler (which itself reaches the
//! devices, which report into the accounting).

indexed_enum! {
    /// Userspace exit reasons, the keys of the per-vCPU `exits` counts (spec section 4).
    pub enum ExitReason {
        /// Port read.
        IoIn = "io_in",
        /// Port write.
        IoOut = "io_out",
        /// MMIO read.
        MmioRead = "mmio_read",
        /// MMIO write.
        MmioWrite = "mmio_write",
        /// HLT with no in-kernel irqchip.
        Hlt = "hlt",
        /// Triple fault or other shutdown.
        Shutdown = "shutdown",
        /// KVM_RUN interrupted by a signal or `immediate_exit` (a kick).
        Intr = "intr",
        /// The hardware refused VM entry.
        FailEntry = "fail_entry",
        /// KVM could not handle something (emulation failure, ...).
        InternalError = "internal_error",
        /// A system event (reset, shutdown, crash request).
        SystemEvent = "system_event",
        /// Anything else.
        Other = "other",
    }
}

//! Cost of recording one exit on the vCPU thread (entry + exit bookkeeping), per level.
//!
//! `record_basic` is the bookkeeping alone with the timestamps given (what the 50 ns
//! budget covers); `record_basic_with_clocks` adds the two vDSO clock reads and the CPU-number
//! read the vCPU loop makes; `record_full_with_clocks` adds the two thread-CPU-clock reads
//! level full makes where perf is unavailable; `record_full_with_records` is level full as the
//! vCPU loop runs it with context-switch records: the records' level check before the entry,
//! the vDSO reads, and one load of the ring's head at each boundary (records are drained only
//! when the kernel added some). The budget: within 20 ns of `record_basic_with_clocks`.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use ppa_vmm::accounting::host::{current_cpu, thread_cpu_ns};
use ppa_vmm::accounting::meter::{Recorder, Stamp, VcpuMeter};
use ppa_vmm::accounting::{AccountingControl, Level};
use ppa_vmm::exit::ExitReason;
use ppa_vmm::sync::now_ns;

fn recorder(level: Level) -> Recorder {
    let control = Arc::new(AccountingControl::default());
    control.set_level(level);
    let meter = Arc::new(VcpuMeter::new(3, 2));
    Recorder::new(
        meter,
        control,
        Stamp {
            now: 1,
            cpu: Some(1),
        },
    )
}

fn bench(c: &mut Criterion) {
    let mut r = recorder(Level::Basic);
    let mut t = 1_000u64;
    c.bench_function("record_basic", |b| {
        b.iter(|| {
            t += 700;
            r.on_entry(Stamp { now: t, cpu: None }, 0, Level::Basic);
            t += 18_000 + (t & 0xfff);
            r.on_exit(
                black_box(Stamp { now: t, cpu: None }),
                ExitReason::MmioWrite,
            );
        })
    });
    let mut r = recorder(Level::Basic);
    c.bench_function("record_basic_with_clocks", |b| {
        b.iter(|| {
            let cpu = current_cpu() as usize;
            r.on_entry(
                Stamp {
                    now: now_ns(),
                    cpu: None,
                },
                cpu,
                Level::Basic,
            );
            r.on_exit(
                Stamp {
                    now: now_ns(),
                    cpu: None,
                },
                ExitReason::MmioWrite,
            );
        })
    });
    let mut r = recorder(Level::Full);
    r.use_records();
    assert!(
        r.has_records(),
        "no perf context-switch records on this host: record_full_with_records needs them"
    );
    r.begin(Stamp {
        now: now_ns(),
        cpu: None,
    });
    c.bench_function("record_full_with_records", |b| {
        b.iter(|| {
            let cpu = current_cpu() as usize;
            r.prepare(Level::Full);
            r.on_entry(
                Stamp {
                    now: now_ns(),
                    cpu: None,
                },
                cpu,
                Level::Full,
            );
            r.on_exit(
                Stamp {
                    now: now_ns(),
                    cpu: None,
                },
                ExitReason::MmioWrite,
            );
        })
    });
    let mut r = recorder(Level::Full);
    c.bench_function("record_full_with_clocks", |b| {
        b.iter(|| {
            let cpu = current_cpu() as usize;
            r.on_entry(
                Stamp {
                    now: now_ns(),
                    cpu: Some(thread_cpu_ns()),
                },
                cpu,
                Level::Full,
            );
            r.on_exit(
                Stamp {
                    now: now_ns(),
                    cpu: Some(thread_cpu_ns()),
                },
                ExitReason::MmioWrite,
            );
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The /proc parsers on lines as Linux writes them, including the awkward ones.

use super::*;

fn name(c: &[u8; COMM_LEN]) -> &str {
    let n = c.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    std::str::from_utf8(&c[..n]).unwrap()
}

/// A stat line for thread 4242 named `comm`, in Linux's field order.
fn stat_line(comm: &str) -> String {
    format!(
        "4242 ({comm}) S 1 4242 4242 0 -1 4194304 99 0 0 0 1234 56 7 8 20 0 3 0 323977 \
         3133440 405 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 42 0 0 1 1 1 1 1 1 1 0\n"
    )
}

#[test]
fn a_task_stat_line_gives_its_fields() {
    let s = task_stat(stat_line("nginx").as_bytes()).unwrap();
    assert_eq!(name(&s.comm), "nginx");
    assert_eq!(s.state, b'S');
    assert_eq!(s.flags, 4_194_304);
    assert_eq!((s.utime, s.stime, s.cutime, s.cstime), (1234, 56, 7, 8));
    assert_eq!(s.processor, 1);
    assert_eq!(s.blkio_ticks, 42);
}

#[test]
fn names_with_spaces_and_parentheses_are_taken_whole() {
    // A thread can name itself anything up to 15 bytes, ") S 1 (" included.
    for comm in ["a b", "x) S 9 (y", "((", "))", ")", "(", ""] {
        let s = task_stat(stat_line(comm).as_bytes()).unwrap_or_else(|| panic!("{comm:?}"));
        assert_eq!(name(&s.comm), comm);
        assert_eq!(s.state, b'S', "{comm:?}");
        assert_eq!(s.utime, 1234, "{comm:?}");
        assert_eq!(s.processor, 1, "{comm:?}");
    }
}

#[test]
fn a_kernel_worker_line_as_linux_6_writes_it() {
    let line = b"10 (kworker/0:0H-kblockd) I 2 0 0 0 -1 69238880 0 0 0 0 0 29 0 0 0 -20 1 0 22 \
        0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
    let s = task_stat(line).unwrap();
    // Longer than a record's 16 bytes: cut, without a NUL.
    assert_eq!(name(&s.comm), "kworker/0:0H-kbl");
    assert_eq!(s.state, b'I');
    assert_ne!(s.flags & PF_KTHREAD, 0);
    assert_eq!((s.utime, s.stime, s.processor), (0, 29, 0));
}

#[test]
fn truncated_or_garbled_stat_text_is_refused() {
    assert_eq!(task_stat(b""), None);
    assert_eq!(task_stat(b"12 (x"), None, "no closing parenthesis");
    assert_eq!(task_stat(b"12 (x) S 1 2 3"), None, "too few fields");
    assert_eq!(task_stat(b"12 )x( S"), None);
    assert_eq!(
        task_stat(stat_line("x").replace("1234", "12z4").as_bytes()),
        None
    );
}

#[test]
fn names_are_made_safe_for_the_page() {
    assert_eq!(name(&comm(b"bell\x07")), "bell?");
    assert_eq!(name(&comm(b"ok\xff\xfe")), "ok??");
    // 16 ASCII bytes fill the record without a NUL; a 17th is cut.
    assert_eq!(&comm(b"0123456789abcdefX"), b"0123456789abcdef");
    // A multi-byte character that would not fit whole is left out.
    let c = comm("0123456789abcdé".as_bytes());
    assert_eq!(name(&c), "0123456789abcdé");
    let c = comm("0123456789abcdeé".as_bytes());
    assert_eq!(name(&c), "0123456789abcde");
}

#[test]
fn schedstat_and_status_lines() {
    assert_eq!(
        schedstat(b"300512345 1200 7\n"),
        Some(SchedStat {
            on_cpu_ns: 300_512_345,
            run_delay_ns: 1200,
            timeslices: 7
        })
    );
    assert_eq!(schedstat(b"1 2\n"), None);
    assert_eq!(schedstat(b"1 x 3\n"), None);
    let status = b"Name:\tcat\nState:\tR (running)\nvoluntary_ctxt_switches:\t17\n\
        nonvoluntary_ctxt_switches:\t3\n";
    assert_eq!(switches(status), Some((17, 3)));
    assert_eq!(switches(b"Name:\tcat\n"), None);
}

#[test]
fn proc_stat_gives_each_cpu_and_the_fork_count() {
    let text = b"cpu  131451 306652 28668 115307 745 0 165 202 22821 56669\n\
        cpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 10 20 30 40 50 60 70 80 0 0\n\
        intr 123 4 5 6\nctxt 3081232\nbtime 1\nprocesses 65523\nprocs_running 2\n";
    let s = system_stat(text).unwrap();
    assert_eq!(s.cpus.len(), 2, "the aggregate line is not a CPU");
    assert_eq!(s.cpus[1].cpu, 1);
    assert_eq!(s.cpus[0].ticks, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!((s.processes, s.ctxt), (65523, 3_081_232));
    // An old kernel's 4 columns.
    let s = system_stat(b"cpu3 1 2 3 4\nprocesses 1\n").unwrap();
    assert_eq!(
        (s.cpus[0].cpu, s.cpus[0].ticks),
        (3, [1, 2, 3, 4, 0, 0, 0, 0])
    );
    assert_eq!(system_stat(b"processes 1\n"), None);
}

#[test]
fn softirqs_by_cpu_and_kind() {
    let text = b"                    CPU0       CPU1       \n\
                  HI:          0          1\n\
               TIMER:      66902      85690\n\
              NET_TX:          4          0\n\
              NET_RX:       2283       3151\n\
               BLOCK:          0     105880\n\
            IRQ_POLL:          0          0\n\
             TASKLET:         58         10\n\
               SCHED:      70254      69899\n\
             HRTIMER:          0          0\n\
                 RCU:     193602     197011\n";
    let s = softirqs(text).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0], (0, [0, 66902, 4, 2283, 0, 0, 58, 70254, 0, 193_602]));
    assert_eq!(s[1].1[0], 1);
    assert_eq!(s[1].1[4], 105_880);
}

#[test]
fn interrupts_sum_each_cpus_column() {
    let text = b"           CPU0       CPU2       \n\
   0:         10          0   IO-APIC    2-edge      timer\n\
  24:          1          5  IO-APIC   5-edge      ACPI:Ged\n\
 NMI:          2          3   Non-maskable interrupts\n\
 LOC:     100000     200000   Local timer interrupts\n\
 ERR:          7\n\
 MIS:          0\n";
    assert_eq!(
        interrupts(text),
        Some(vec![(0, 100_013), (2, 200_008)]),
        "ERR and MIS are system-wide and left out; CPU numbers come from the header"
    );
}

#[test]
fn proc_schedstat_timeslices_per_cpu() {
    let text = b"version 15\ntimestamp 4295\n\
        cpu0 0 0 11 12 13 14 15 16 17\ndomain0 3 1 2 3\n\
        cpu1 0 0 21 22 23 24 25 26 27\n";
    assert_eq!(cpu_timeslices(text), Some(vec![(0, 17), (1, 27)]));
    assert_eq!(
        cpu_timeslices(b"version 12\ncpu0 1 2 3\n"),
        None,
        "unknown version"
    );
    assert_eq!(
        cpu_timeslices(b"version 15\ncpu0 1 2\n"),
        None,
        "short line"
    );
}

#[test]
fn a_task_in_do_exit_or_a_zombie_is_ending_and_a_live_one_is_not() {
    let live = task_stat(stat_line("w").as_bytes()).unwrap();
    assert!(!live.ending(), "{live:?}");
    // PF_EXITING (0x4) beside PF_RANDOMIZE (0x400000), state still R: in do_exit.
    let exiting = stat_line("w")
        .replacen(" S 1 ", " R 1 ", 1)
        .replacen("4194304", "4194308", 1);
    let s = task_stat(exiting.as_bytes()).unwrap();
    assert_eq!((s.state, s.flags & PF_EXITING), (b'R', PF_EXITING));
    assert!(s.ending());
    for state in ["Z", "X"] {
        let line = stat_line("w").replacen(" S 1 ", &format!(" {state} 1 "), 1);
        assert!(task_stat(line.as_bytes()).unwrap().ending(), "{state}");
    }
}

//! The control socket's commands as `ppa-vmm ctl` presents them: one table of name, arguments
//! and a one-line description.
//!
//! Data flow: [`COMMANDS`] is the one list `ctl` shows. [`help`] renders it for clap (the
//! `ctl --help` text after the options), and [`crate::ctl::parse_command`] names its commands
//! when it refuses an unknown one. The tests tie the table to `ppa_vmm_api::Command` through a
//! match that must name every variant, and to the server's `ppa_vmm_api::COMMANDS`, so a new
//! command cannot be added to the protocol without a line here.

use std::fmt::Write as _;

/// One command of the control socket, for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandHelp {
    /// The name given to `ctl` and sent as `cmd`.
    pub name: &'static str,
    /// Its arguments as `KEY=VALUE`, optional ones in brackets; empty when it takes none.
    pub args: &'static str,
    /// What it does or returns, one line.
    pub about: &'static str,
}

/// Shorthand for a table row.
const fn row(name: &'static str, args: &'static str, about: &'static str) -> CommandHelp {
    CommandHelp { name, args, about }
}

/// Every command, in the order of the protocol's documentation (docs/control.md).
pub const COMMANDS: [CommandHelp; 21] = [
    row(
        "version",
        "",
        "the VMM's, the protocol's and the guest ABI's versions",
    ),
    row("stats", "", "the VM's figures and every vCPU's overview"),
    row("vcpu", "vcpu=N", "one vCPU's full record"),
    row(
        "histogram",
        "name=NAME [vcpu=N] [format=json|text]",
        "one histogram: exit_handling[.REASON], guest_run or wakeup_latency",
    ),
    row(
        "reset",
        "[vcpu=N]",
        "restarts the figures of one vCPU, or of all, from zero",
    ),
    row(
        "set-level",
        "level=off|basic|full",
        "switches the accounting level",
    ),
    row(
        "set-thresholds",
        "[exit_handling_ns=NS] [guest_run_ns=NS] [wakeup_latency_ns=NS] [steal_window_ns=NS]",
        "changes the thresholds given (0: off); the others stay",
    ),
    row(
        "threads",
        "",
        "each vCPU's, device and service thread's host thread id, CPU set and last CPU",
    ),
    row(
        "set-limit",
        "group=NAME limit=N%|QUOTA/PERIOD|none",
        "sets, changes or removes a CPU limit (group vm: the VM's)",
    ),
    row(
        "set-pin",
        "key=KEY cpus=CPUS",
        "moves the threads KEY names (vcpus, vcpuN, a device, DEV-qpN, service) to CPUS at once",
    ),
    row(
        "set-rate",
        "device=ID rate=BUCKETS|none",
        "replaces a network device's or a disk's rate limiters (rate= of --net/--disk), full",
    ),
    row("groups", "", "every CPU limit and what it did"),
    row(
        "guest",
        "",
        "what the guest published on the PPA page, decoded and checked",
    ),
    row(
        "guest-reset",
        "",
        "asks the guest agent to restart its figures from 0 (it answers at its next sample)",
    ),
    row("pause", "", "parks every vCPU until `resume`"),
    row("resume", "", "releases a pause"),
    row(
        "shutdown",
        "",
        "stops every vCPU; the final report is still written",
    ),
    row("metrics", "", "the Prometheus text of GET /metrics"),
    row(
        "subscribe",
        "[events=KIND,...] [pressure=TRIGGER]",
        "streams events of these kinds (all when none is given); TRIGGER is \
         {\"kind\":\"some\"|\"full\",\"threshold_us\":T,\"window_us\":W}",
    ),
    row(
        "device",
        "name=ID",
        "one device's threads, queues, CPU and drops (e.g. name=net0)",
    ),
    row(
        "pressure",
        "",
        "CPU pressure of the VM and each vCPU group (PSI's some/full, avg10/60/300)",
    ),
];

/// Argument keys whose values are always text (a limit, a group or histogram name): `ctl`
/// sends `limit=150` as the string `"150"`, never as a number.
pub const TEXT_ARGS: [&str; 7] = ["group", "limit", "name", "key", "cpus", "device", "rate"];

/// Width of the usage column of [`help`]; a longer usage puts its description on the next line.
const USAGE_WIDTH: usize = 30;

/// The table as `ctl --help` shows it after the options: one line per command, its usage
/// (name and arguments) then its description.
pub fn help() -> String {
    let mut s = String::from("Commands (ARGS as KEY=VALUE; those in [brackets] are optional):\n");
    for c in &COMMANDS {
        let usage = if c.args.is_empty() {
            c.name.to_string()
        } else {
            format!("{} {}", c.name, c.args)
        };
        if usage.len() < USAGE_WIDTH {
            let _ = writeln!(s, "  {usage:<USAGE_WIDTH$}{}", c.about);
        } else {
            let _ = writeln!(s, "  {usage}\n  {:USAGE_WIDTH$}{}", "", c.about);
        }
    }
    s
}

/// The command names, comma-separated, for error messages.
pub fn names() -> String {
    COMMANDS.map(|c| c.name).join(", ")
}

/// Looks up a command by name.
pub fn find(name: &str) -> Option<&'static CommandHelp> {
    COMMANDS.iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::parse_command;
    use ppa_vmm_api::Command;

    /// The name of a command. The match names every variant: a command added to
    /// `ppa_vmm_api::Command` does not compile here until it is given its name, and the tests
    /// below then fail until it has its row in [`COMMANDS`].
    fn name_of(command: &Command) -> &'static str {
        match command {
            Command::Version {} => "version",
            Command::Stats {} => "stats",
            Command::Vcpu { .. } => "vcpu",
            Command::Histogram { .. } => "histogram",
            Command::Reset { .. } => "reset",
            Command::SetLevel { .. } => "set-level",
            Command::SetThresholds { .. } => "set-thresholds",
            Command::Threads {} => "threads",
            Command::SetLimit { .. } => "set-limit",
            Command::SetPin { .. } => "set-pin",
            Command::SetRate { .. } => "set-rate",
            Command::Groups {} => "groups",
            Command::Guest {} => "guest",
            Command::GuestReset {} => "guest-reset",
            Command::Pause {} => "pause",
            Command::Resume {} => "resume",
            Command::Shutdown {} => "shutdown",
            Command::Metrics {} => "metrics",
            Command::Subscribe { .. } => "subscribe",
            Command::Device { .. } => "device",
            Command::Pressure {} => "pressure",
        }
    }

    /// Arguments that make a valid request of each command: its required keys, with a
    /// plausible value.
    fn valid_args(name: &str) -> Vec<String> {
        let a: &[&str] = match name {
            "vcpu" => &["vcpu=0"],
            "histogram" => &["name=guest_run"],
            "set-level" => &["level=full"],
            "set-limit" => &["group=vm", "limit=50%"],
            "set-pin" => &["key=vcpus", "cpus=0"],
            "set-rate" => &["device=net0", "rate=tx-packets:1000/1s"],
            "device" => &["name=net0"],
            _ => &[],
        };
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The keys a row names (`KEY=...`), and whether each is required (not in brackets).
    fn keys(c: &CommandHelp) -> Vec<(&'static str, bool)> {
        c.args
            .split_whitespace()
            .map(|a| {
                let optional = a.starts_with('[');
                let key = a.trim_start_matches('[').split('=').next().unwrap_or("");
                (key, !optional)
            })
            .collect()
    }

    #[test]
    fn every_command_of_the_protocol_has_one_row() {
        // Every name the server accepts parses to the variant whose row has that name.
        for name in ppa_vmm_api::COMMANDS {
            let command = parse_command(name, &valid_args(name))
                .unwrap_or_else(|e| panic!("`{name}` with its arguments: {e}"));
            assert_eq!(name_of(&command), name, "the match names `{name}` wrongly");
            assert!(find(name).is_some(), "`{name}` has no row in COMMANDS");
        }
        // And the table holds nothing else, once each, in the server's order.
        let table: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
        assert_eq!(
            table,
            ppa_vmm_api::COMMANDS,
            "COMMANDS and the server's list"
        );
    }

    #[test]
    fn the_arguments_shown_are_those_the_server_takes() {
        for c in &COMMANDS {
            let keys = keys(c);
            // Without arguments a command is valid exactly when it has no required key.
            let bare = parse_command(c.name, &[]);
            let required = keys.iter().any(|(_, r)| *r);
            assert_eq!(bare.is_err(), required, "`{}` without arguments", c.name);
            // Every key shown is a field of the command: a value of the wrong type for it is
            // refused for its type, never as an unknown field.
            for (key, _) in keys {
                let mut args = valid_args(c.name);
                args.retain(|a| !a.starts_with(&format!("{key}=")));
                args.push(format!("{key}={{}}"));
                let e = parse_command(c.name, &args).expect_err("an object is no argument value");
                assert!(
                    !e.to_string().contains("unknown field"),
                    "`{}` shows `{key}`, which the server does not take: {e}",
                    c.name
                );
            }
        }
    }

    #[test]
    fn help_has_a_line_per_command_with_its_description() {
        let text = help();
        for c in &COMMANDS {
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with(&format!("{} ", c.name)))
                .or_else(|| text.lines().position(|l| l.trim() == c.name))
                .unwrap_or_else(|| panic!("no line for `{}`: {text}", c.name));
            let lines: Vec<&str> = text.lines().collect();
            let described = lines[line].ends_with(c.about)
                || lines.get(line + 1).is_some_and(|l| l.trim() == c.about);
            assert!(described, "`{}` without its description: {text}", c.name);
        }
        assert_eq!(names().split(", ").count(), COMMANDS.len());
    }
}

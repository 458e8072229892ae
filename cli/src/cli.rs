//! The command line of `ppa-vmm` (clap) and what is generated from it and from the serde
//! types: the usage synopsis of README.md, shell completions, the man page and the JSON
//! Schemas of the socket protocol and the config file, shipped under `dist/` so that none
//! of them can drift from the code (a test regenerates them and compares).
//!
//! Data flow: the binary parses [`Cli`]; `ppa-vmm completions|man|schema` print what
//! [`completions`], [`man_page`] and [`schemas`] make; [`dist_files`] is every file of
//! `dist/` with its contents, and [`usage_synopsis`] the README's usage block.

use std::io;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};
use ppa_vmm_client::ctl::CtlOptions;
use ppa_vmm_client::host::HostOptions;
use ppa_vmm_client::top::TopOptions;

use ppa_vmm::config::RunOptions;

/// `ppa-vmm`: its subcommands.
#[derive(Parser)]
#[command(
    name = "ppa-vmm",
    version,
    about = "A KVM VMM for precise CPU accounting of VMs"
)]
pub struct Cli {
    #[command(subcommand)]
    /// What to do.
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Boot a VM and run it until every vCPU has exited.
    Run(Box<RunOptions>),
    /// Run the embedded demo: 4 vCPUs of the tiny guest with the mixed workload.
    Demo,
    /// Serve Firecracker's API (and take its flags): a VM started by Firecracker's tools,
    /// with our accounting (docs/firecracker.md). Also what this binary does when called
    /// `firecracker`.
    Firecracker(Box<crate::firecracker::FirecrackerArgs>),
    /// Measure the VMM itself.
    Bench(BenchArgs),
    /// Send one request to a running VMM's control socket and print the result.
    Ctl(CtlOptions),
    /// A live per-vCPU table of a running VMM, like esxtop.
    Top(TopOptions),
    /// Every VM of the run directory: list, top, one metrics endpoint.
    Host(HostOptions),
    /// Print a shell completion script (install it where the shell looks; dist/ has them).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff; dist/man/ppa-vmm.1).
    Man,
    /// Print the JSON Schema of a socket message, the final report or the config file.
    Schema {
        /// Which one.
        #[arg(value_enum)]
        which: SchemaKind,
    },
}

/// Options of `ppa-vmm bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub which: BenchKind,
    /// Print one JSON object whose last key is "verdict".
    #[arg(long)]
    pub json: bool,
    /// Exits per run (its help, with each bench's default, is [`exits_help`]).
    #[arg(long)]
    pub exits: Option<u64>,
    /// Length of each run's measured window, ms (socket).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub window_ms: u64,
    /// Rounds of alternated runs (its help, with each bench's default, is [`rounds_help`]).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// vCPUs of the VM (socket).
    #[arg(long, default_value_t = 64)]
    pub vcpus: usize,
    /// `stats` requests per second in the loaded runs (socket).
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Nice value of the client thread (socket; below 0 needs CAP_SYS_NICE).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub client_nice: i32,
    /// Periods per run (limit).
    #[arg(long, default_value_t = 50)]
    pub periods: u64,
    /// Run beside one spinning process per CPU (limit).
    #[arg(long)]
    pub hogs: bool,
    /// Frames per transmit run (net).
    #[arg(long, default_value_t = 200_000)]
    pub packets: u64,
    /// Echo round trips (net).
    #[arg(long, default_value_t = 2000)]
    pub echoes: u64,
    /// 4 KiB blocks written and read per run (disk).
    #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(u64).range(1..=1 << 22))]
    pub blocks: u64,
    /// The disk's `poll_us=`: how long its request thread polls an emptied ring (disk; 0: it
    /// does not).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub poll_us: u32,
}

/// What `ppa-vmm bench` measures.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum BenchKind {
    /// Exit throughput: raw KVM_RUN loop vs accounting off, basic, full.
    Overhead,
    /// Control socket: stats latency with 64 vCPUs, and guest throughput under 1000 stats/s.
    Socket,
    /// CPU limits: per-period error of the VMM's enforcement and of cgroups, 25 % of a busy
    /// vCPU, in interleaved rounds with the host's steal and the kicks' lateness.
    Limit,
    /// virtio-net: the tiny guest's frames through the device into a tap against a host loop
    /// writing the same frames, echo round trips, and an idle device's cost to exits.
    Net,
    /// virtio-blk: the tiny guest's 4 KiB writes and reads through the device against a host
    /// loop doing the same pwrite and pread on the same file.
    Disk,
    /// Start time: exec of `ppa-vmm run` until its control socket answers, with a cold and
    /// a warm calibration cache.
    Start,
    /// CPU limits' stops: what stopping a busy vCPU costs, and the guest's own share of
    /// quotas of 100 µs to 1 ms per vCPU and 10 ms period, by its rdtsc and guest_ns.
    Stops,
}

impl BenchKind {
    /// Every bench, in the order the command line lists them.
    pub const ALL: [BenchKind; 7] = [
        BenchKind::Overhead,
        BenchKind::Socket,
        BenchKind::Limit,
        BenchKind::Net,
        BenchKind::Disk,
        BenchKind::Start,
        BenchKind::Stops,
    ];

    /// Its name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            BenchKind::Overhead => "overhead",
            BenchKind::Socket => "socket",
            BenchKind::Limit => "limit",
            BenchKind::Net => "net",
            BenchKind::Disk => "disk",
            BenchKind::Start => "start",
            BenchKind::Stops => "stops",
        }
    }

    /// Rounds when `--rounds` is not given.
    pub const fn default_rounds(self) -> usize {
        match self {
            BenchKind::Overhead => crate::bench::OVERHEAD_ROUNDS,
            BenchKind::Socket | BenchKind::Limit | BenchKind::Net | BenchKind::Disk => 5,
            BenchKind::Start => 10,
            BenchKind::Stops => 3,
        }
    }

    /// Exits per run when `--exits` is not given; `None` where the bench takes no `--exits`
    /// (`socket` refuses it, `limit` and `start` have no use for it).
    pub const fn default_exits(self) -> Option<u64> {
        match self {
            BenchKind::Overhead => Some(crate::bench::OVERHEAD_EXITS),
            BenchKind::Net => Some(20_000),
            _ => None,
        }
    }
}

/// A number with thousands separated by commas (`20,000`).
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `--rounds`'s help: each bench's default, from [`BenchKind::default_rounds`].
pub fn rounds_help() -> String {
    let d: Vec<String> = BenchKind::ALL
        .iter()
        .map(|k| format!("{} {}", k.name(), k.default_rounds()))
        .collect();
    format!("Rounds of alternated runs (default: {})", d.join(", "))
}

/// `--exits`'s help: each bench's default, from [`BenchKind::default_exits`].
pub fn exits_help() -> String {
    let d: Vec<String> = BenchKind::ALL
        .iter()
        .filter_map(|k| Some(format!("{} {}", k.name(), grouped(k.default_exits()?))))
        .collect();
    format!(
        "Exits per run (default: {}; socket refuses it, the others ignore it)",
        d.join(", ")
    )
}

/// The sentence README.md and docs/operations.md give of `--rounds` and `--exits`, made from
/// the same defaults (their `bench-defaults` blocks; `PPA_REGENERATE=1` rewrites them).
pub fn bench_defaults_text() -> String {
    let rounds: Vec<String> = BenchKind::ALL
        .iter()
        .map(|k| format!("`{}` {}", k.name(), k.default_rounds()))
        .collect();
    let exits: Vec<String> = BenchKind::ALL
        .iter()
        .filter_map(|k| Some(format!("`{}` {}", k.name(), grouped(k.default_exits()?))))
        .collect();
    format!(
        "`--rounds R` alternated runs (default {}); `--exits N` exits per run (default {}; \
         `socket` refuses it).\n",
        rounds.join(", "),
        exits.join(", ")
    )
}

/// The command line as clap has it, with the help texts made from code (the benches'
/// defaults): what the binary parses with and what every generated file is made from.
pub fn cli_command() -> clap::Command {
    Cli::command().mut_subcommand("bench", |b| {
        b.mut_arg("rounds", |a| a.help(rounds_help()))
            .mut_arg("exits", |a| a.help(exits_help()))
    })
}

/// The JSON Schemas `ppa-vmm schema` prints and `dist/schemas/` ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaKind {
    /// A request line of the control socket (`id` and a command with its arguments).
    Request,
    /// A response line (`result` is the command's result: see the result schemas).
    Response,
    /// An event line (after `subscribe`).
    Event,
    /// The result of `version`.
    Version,
    /// The result of `stats`.
    Stats,
    /// The result of `vcpu`.
    Vcpu,
    /// The result of `threads`.
    Threads,
    /// The result of `groups` and `set-limit`.
    Groups,
    /// The result of `guest`.
    Guest,
    /// The final report (`--report json`).
    Report,
    /// The config file (`--config FILE.json`).
    Config,
}

/// A request line as a schema sees it: the id and the command, whose `cmd` names it.
#[derive(schemars::JsonSchema)]
#[allow(dead_code, reason = "only its schema is used")]
struct RequestLine {
    /// Any JSON value; the response echoes it.
    #[serde(default)]
    id: Option<ppa_vmm_api::RequestId>,
    #[serde(flatten)]
    command: ppa_vmm_api::Command,
}

impl SchemaKind {
    /// The schema's file name under `dist/schemas/`.
    pub fn file_name(self) -> String {
        use clap::ValueEnum;
        let name = self
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string());
        format!("{name}.schema.json")
    }

    /// The schema, as pretty JSON with a final newline.
    pub fn schema(self) -> String {
        use ppa_vmm_api as api;
        use schemars::schema_for;
        let s = match self {
            SchemaKind::Request => {
                let mut s = schema_for!(RequestLine);
                // Each command refuses unknown members; with `id` beside the flattened
                // command, only unevaluatedProperties can say so (draft 2020-12).
                s.insert("unevaluatedProperties".into(), false.into());
                s
            }
            SchemaKind::Response => schema_for!(api::Response),
            SchemaKind::Event => schema_for!(api::Event),
            SchemaKind::Version => schema_for!(api::VersionInfo),
            SchemaKind::Stats => schema_for!(api::Stats),
            SchemaKind::Vcpu => schema_for!(api::VcpuTimes),
            SchemaKind::Threads => schema_for!(api::Threads),
            SchemaKind::Groups => schema_for!(Vec<api::GroupStats>),
            SchemaKind::Guest => schema_for!(api::GuestView),
            SchemaKind::Report => schema_for!(ppa_vmm::report::Report),
            SchemaKind::Config => schema_for!(RunOptions),
        };
        serde_json::to_string_pretty(&s).unwrap_or_default() + "\n"
    }
}

/// Every JSON Schema, with its file name.
pub fn schemas() -> Vec<(String, String)> {
    use clap::ValueEnum;
    SchemaKind::value_variants()
        .iter()
        .map(|k| (k.file_name(), k.schema()))
        .collect()
}

/// The completion script of `shell`.
pub fn completions(shell: clap_complete::Shell) -> String {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cli_command(), "ppa-vmm", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The man pages: `ppa-vmm.1`, then one per subcommand (`ppa-vmm-run.1`, ...).
pub fn man_pages() -> io::Result<Vec<(String, String)>> {
    let cmd = cli_command();
    let mut pages = Vec::new();
    let mut render = |name: String, c: clap::Command| -> io::Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(c).render(&mut out)?;
        pages.push((
            format!("{name}.1"),
            String::from_utf8_lossy(&out).into_owned(),
        ));
        Ok(())
    };
    render("ppa-vmm".into(), cmd.clone())?;
    for sub in cmd.get_subcommands() {
        let name = format!("ppa-vmm-{}", sub.get_name());
        render(name.clone(), sub.clone().display_name(name))?;
    }
    Ok(pages)
}

/// The man page of `ppa-vmm` itself.
pub fn man_page() -> io::Result<String> {
    Ok(man_pages()?.swap_remove(0).1)
}

/// Every file of `dist/`, as a path under it and its contents.
pub fn dist_files() -> io::Result<Vec<(PathBuf, String)>> {
    use clap_complete::Shell;
    let mut files = Vec::new();
    for (shell, name) in [
        (Shell::Bash, "ppa-vmm.bash"),
        (Shell::Zsh, "_ppa-vmm"),
        (Shell::Fish, "ppa-vmm.fish"),
    ] {
        files.push((PathBuf::from("completions").join(name), completions(shell)));
    }
    for (name, text) in man_pages()? {
        files.push((PathBuf::from("man").join(name), text));
    }
    for (name, text) in schemas() {
        files.push((PathBuf::from("schemas").join(name), text));
    }
    Ok(files)
}

/// Width the usage synopsis is wrapped at.
const USAGE_WIDTH: usize = 100;

/// How one option reads in the synopsis: `[--name VALUE]`, `[--flag]`, `[--name VALUE ...]`
/// for a repeatable one, the values of a closed set joined by `|`; a positional argument as
/// its value name (`[NAME]...` when optional and repeatable).
fn usage_item(a: &clap::Arg) -> Option<String> {
    use clap::ArgAction;
    if a.is_hide_set() || matches!(a.get_action(), ArgAction::Help | ArgAction::Version) {
        return None;
    }
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    let value = match a.get_value_names() {
        // A closed set (a value enum) reads as its values.
        _ if !values.is_empty() && a.get_action().takes_values() => values.join("|"),
        Some(names) if !names.is_empty() => names.join(" "),
        _ => a.get_id().as_str().to_uppercase(),
    };
    let many = matches!(a.get_action(), ArgAction::Append);
    let Some(long) = a.get_long() else {
        return Some(
            match (
                a.is_required_set(),
                many || a.get_num_args().is_some_and(|n| n.max_values() > 1),
            ) {
                (true, _) => value,
                (false, true) => format!("[{value}]..."),
                (false, false) => format!("[{value}]"),
            },
        );
    };
    let body = match a.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count => format!("--{long}"),
        _ if many => format!("--{long} {value} ..."),
        _ => format!("--{long} {value}"),
    };
    Some(if a.is_required_set() {
        body
    } else {
        format!("[{body}]")
    })
}

/// The README's usage block: one synopsis per subcommand, wrapped under its name.
pub fn usage_synopsis() -> String {
    let cmd = cli_command();
    let mut out = String::new();
    for sub in cmd.get_subcommands() {
        let head = format!("ppa-vmm {}", sub.get_name());
        let indent = " ".repeat(head.len() + 1);
        let mut line = head.clone();
        for item in sub.get_arguments().filter_map(usage_item) {
            if line.len() + 1 + item.len() > USAGE_WIDTH && line.len() > head.len() {
                out.push_str(&line);
                out.push('\n');
                line = indent.clone() + &item;
            } else {
                line.push(' ');
                line.push_str(&item);
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;

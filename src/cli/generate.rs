//! `generate`: the man page and the shell completions, from the command-line definitions.

use roff::{bold, roman, Roff};

use super::{Cli, Generate};

/// sume-receiver(1): clap_mangen's sections from the command-line definitions, then every
/// command in this one page (clap_mangen would point at a page per subcommand, which nobody
/// ships) and the sections an operator looks for: files, signals, exit status, examples.
fn man_page(command: clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    let mut page = Roff::new();
    page.control("SH", ["COMMANDS"]);
    list_commands(&mut page, "sume-receiver", &command);
    for (heading, paragraphs) in MAN_SECTIONS {
        page.control("SH", [*heading]);
        for paragraph in *paragraphs {
            match paragraph.split_once('\t') {
                Some((term, text)) => {
                    page.control("TP", []);
                    page.text([bold(term)]);
                    page.text([roman(text)]);
                }
                None => {
                    page.control("PP", []);
                    page.text([roman(*paragraph)]);
                }
            }
        }
    }
    page.to_writer(out)?;
    man.render_version_section(out)
}

/// Each command below `parent` as a tagged paragraph (its name, then its summary), its arguments
/// and options indented under it, then its own commands.
fn list_commands(page: &mut Roff, path: &str, parent: &clap::Command) {
    for child in parent.get_subcommands().filter(|c| c.get_name() != "help") {
        let name = format!("{path} {}", child.get_name());
        page.control("TP", []);
        page.text([bold(name.as_str())]);
        if let Some(about) = child.get_long_about().or(child.get_about()) {
            page.text([roman(about.to_string())]);
        }
        let arguments: Vec<&clap::Arg> = child
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .collect();
        if !arguments.is_empty() {
            page.control("RS", []);
            for arg in arguments {
                page.control("TP", []);
                page.text([bold(usage(arg).as_str())]);
                page.text([roman(description(arg).as_str())]);
            }
            page.control("RE", []);
        }
        list_commands(page, &name, child);
    }
}

/// How an argument is written: `<JOB_ID>`, `-- <PROGRAM>...`, `--state <STATE>`, `--json`.
fn usage(arg: &clap::Arg) -> String {
    let value = || {
        let names = arg.get_value_names().map(|names| names.to_vec());
        let name = names
            .and_then(|names| names.first().map(|name| name.to_string()))
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
        let repeated = matches!(arg.get_action(), clap::ArgAction::Append);
        format!("<{name}>{}", if repeated { "..." } else { "" })
    };
    if arg.is_positional() {
        return if arg.is_last_set() {
            format!("-- {}", value())
        } else {
            value()
        };
    }
    let mut usage = match (arg.get_short(), arg.get_long()) {
        (Some(short), Some(long)) => format!("-{short}, --{long}"),
        (Some(short), None) => format!("-{short}"),
        (None, long) => format!("--{}", long.unwrap_or(arg.get_id().as_str())),
    };
    if arg.get_action().takes_values() {
        usage = format!("{usage} {}", value());
    }
    usage
}

/// An argument's help text, then its default and the values it takes, as `--help` has them.
fn description(arg: &clap::Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() {
        text.push_str(&format!(" [default: {}]", defaults.join(", ")));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| value.get_name().to_owned())
        .collect();
    if !possible.is_empty() && arg.get_action().takes_values() {
        text.push_str(&format!(" [possible values: {}]", possible.join(", ")));
    }
    text
}

/// The man page's own sections: a heading, then paragraphs (`term\ttext` for a tagged one).
const MAN_SECTIONS: &[(&str, &[&str])] = &[
    (
        "FILES",
        &[
            "/etc/sume-receiver/config.toml\tThe configuration (the package's template, a conffile). Every key and its default: /usr/share/doc/sume-receiver/config.example.toml.",
            "/etc/sume-receiver/secrets\tThe signing secrets, one a line, newest first; mode 0640 root:sume-receiver.",
            "/var/lib/sume-receiver/ledger.sqlite3\tThe ledger (with its -wal, -shm and .lock files beside it), unless database.url names PostgreSQL.",
            "/usr/lib/systemd/system/sume-receiver.service\tThe systemd unit.",
        ],
    ),
    (
        "SIGNALS",
        &[
            "SIGHUP\tRe-read the signing secrets and the routes (systemctl reload); the other settings change at a restart.",
            "SIGTERM, SIGINT\tStop accepting, finish in-flight requests, let running handlers finish for server.shutdown_grace; an attempt the stop interrupts does not count.",
        ],
    ),
    (
        "EXIT STATUS",
        &[
            "0\tSuccess; serve stopped cleanly.",
            "1\tAn error: a bad configuration, a ledger that cannot be opened, a failed command.",
            "2\tThe command line could not be parsed.",
            "74\tThe disk failed under the ledger (a failed fsync or I/O error): the unit does not restart it; check the disk and reboot first.",
        ],
    ),
    (
        "EXAMPLES",
        &[
            "sume-receiver check-config\tValidate the configuration; errors exit non-zero, warnings do not.",
            "sume-receiver send-test\tSign a test delivery with the newest secret and send it to the running service.",
            "sume-receiver jobs list --state dead\tThe jobs whose attempts ran out.",
            "sume-receiver jobs retry JOB_ID\tRun a done or dead job again from its stored body.",
            "journalctl -u sume-receiver SUME_JOB_ID=JOB_ID\tEverything the service logged about one job.",
        ],
    ),
    (
        "SEE ALSO",
        &["systemctl(1), journalctl(1), sqlite3(1); /usr/share/doc/sume-receiver/README.md and docs/*.md"],
    ),
];

/// Writes what `generate` asks for to stdout.
pub fn generate(what: Generate) -> anyhow::Result<()> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut command = Cli::command();
    let mut out = std::io::stdout().lock();
    match what {
        Generate::Man => man_page(command, &mut out)?,
        Generate::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "sume-receiver", &mut script);
            let mut script = String::from_utf8(script)?;
            if shell == clap_complete::Shell::Bash {
                // clap_complete 4.6 names the cases of a hyphenated binary's subcommands
                // `sume__subcmd__receiver__...` but moves to `sume__receiver__...`: no case
                // matched, so nothing completed below the first word.
                script = script.replace("sume__subcmd__receiver__", "sume__receiver__");
            }
            out.write_all(script.as_bytes())?;
        }
    }
    Ok(())
}

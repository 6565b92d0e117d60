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

/// Each command below `parent` as a tagged paragraph (its name, then its summary), each followed
/// by its own commands.
fn list_commands(page: &mut Roff, path: &str, parent: &clap::Command) {
    for child in parent.get_subcommands().filter(|c| c.get_name() != "help") {
        let name = format!("{path} {}", child.get_name());
        page.control("TP", []);
        page.text([bold(name.as_str())]);
        if let Some(about) = child.get_about() {
            page.text([roman(about.to_string())]);
        }
        list_commands(page, &name, child);
    }
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
            "SIGHUP\tRe-read the signing secrets (systemctl reload); the other settings change at a restart.",
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
        &["systemctl(1), journalctl(1), sqlite3(1); /usr/share/doc/sume-receiver/README.md"],
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

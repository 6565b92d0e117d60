//! The Config page's rows: the settings in effect, without any credential.

use std::sync::Arc;
use std::time::Duration;

use super::Role;
use crate::config::{redact_url, Config, HandlerKind};
use crate::ledger::Ledger;
use crate::tls::{Obtained, Tls};

/// What the config page shows `role`: the settings in effect, without any credential (URLs
/// without user, password or query); a reader sees no handler argument, which may hold one.
pub(super) fn settings(config: &Config, ledger: &Ledger, role: Role) -> Vec<(String, String)> {
    let mut rows = vec![
        ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ("server.listen".into(), config.server.listen.to_string()),
        (
            "server.webhook_path".into(),
            config.server.webhook_path.clone(),
        ),
        (
            "ledger".into(),
            // Absolute: a relative path says nothing without the directory it is relative to.
            std::fs::canonicalize(ledger.location())
                .map_or_else(|_| ledger.location(), |path| path.display().to_string()),
        ),
        (
            "ledger shared by several receivers".into(),
            ledger.is_shared().to_string(),
        ),
        (
            "signature.tolerance".into(),
            as_written(config.signature.tolerance),
        ),
        ("signing secrets".into(), "(never shown)".into()),
    ];
    match &config.handler {
        Some(handler) => {
            let kind = match (&handler.kind, role) {
                (HandlerKind::Command(argv), Role::Reader) if argv.len() > 1 => format!(
                    "command {} ({} arguments, shown to operators only)",
                    argv[0],
                    argv.len() - 1
                ),
                (kind, _) => kind.describe(),
            };
            rows.push(("handler".into(), kind));
            rows.push((
                "handler.max_attempts".into(),
                handler.max_attempts.to_string(),
            ));
            rows.push(("handler.timeout".into(), as_written(handler.timeout)));
            rows.push((
                "handler.backoff".into(),
                format!(
                    "{}, doubling up to {}",
                    as_written(handler.backoff),
                    as_written(handler.max_backoff)
                ),
            ));
            rows.push((
                "handler.concurrency".into(),
                handler.concurrency.to_string(),
            ));
            let hold = &handler.hold;
            rows.push((
                "handler.hold_after".into(),
                match hold.hold_after {
                    0 => "0: never hold".into(),
                    n => format!("{n} different jobs failing in a row"),
                },
            ));
            for (key, value) in [
                ("handler.probe_interval", hold.probe_interval),
                ("handler.max_probe_interval", hold.max_probe_interval),
                ("handler.ramp", hold.ramp),
            ] {
                rows.push((key.into(), as_written(value)));
            }
            rows.push((
                "handler.max_per_second".into(),
                hold.max_per_second
                    .map_or("no limit".into(), |rate| rate.to_string()),
            ));
            if matches!(handler.kind, HandlerKind::Command(_)) {
                rows.push((
                    "handler.content_exit_statuses".into(),
                    format!("{:?}", hold.content_exit_statuses),
                ));
            }
        }
        None => rows.push(("handler".into(), "none: jobs stay claimed".into())),
    }
    let retention = &config.retention;
    for (key, value) in [
        ("retention.ttl", retention.ttl),
        ("retention.dedupe_ttl", retention.dedupe_ttl),
        ("retention.interval", retention.interval),
    ] {
        rows.push((key.into(), as_written(value)));
    }
    rows.push((
        "sume_api".into(),
        config
            .sume_api
            .as_ref()
            .map_or("off".into(), |api| redact_url(&api.base_url)),
    ));
    if let Some(admin) = &config.admin {
        rows.push(("admin.listen".into(), admin.listen.to_string()));
        rows.push((
            "admin.console_actions".into(),
            admin.console_actions.to_string(),
        ));
        rows.push((
            "admin.due_job_limit".into(),
            as_written(admin.due_job_limit),
        ));
    }
    rows
}

/// A row per HTTPS listener: the certificate it serves now (read at each view: a reload or a
/// renewal changes it), and how it was obtained.
pub(super) fn certificate_rows(listeners: &[Arc<Tls>]) -> Vec<(String, String)> {
    listeners
        .iter()
        .map(|tls| {
            let (about, obtained) = tls.about();
            let obtained = match obtained {
                Obtained::Files => "from certificate files".to_owned(),
                Obtained::Acme(directory) => format!("from ACME, {}", redact_url(&directory)),
            };
            let value = match about {
                Some(about) => format!(
                    "{}; issued by {}; valid until {}; {obtained}",
                    about.names.join(", "),
                    about.issuer,
                    humantime::format_rfc3339_seconds(about.not_after)
                ),
                None => format!("none yet ({obtained}: ordering)"),
            };
            (format!("tls certificate ({})", tls.listener()), value)
        })
        .collect()
}

/// A duration as the config file would say it, in the largest unit that holds it whole
/// ("365d", "90m", "1500ms"): humantime's own form, "11months 30days 3h 50m 24s" for 365d,
/// counts months of 30.44 days the file never used.
fn as_written(duration: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let (unit, size) = UNITS
        .into_iter()
        .find(|(_, size)| nanos.is_multiple_of(*size))
        .unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_the_config_file_writes_them() {
        for (written, shown) in [
            ("365d", "365d"),
            ("30d", "30d"),
            ("24h", "1d"),
            ("90m", "90m"),
            ("1h 30m", "90m"),
            ("5m", "5m"),
            ("300s", "5m"),
            ("2s", "2s"),
            ("1500ms", "1500ms"),
            ("0s", "0s"),
        ] {
            let duration = humantime::parse_duration(written).unwrap();
            assert_eq!(as_written(duration), shown, "{written}");
            // And the file would read it back as the same duration.
            assert_eq!(humantime::parse_duration(shown).unwrap(), duration);
        }
    }
}

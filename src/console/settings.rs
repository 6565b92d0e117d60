//! The Config page's rows: the settings in effect, without any credential.

use std::sync::Arc;

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
            humantime::format_duration(config.signature.tolerance).to_string(),
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
            rows.push((
                "handler.timeout".into(),
                humantime::format_duration(handler.timeout).to_string(),
            ));
            rows.push((
                "handler.backoff".into(),
                format!(
                    "{}, doubling up to {}",
                    humantime::format_duration(handler.backoff),
                    humantime::format_duration(handler.max_backoff)
                ),
            ));
            rows.push((
                "handler.concurrency".into(),
                handler.concurrency.to_string(),
            ));
        }
        None => rows.push(("handler".into(), "none: jobs stay claimed".into())),
    }
    let retention = &config.retention;
    for (key, value) in [
        ("retention.ttl", retention.ttl),
        ("retention.dedupe_ttl", retention.dedupe_ttl),
        ("retention.interval", retention.interval),
    ] {
        rows.push((key.into(), humantime::format_duration(value).to_string()));
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
            humantime::format_duration(admin.due_job_limit).to_string(),
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

//! `[tracing]` and the standard `OTEL_*` variables: where spans go (OTLP over HTTP), how many.
//!
//! Which wins: a key written in `[tracing]` wins over its variable (the file is the explicit
//! choice for this service); a key not written there falls back to the variable, then to the
//! default. `OTEL_SDK_DISABLED=true` turns tracing off whatever else is set (the standard off
//! switch). Tracing is on when an endpoint is known.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;
use super::secret::Secret;

/// The exporter's only protocol: OTLP's protobuf over HTTP (port 4318).
pub const HTTP_PROTOBUF: &str = "http/protobuf";
const TRACES_PATH: &str = "/v1/traces";

/// `[tracing]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingToml {
    /// The collector's OTLP/HTTP address, as `OTEL_EXPORTER_OTLP_ENDPOINT`: `/v1/traces` is
    /// appended.
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    /// `Name: value` lines sent with each export (a token): read at start, never logged.
    pub headers_file: Option<PathBuf>,
    pub service_name: Option<String>,
    /// The share of new traces recorded, 0 to 1; an inbound `traceparent`'s decision stands.
    pub sample_ratio: Option<f64>,
    /// The deadline of one export.
    #[serde(default, deserialize_with = "optional_duration")]
    pub timeout: Option<Duration>,
    /// The console's link to a job's trace: `{trace_id}` is replaced by it.
    pub trace_url: Option<String>,
}

fn optional_duration<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

/// Tracing as it runs: `[tracing]` and the variables merged.
#[derive(Debug, Clone)]
pub struct TracingConfig {
    /// Where the spans are POSTed: `.../v1/traces`.
    pub endpoint: hyper::Uri,
    pub headers_file: Option<PathBuf>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`' (when no `headers_file` is given).
    pub env_headers: Vec<(String, Secret)>,
    pub service_name: String,
    pub sample_ratio: f64,
    /// Whether a parent's sampling decision stands (the `parentbased_*` samplers).
    pub parent_based: bool,
    pub timeout: Duration,
    pub trace_url: Option<String>,
}

impl TracingConfig {
    /// Merges `[tracing]` (`None` when absent) with the variables `env` reads; `None` when
    /// tracing is off. Each problem names the key or the variable.
    pub fn resolve(
        toml: Option<&TracingToml>,
        env: impl Fn(&str) -> Option<String>,
        problems: &mut Vec<String>,
    ) -> Option<TracingConfig> {
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let written = toml.cloned().unwrap_or_default();
        let endpoint = match (&written.endpoint, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(base), _) => Some(("tracing.endpoint", with_traces_path(base))),
            (None, Some(full)) => Some(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", full)),
            (None, None) => env("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|base| ("OTEL_EXPORTER_OTLP_ENDPOINT", with_traces_path(&base))),
        };
        let Some((endpoint_key, endpoint)) = endpoint else {
            if toml.is_some() {
                problems.push(
                    "tracing.endpoint: not set, nor OTEL_EXPORTER_OTLP_ENDPOINT: where should \
                     spans go? (e.g. \"http://127.0.0.1:4318\")"
                        .to_owned(),
                );
            }
            return None;
        };
        let before = problems.len();
        let endpoint = match parse_endpoint(&endpoint) {
            Ok(uri) => Some(uri),
            Err(why) => {
                problems.push(format!("{endpoint_key}: {why}"));
                None
            }
        };
        let protocol = match written.protocol {
            Some(protocol) => Some(("tracing.protocol", protocol)),
            None => [
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ]
            .into_iter()
            .find_map(|name| env(name).map(|value| (name, value))),
        };
        if let Some((key, protocol)) = protocol.filter(|(_, p)| p.trim() != HTTP_PROTOBUF) {
            problems.push(format!(
                "{key}: {protocol:?} is not supported: the exporter speaks {HTTP_PROTOBUF:?} \
                 only (OTLP over HTTP, a collector's port 4318)"
            ));
        }
        let (sample_ratio, parent_based) = match written.sample_ratio {
            Some(ratio) if (0.0..=1.0).contains(&ratio) => (ratio, true),
            Some(ratio) => {
                problems.push(format!(
                    "tracing.sample_ratio must be between 0 and 1, got {ratio}"
                ));
                (1.0, true)
            }
            None => sampler_from_env(&env, problems),
        };
        let env_headers = match (
            &written.headers_file,
            env("OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
        ) {
            (Some(_), _) => Vec::new(),
            (None, Some(headers)) => {
                env_headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", &headers, problems)
            }
            (None, None) => env("OTEL_EXPORTER_OTLP_HEADERS")
                .map(|headers| env_headers("OTEL_EXPORTER_OTLP_HEADERS", &headers, problems))
                .unwrap_or_default(),
        };
        let service_name = written
            .service_name
            .or_else(|| env("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "sume-receiver".to_owned());
        if let Some(template) = &written.trace_url {
            if let Err(why) = check_trace_url(template) {
                problems.push(format!("tracing.trace_url: {why}"));
            }
        }
        if written.timeout.is_some_and(|timeout| timeout.is_zero()) {
            problems.push("tracing.timeout must be greater than zero".to_owned());
        }
        (problems.len() == before).then(|| TracingConfig {
            endpoint: endpoint.expect("no problem"),
            headers_file: written.headers_file,
            env_headers,
            service_name,
            sample_ratio,
            parent_based,
            timeout: written.timeout.unwrap_or(Duration::from_secs(10)),
            trace_url: written.trace_url,
        })
    }

    /// The headers sent with each export: `headers_file`'s `Name: value` lines (read now), or
    /// `OTEL_EXPORTER_OTLP_HEADERS`'.
    pub fn headers(&self) -> anyhow::Result<Vec<(String, Secret)>> {
        let Some(file) = &self.headers_file else {
            return Ok(self.env_headers.clone());
        };
        let text = std::fs::read_to_string(file)
            .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", file.display()))?;
        let mut headers = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, value)) = line.split_once(':') else {
                // The line is not shown: it may be a token without its name.
                anyhow::bail!(
                    "{} line {}: not a `Name: value` line",
                    file.display(),
                    number + 1
                );
            };
            headers.push(
                header(name, value).map_err(|why| {
                    anyhow::anyhow!("{} line {}: {why}", file.display(), number + 1)
                })?,
            );
        }
        Ok(headers)
    }

    /// The console's link to the trace `trace_id` (hex), when a template is given.
    pub fn trace_link(&self, trace_id: &str) -> Option<String> {
        let template = self.trace_url.as_ref()?;
        Some(template.replace("{trace_id}", trace_id))
    }

    pub(super) fn resolve_paths(toml: &mut TracingToml, base_dir: &Path) {
        if let Some(file) = toml.headers_file.as_mut() {
            *file = base_dir.join(&*file);
        }
    }
}

/// A base URL with `/v1/traces` after its path.
fn with_traces_path(base: &str) -> String {
    format!("{}{TRACES_PATH}", base.trim_end_matches('/'))
}

/// An http(s) URL with a host, no credentials (they would be logged with the URL: a token
/// goes in `headers_file`), no query or fragment.
fn parse_endpoint(url: &str) -> Result<hyper::Uri, String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|error| format!("invalid URL {:?}: {error}", super::redact_url(url)))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "{:?} must start with http:// or https://",
            super::redact_url(url)
        ));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if authority.contains('@') {
        return Err(
            "a user or password in the URL would be logged with it: put a token in \
             tracing.headers_file"
                .to_owned(),
        );
    }
    if uri.host().is_none_or(str::is_empty) || uri.query().is_some() || url.contains('#') {
        return Err(format!(
            "{:?} must be an address like \"http://collector:4318\", without a query",
            super::redact_url(url)
        ));
    }
    Ok(uri)
}

/// `OTEL_TRACES_SAMPLER` (and `_ARG`): the ratio and whether a parent's decision stands.
fn sampler_from_env(
    env: &impl Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> (f64, bool) {
    let sampler = env("OTEL_TRACES_SAMPLER").unwrap_or_else(|| "parentbased_always_on".into());
    let mut ratio = || match env("OTEL_TRACES_SAMPLER_ARG") {
        None => 1.0,
        Some(arg) => match arg.trim().parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
            _ => {
                problems.push(format!(
                    "OTEL_TRACES_SAMPLER_ARG must be a ratio between 0 and 1, got {arg:?}"
                ));
                1.0
            }
        },
    };
    match sampler.trim() {
        "always_on" => (1.0, false),
        "always_off" => (0.0, false),
        "traceidratio" => (ratio(), false),
        "parentbased_always_on" => (1.0, true),
        "parentbased_always_off" => (0.0, true),
        "parentbased_traceidratio" => (ratio(), true),
        other => {
            problems.push(format!(
                "OTEL_TRACES_SAMPLER: {other:?} is not one of always_on, always_off, \
                 traceidratio, parentbased_always_on, parentbased_always_off, \
                 parentbased_traceidratio"
            ));
            (1.0, true)
        }
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs, comma-separated, values percent-encoded.
fn env_headers(variable: &str, text: &str, problems: &mut Vec<String>) -> Vec<(String, Secret)> {
    let mut headers = Vec::new();
    for (index, pair) in text.split(',').enumerate() {
        let decoded = pair
            .split_once('=')
            .map(|(name, value)| (name, percent_encoding::percent_decode_str(value.trim())));
        let parsed = decoded
            .ok_or_else(|| "not a name=value pair".to_owned())
            .and_then(|(name, value)| {
                let value = value.decode_utf8().map_err(|_| "not UTF-8".to_owned())?;
                header(name, &value)
            });
        match parsed {
            Ok(header) => headers.push(header),
            // The pair is not shown: its value is likely a token.
            Err(why) => problems.push(format!("{variable}: pair {}: {why}", index + 1)),
        }
    }
    headers
}

/// A header name and value that HTTP takes.
fn header(name: &str, value: &str) -> Result<(String, Secret), String> {
    let name = name.trim();
    hyper::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let value = value.trim();
    hyper::header::HeaderValue::from_str(value)
        .map_err(|_| format!("the value of {name:?} is not a header value"))?;
    Ok((name.to_owned(), Secret::new(value)))
}

/// A link template: an https or http URL holding `{trace_id}` once.
fn check_trace_url(template: &str) -> Result<(), String> {
    if template.matches("{trace_id}").count() != 1 {
        return Err(format!("{template:?} must hold {{trace_id}} once"));
    }
    let example = template.replace("{trace_id}", "4bf92f3577b34da6a3ce929d0e0e4736");
    let uri: hyper::Uri = example
        .parse()
        .map_err(|error| format!("{template:?} is not a URL: {error}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!(
            "{template:?} must be an http:// or https:// URL with a host"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(
        toml: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<Option<TracingConfig>, Vec<String>> {
        let toml: Option<TracingToml> = toml.map(|text| toml::from_str(text).unwrap());
        let env = |name: &str| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        let mut problems = Vec::new();
        let config = TracingConfig::resolve(toml.as_ref(), env, &mut problems);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems)
        }
    }

    #[test]
    fn off_without_an_endpoint_and_by_default() {
        assert!(resolve(None, &[]).unwrap().is_none());
        let problems = resolve(Some(""), &[]).unwrap_err();
        assert!(
            problems[0].contains("tracing.endpoint: not set"),
            "{problems:?}"
        );
    }

    #[test]
    fn the_variables_alone_turn_it_on() {
        let config = resolve(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "hooks"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20abc,x-team=a",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            config.endpoint.to_string(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(config.service_name, "hooks");
        assert_eq!((config.sample_ratio, config.parent_based), (0.25, false));
        let headers: Vec<_> = config
            .env_headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.expose()))
            .collect();
        assert_eq!(headers, [("authorization", "Bearer abc"), ("x-team", "a")]);
        let signal = resolve(
            None,
            &[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://c.example/otlp/traces",
            )],
        );
        assert_eq!(
            signal.unwrap().unwrap().endpoint.to_string(),
            "https://c.example/otlp/traces"
        );
    }

    #[test]
    fn the_file_wins_over_the_variables_and_the_off_switch_over_both() {
        let toml = r#"
            endpoint = "http://127.0.0.1:4318"
            service_name = "from-file"
            sample_ratio = 0.5
        "#;
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://elsewhere:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ];
        let config = resolve(Some(toml), &vars).unwrap().unwrap();
        assert_eq!(
            config.endpoint.to_string(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(config.service_name, "from-file");
        assert_eq!((config.sample_ratio, config.parent_based), (0.5, true));
        let off = [("OTEL_SDK_DISABLED", "true")];
        assert!(resolve(Some(toml), &off).unwrap().is_none());
    }

    #[test]
    fn bad_input_names_its_key() {
        let problems =
            |toml: &str, vars: &[(&str, &str)]| resolve(Some(toml), vars).unwrap_err().join("; ");
        let at = "endpoint = \"http://127.0.0.1:4318\"\n";
        assert!(problems(&format!("{at}protocol = \"grpc\""), &[])
            .contains("tracing.protocol: \"grpc\" is not supported"));
        assert!(
            problems(at, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL")
        );
        assert!(problems(&format!("{at}sample_ratio = 1.5"), &[]).contains("tracing.sample_ratio"));
        let scheme = problems("endpoint = \"ftp://x\"", &[]);
        assert!(
            scheme.starts_with("tracing.endpoint: \"ftp://x")
                && scheme.contains("must start with http"),
            "{scheme}"
        );
        let credentials = problems("endpoint = \"http://u:hunter2@x:4318\"", &[]);
        assert!(
            credentials.contains("headers_file") && !credentials.contains("hunter2"),
            "{credentials}"
        );
        assert!(problems("endpoint = \"http://x:4318?k=v\"", &[]).contains("without a query"));
        assert!(
            problems(at, &[("OTEL_TRACES_SAMPLER", "sometimes")]).contains("OTEL_TRACES_SAMPLER")
        );
        let header = problems(at, &[("OTEL_EXPORTER_OTLP_HEADERS", "a=1,secret-token")]);
        assert!(
            header.contains("pair 2") && !header.contains("secret-token"),
            "{header}"
        );
        assert!(problems(
            &format!("{at}trace_url = \"https://t.example/trace/\""),
            &[]
        )
        .contains("tracing.trace_url"));
        assert!(
            problems(&format!("{at}trace_url = \"javascript:{{trace_id}}\""), &[])
                .contains("tracing.trace_url")
        );
    }

    #[test]
    fn headers_file_lines_are_read_and_never_shown_when_bad() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("headers");
        std::fs::write(
            &file,
            "# the collector's token\nAuthorization: Bearer s3cret\n\nx-scope: a\n",
        )
        .unwrap();
        let toml = format!(
            "endpoint = \"http://x:4318\"\nheaders_file = {:?}",
            file.display().to_string()
        );
        let config = resolve(Some(&toml), &[]).unwrap().unwrap();
        let headers = config.headers().unwrap();
        assert_eq!(headers.len(), 2);
        assert_eq!(
            (headers[0].0.as_str(), headers[0].1.expose()),
            ("Authorization", "Bearer s3cret")
        );
        std::fs::write(&file, "Bearer s3cret\n").unwrap();
        let error = config.headers().unwrap_err().to_string();
        assert!(
            error.contains("line 1") && !error.contains("s3cret"),
            "{error}"
        );
    }

    #[test]
    fn the_trace_link_fills_the_template() {
        let toml =
            "endpoint = \"http://x:4318\"\ntrace_url = \"https://tempo.example/trace/{trace_id}\"";
        let config = resolve(Some(toml), &[]).unwrap().unwrap();
        assert_eq!(
            config.trace_link("ab").as_deref(),
            Some("https://tempo.example/trace/ab")
        );
    }
}
